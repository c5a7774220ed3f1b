"""``django_distlock.contrib.otel``: spans read back from the SDK's memory exporter."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest
from django.test import override_settings
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
    InMemorySpanExporter,
)
from opentelemetry.trace import StatusCode

from django_distlock import LockBackendError, LockLost, lock
from django_distlock.contrib.otel import LockTracing

from .conftest import redis_locks
from .manage_py import ROOT, ManagePy
from .surface import down_locks

pytestmark = pytest.mark.redis


@pytest.fixture
def exporter():
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    exporter.provider = provider
    return exporter


@pytest.fixture
def tracing(exporter):
    tracing = LockTracing(exporter.provider)
    tracing.connect()
    yield tracing
    tracing.disconnect()


def test_spans_of_acquire_and_hold(tracing, exporter, redis_url):
    setting = {**redis_locks(redis_url), "down": down_locks()["default"]}
    request_tracer = exporter.provider.get_tracer("test")
    with override_settings(LOCKS=setting):
        with request_tracer.start_as_current_span("request") as request:
            with lock("report:1", timeout=0, ttl=5) as held:
                token = held.fencing_token
                time.sleep(0.05)
        taken, release = threading.Event(), threading.Event()

        def hold():
            with lock("report:1", timeout=0):
                taken.set()
                release.wait(30)

        other = threading.Thread(target=hold)
        other.start()
        assert taken.wait(10)
        assert not lock("report:1", timeout=0.1).acquire()
        release.set()
        other.join()
        with pytest.raises(LockBackendError):
            lock("x", using="down", timeout=0).acquire()

    spans = exporter.get_finished_spans()
    acquire, hold_span = spans[0], spans[1]
    assert acquire.name == "distlock.acquire"
    assert dict(acquire.attributes) == {
        "distlock.backend": "default",
        "distlock.kind": "exclusive",
        "distlock.name": "report:1",
        "distlock.outcome": "acquired",
        "distlock.fencing_token": token,
        "distlock.ttl": 5.0,
    }
    assert hold_span.name == "distlock.hold"
    assert hold_span.attributes["distlock.fencing_token"] == token
    # Children of the span current when the lock was taken and released.
    for span in (acquire, hold_span):
        assert span.parent.span_id == request.get_span_context().span_id
    assert 0.05 <= (hold_span.end_time - hold_span.start_time) / 1e9 < 2
    assert acquire.end_time <= hold_span.start_time + 5_000_000

    busy = [s for s in spans if s.attributes.get("distlock.outcome") == "busy"]
    (busy,) = busy
    assert 0.1 <= (busy.end_time - busy.start_time) / 1e9 < 2
    assert busy.status.status_code == StatusCode.UNSET
    (error,) = [s for s in spans if s.attributes.get("distlock.outcome") == "error"]
    assert error.attributes["distlock.backend"] == "down"
    assert error.status.status_code == StatusCode.ERROR
    assert error.events[0].name == "exception"
    assert {s.name for s in spans} == {"request", "distlock.acquire", "distlock.hold"}


def test_a_lost_lease_ends_its_hold_span_in_error(tracing, exporter):
    held = lock("short", ttl=0.2, auto_renew=False, timeout=0)
    assert held.acquire()
    time.sleep(0.3)
    with pytest.raises(LockLost):
        held.release()
    acquire, hold = exporter.get_finished_spans()
    assert hold.name == "distlock.hold"
    assert hold.status.status_code == StatusCode.ERROR
    assert "lease lost" in hold.status.description


def test_the_lock_name_can_be_left_out(exporter):
    tracing = LockTracing(exporter.provider, record_name=False)
    tracing.connect()
    try:
        with lock("customer:alice@example.com", timeout=0):
            pass
    finally:
        tracing.disconnect()
    spans = exporter.get_finished_spans()
    assert len(spans) == 2
    for span in spans:
        assert "distlock.name" not in span.attributes
        assert "alice" not in str(dict(span.attributes))


SCRIPT = """
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
    InMemorySpanExporter,
)
import django

django.setup()
# Set after the app is ready: the spans still go to this provider.
exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)
from django_distlock import lock

with lock("job", timeout=0):
    pass
for span in exporter.get_finished_spans():
    print(span.name, dict(span.attributes).get("distlock.name"))
"""


def run_script(manage) -> str:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        env=manage.env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_app_traces_on_the_global_provider(tmp_path, redis_url):
    apps = "INSTALLED_APPS = INSTALLED_APPS + ['django_distlock.contrib.otel']\n"
    out = run_script(ManagePy(tmp_path, redis_locks(redis_url), extra=apps))
    assert out.split("\n") == ["distlock.acquire job", "distlock.hold job", ""]
    extra = apps + "DISTLOCK_OTEL_LOCK_NAME = False\n"
    out = run_script(ManagePy(tmp_path, redis_locks(redis_url), extra=extra))
    assert out.split("\n") == ["distlock.acquire None", "distlock.hold None", ""]
    assert run_script(ManagePy(tmp_path, redis_locks(redis_url))) == ""
