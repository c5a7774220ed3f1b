"""``django_distlock.contrib.prometheus``: a real registry, scraped over HTTP."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
import urllib.request

import pytest
from django.test import override_settings
from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.parser import text_string_to_metric_families

from django_distlock import LockBackendError, LockLost, lock
from django_distlock.contrib.prometheus import LockMetrics

from .conftest import redis_locks
from .manage_py import ROOT, ManagePy
from .servers import free_port
from .surface import down_locks

pytestmark = pytest.mark.redis


def scrape(registry) -> dict:
    """Serve ``registry`` over HTTP as Prometheus would scrape it; parse it."""
    port = free_port()
    server, thread = start_http_server(port, addr="127.0.0.1", registry=registry)
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics") as answer:
            text = answer.read().decode()
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = (sample.name, tuple(sorted(sample.labels.items())))
            samples[key] = sample.value
    return samples


def value(samples, name, **labels):
    return samples.get((name, tuple(sorted(labels.items()))))


@pytest.fixture
def metrics():
    registry = CollectorRegistry()
    metrics = LockMetrics(registry)
    metrics.connect()
    yield metrics
    metrics.disconnect()


def hold_in_thread(name, using, release: threading.Event, taken: threading.Event):
    with lock(name, using=using, timeout=0):
        taken.set()
        release.wait(30)


def test_metrics_follow_the_locks(metrics, redis_url):
    setting = {
        **redis_locks(redis_url),
        "mem": {
            "BACKEND": "django_distlock.backends.locmem.LocMemLockBackend",
            "LOCATION": f"prometheus-{time.monotonic_ns()}",
        },
        "down": down_locks()["default"],
    }
    with override_settings(LOCKS=setting):
        for _ in range(3):
            with lock("a", timeout=0):
                time.sleep(0.01)
        taken, release = threading.Event(), threading.Event()
        holder = threading.Thread(
            target=hold_in_thread, args=("b", "default", release, taken)
        )
        holder.start()
        assert taken.wait(10)
        assert not lock("b", timeout=0).acquire()  # busy
        assert not lock("b", timeout=0.1).acquire()  # busy after a wait
        during = scrape(metrics.registry)
        release.set()
        holder.join()

        with pytest.raises(LockBackendError):
            lock("c", using="down", timeout=0).acquire()

        lost = lock("d", using="mem", ttl=0.2, auto_renew=False, timeout=0)
        assert lost.acquire()
        time.sleep(0.3)
        with pytest.raises(LockLost):
            lost.release()
    after = scrape(metrics.registry)

    total = "distlock_acquisitions_total"
    assert value(during, "distlock_held", backend="default", kind="exclusive") == 1
    assert (
        value(during, total, backend="default", kind="exclusive", outcome="busy") == 2
    )
    assert (
        value(after, total, backend="default", kind="exclusive", outcome="acquired")
        == 4
    )
    assert value(after, total, backend="default", kind="exclusive", outcome="busy") == 2
    assert value(after, total, backend="down", kind="exclusive", outcome="error") == 1
    assert value(after, total, backend="mem", kind="exclusive", outcome="acquired") == 1
    assert value(after, "distlock_held", backend="default", kind="exclusive") == 0
    assert value(after, "distlock_held", backend="mem", kind="exclusive") == 0
    assert value(after, "distlock_lost_total", backend="mem", kind="exclusive") == 1
    assert (
        value(after, "distlock_lost_total", backend="default", kind="exclusive") is None
    )
    assert (
        value(after, "distlock_wait_seconds_count", backend="default", kind="exclusive")
        == 4
    )
    assert (
        value(after, "distlock_hold_seconds_count", backend="default", kind="exclusive")
        == 4
    )
    assert (
        value(after, "distlock_hold_seconds_sum", backend="default", kind="exclusive")
        >= 0.03
    )
    assert value(
        after,
        "distlock_hold_seconds_bucket",
        backend="default",
        kind="exclusive",
        le="+Inf",
    )


def test_disconnected_metrics_stay_still(metrics):
    metrics.disconnect()
    with lock("quiet", timeout=0):
        pass
    samples = scrape(metrics.registry)
    counted = [v for (name, _), v in samples.items() if name.endswith("_total")]
    assert counted == []


SCRIPT = """
import django
django.setup()
from prometheus_client import REGISTRY, generate_latest
from django_distlock import lock
with lock("job", timeout=0):
    pass
print(generate_latest(REGISTRY).decode())
"""


def test_the_app_exports_on_the_default_registry(tmp_path, redis_url):
    extra = "INSTALLED_APPS = INSTALLED_APPS + ['django_distlock.contrib.prometheus']\n"
    manage = ManagePy(tmp_path, redis_locks(redis_url), extra=extra)
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        env=manage.env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert (
        'distlock_acquisitions_total{backend="default",kind="exclusive",'
        'outcome="acquired"} 1.0' in done.stdout
    )
    assert 'distlock_held{backend="default",kind="exclusive"} 0.0' in done.stdout

    plain = ManagePy(tmp_path, redis_locks(redis_url))
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        env=plain.env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "distlock_" not in done.stdout  # without the app: no metrics
