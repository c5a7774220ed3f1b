"""``django_distlock.contrib.celery.locked_task``, in-process and on real workers.

The worker tests start two Celery workers (prefork pool, one process each,
late acks: a busy worker fetches nothing more) on the machine's RabbitMQ,
with the locks on a redis-server of their own, then send duplicates of a task
and read what each run did from a log file the tasks write.
"""

from __future__ import annotations

import inspect
import json
import os
import signal
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path

import pytest
from celery import Celery
from django.test import override_settings
from kombu import Queue

from django_distlock import LockNotAcquired, lock, locks
from django_distlock.contrib.celery import is_skipped, locked_task, task_skipped
from django_distlock.signals import lock_contended

from .conftest import redis_locks, require_tcp
from .manage_py import ROOT, ManagePy
from .servers import RedisServer
from .surface import try_lock, wait_until

# -- in-process -----------------------------------------------------------------


def test_placeholders_come_from_the_arguments(distlock_locmem):
    seen = []

    @locked_task("report:<tenant>:<kind>")
    def report(tenant, kind="daily"):
        seen.append([h.name for h in locks["default"].holders("report:")])
        return tenant

    assert report("acme") == "acme"
    assert report(kind="weekly", tenant="globex") == "globex"
    assert seen == [["report:acme:daily"], ["report:globex:weekly"]]
    # Celery checks calls against the function's own signature.
    assert inspect.getfullargspec(report).args == ["tenant", "kind"]


def test_bad_declarations_fail_at_import():
    with pytest.raises(ValueError, match="<tenant> names no argument"):

        @locked_task("report:<tenant>")
        def report(tenant_id): ...

    with pytest.raises(ValueError, match="on_busy must be one of"):
        locked_task("x", on_busy="wait")
    with pytest.raises(ValueError, match="ttl"):
        locked_task("x", ttl=0)


def test_busy_outside_a_worker(distlock_locmem, caplog):
    calls = []

    def body(key):
        calls.append(key)
        return "done"

    skip = locked_task("k:<key>")(body)
    retry = locked_task("k:<key>", on_busy="retry")(body)
    fail = locked_task("k:<key>", on_busy="raise")(body)
    signalled = []

    def receiver(sender, **kwargs):
        signalled.append((sender, kwargs))

    task_skipped.connect(receiver)
    caplog.set_level("INFO", logger="django_distlock.celery")
    try:
        with lock("k:1", timeout=0):
            result = skip("1")
            assert is_skipped(result)
            assert result["lock"] == "k:1"
            assert result["holder"].endswith("/MainThread")
            with pytest.raises(LockNotAcquired, match="'k:1' is busy: held by"):
                fail("1")
            # Called directly, there is no task to retry: it raises.
            with pytest.raises(LockNotAcquired):
                retry("1")
        assert calls == []
        assert skip("1") == "done"
    finally:
        task_skipped.disconnect(receiver)
    (logged,) = [r for r in caplog.records if r.name == "django_distlock.celery"]
    assert logged.levelname == "INFO"
    assert "skipped: Lock 'k:1' is busy" in logged.getMessage()
    ((sender, kwargs),) = signalled
    assert sender is skip
    assert kwargs["name"] == "k:1"
    assert kwargs["task"] is None
    assert kwargs["task_args"] == ("1",)
    assert not is_skipped("done")


app = Celery("distlock_unit", set_as_current=False)
app.conf.task_always_eager = False


@app.task(bind=True, max_retries=1)
@locked_task("bound:<item>", on_busy="retry", ttl=5)
def bound_task(self, item):
    return f"{self.name} {item}"


def test_bound_task_retries_when_busy_in_apply(distlock_locmem):
    assert bound_task.apply(("x",)).get() == "tests.test_celery.bound_task x"
    attempts = []

    def contended(sender, name, **kwargs):
        attempts.append(name)

    lock_contended.connect(contended)
    try:
        with lock("bound:x", timeout=0, ttl=5):
            # apply() runs a retry at once, eagerly; max_retries=1.
            result = bound_task.apply(("x",))
    finally:
        lock_contended.disconnect(contended)
    assert attempts == ["bound:x", "bound:x"]
    assert result.state == "FAILURE"
    assert isinstance(result.result, LockNotAcquired)


# -- real workers -------------------------------------------------------------


#: The broker: the RabbitMQ of the machine. (kombu's Redis transport needs a
#: newer redis-py than the oldest this package supports, so Redis is only the
#: lock backend here.)
AMQP_URL = os.environ.get("DISTLOCK_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//")


class Cluster:
    """Two Celery worker processes on RabbitMQ, locks on a redis-server.

    Tasks go through a queue of this test run's own, deleted when its last
    consumer goes; results come back over RabbitMQ too (``rpc://``).
    """

    def __init__(self, base: Path):
        parsed = urllib.parse.urlsplit(AMQP_URL)
        require_tcp(parsed.hostname, parsed.port or 5672, "RabbitMQ")
        self.queue = f"distlock-tests-{os.getpid()}-{time.monotonic_ns()}"
        self.redis = RedisServer().start()
        self.locks = redis_locks(self.redis.url)
        extra = (
            "from kombu import Queue\n"
            f"CELERY_BROKER_URL = {AMQP_URL!r}\n"
            "CELERY_RESULT_BACKEND = 'rpc://'\n"
            f"CELERY_TASK_DEFAULT_QUEUE = {self.queue!r}\n"
            # Not durable, gone with its last consumer: nothing is left behind.
            f"CELERY_TASK_QUEUES = [Queue({self.queue!r}, durable=False, "
            "auto_delete=True)]\n"
            "CELERY_TASK_ACKS_LATE = True\n"
            "CELERY_WORKER_PREFETCH_MULTIPLIER = 1\n"
            "CELERY_WORKER_ENABLE_REMOTE_CONTROL = False\n"
            "CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True\n"
        )
        self.env = ManagePy(base, self.locks, extra=extra).env
        self.base = base
        self.procs: list[subprocess.Popen] = []
        self.logs: list[Path] = []
        self.client = Celery("client", broker=AMQP_URL, backend="rpc://")
        self.client.conf.task_default_queue = self.queue
        self.client.conf.task_queues = [
            Queue(self.queue, durable=False, auto_delete=True)
        ]

    def start_worker(self, name: str) -> None:
        log = self.base / f"{name}.log"
        with open(log, "w") as out:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "celery",
                    "-A",
                    "tests.celery_app",
                    "worker",
                    "--pool=prefork",
                    "--concurrency=1",
                    f"--hostname={name}@%h",
                    "--loglevel=INFO",
                    "--without-gossip",
                    "--without-mingle",
                    "--without-heartbeat",
                ],
                env=self.env,
                cwd=ROOT,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.procs.append(proc)
        self.logs.append(log)

    def wait_ready(self) -> None:
        for proc, log in zip(self.procs, self.logs):
            wait_until(
                lambda proc=proc, log=log: (
                    "ready." in log.read_text() or proc.poll() is not None
                ),
                timeout=90,
                what=f"the worker of {log.name}",
            )
            assert proc.poll() is None, log.read_text()

    def send(self, task: str, *args, **kwargs):
        return self.client.send_task(f"tests.celery_tasks.{task}", args, kwargs)

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)  # warm shutdown
        for proc in self.procs:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        self.client.close()
        self.redis.stop()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    cluster = Cluster(tmp_path_factory.mktemp("celery"))
    try:
        cluster.start_worker("w1")
        cluster.start_worker("w2")
        cluster.wait_ready()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def on_cluster(cluster):
    cluster.redis.client().flushdb()  # db 0: the locks
    with override_settings(LOCKS=cluster.locks):
        yield cluster


def read_log(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.redis
def test_two_workers_duplicates_skipped(on_cluster, tmp_path):
    log, go = tmp_path / "log", tmp_path / "go"
    results = [
        on_cluster.send("build_report", "acme", str(log), until=str(go))
        for _ in range(4)
    ]
    # The runner waits for `go`: every duplicate finds the lock busy, on the
    # other worker (the runner's fetches nothing while it runs).
    wait_until(lambda: sum(r.ready() for r in results) >= 3, timeout=60, what="3 skips")
    # Past the 1 s ttl, only renewal keeps the lease: a late one is skipped too.
    time.sleep(1.3)
    late = on_cluster.send("build_report", "acme", str(log), until=str(go))
    late.get(timeout=60)
    results.append(late)
    go.touch()
    values = [r.get(timeout=60) for r in results]
    events = read_log(log)
    (ran,) = [e for e in events if e["event"] == "ran"]
    skipped = [e for e in events if e["event"] == "skipped"]
    print(
        f"\ntwo workers, 5 x build_report('acme') [on_busy='skip']: ran on "
        f"{ran['worker']} (pid {ran['pid']}); skipped:"
    )
    for event in skipped:
        print(f"  {event['worker']}: {event['lock']} held by {event['holder']}")
    assert values.count("report for acme") == 1
    assert [is_skipped(v) for v in values].count(True) == 4
    assert len(skipped) == 4
    # Skipped on the other worker: the runner's fetched nothing while busy.
    assert all(e["worker"] != ran["worker"] for e in skipped)
    for value in values:
        if is_skipped(value):
            assert value["holder"].endswith(f":{ran['pid']}/MainThread")
            assert 0 <= value["expires_in"] <= 1
    # The lease (ttl 1 s) was renewed while the runner waited, then released.
    assert ran["end"] - ran["start"] > 1.3
    assert try_lock("report:acme")


@pytest.mark.redis
def test_two_workers_duplicates_retried(on_cluster, tmp_path):
    log = tmp_path / "log"
    results = [on_cluster.send("sync_account", "acct-1", str(log)) for _ in range(3)]
    retries = [r.get(timeout=120) for r in results]
    runs = sorted(read_log(log), key=lambda e: e["start"])
    print(
        f"\ntwo workers, 3 x sync_account('acct-1') [on_busy='retry']: retries "
        f"per task {retries}; runs one after another:"
    )
    for run in runs:
        print(
            f"  {run['worker']}: retries={run['retries']} "
            f"{run['start'] - runs[0]['start']:.2f}s .. "
            f"{run['end'] - runs[0]['start']:.2f}s"
        )
    assert len(runs) == 3
    assert sum(1 for n in retries if n > 0) >= 2  # the duplicates waited
    for earlier, later in zip(runs, runs[1:]):
        assert earlier["end"] <= later["start"]  # never two at once


@pytest.mark.redis
def test_two_workers_duplicate_raises(on_cluster, tmp_path):
    log, go = tmp_path / "log", tmp_path / "go"
    first = on_cluster.send("export", "orders", str(log), until=str(go))
    wait_until(lambda: read_log(log), timeout=60, what="the first export")
    second = on_cluster.send("export", "orders", str(log), until=str(go))
    second.get(timeout=60, propagate=False)
    go.touch()
    assert first.get(timeout=60) == "exported orders"
    print(
        f"\ntwo workers, 2 x export('orders') [on_busy='raise']: first "
        f"{first.state}, duplicate {second.state}: {second.result!r}"
    )
    assert second.state == "FAILURE"
    assert isinstance(second.result, LockNotAcquired)
    assert "'export:orders' is busy" in str(second.result)
    assert len(read_log(log)) == 1


def killed_child_frees_lock(cluster, tmp_path, task: str, name: str, kill: bool):
    log = tmp_path / "log"
    result = cluster.send(task, "k", str(log))
    wait_until(lambda: read_log(log), timeout=60, what="the task to start")
    (started,) = read_log(log)
    wait_until(
        lambda: any(locks["default"].holders(name)), timeout=10, what="the lease"
    )
    time.sleep(1.2)  # past the 1 s ttl: renewal keeps it
    assert not try_lock(name)
    if kill:
        os.kill(started["pid"], signal.SIGKILL)
        dead_at = time.time()
    else:
        dead_at = started["at"] + 2  # the task's hard time limit
    wait_until(lambda: try_lock(name), timeout=10, what="the lock to be free")
    freed_after = time.time() - dead_at
    result.get(timeout=60, propagate=False)
    return result, freed_after


@pytest.mark.redis
def test_worker_killed_mid_task_frees_the_lock_after_ttl(on_cluster, tmp_path):
    result, freed_after = killed_child_frees_lock(
        on_cluster, tmp_path, "crash", "crash:k", kill=True
    )
    print(
        f"\nworker process SIGKILLed mid-task: lock free {freed_after:.2f}s later "
        f"(ttl 1 s); task {result.state}: {result.result!r}"
    )
    assert freed_after < 2.0  # ttl 1 s, plus slack
    assert result.state == "FAILURE"  # WorkerLostError


@pytest.mark.redis
def test_hard_time_limit_frees_the_lock_after_ttl(on_cluster, tmp_path):
    result, freed_after = killed_child_frees_lock(
        on_cluster, tmp_path, "over_time_limit", "limited:k", kill=False
    )
    print(
        f"\nhard time limit (2 s) killed the task: lock free {freed_after:.2f}s "
        f"later (ttl 1 s); task {result.state}"
    )
    assert freed_after < 2.0  # ttl 1 s, plus slack
    assert result.state == "FAILURE"
    # The workers are still serving (the pool replaced the killed process).
    log = tmp_path / "after"
    assert on_cluster.send("build_report", "after", str(log)).get(timeout=60) == (
        "report for after"
    )
