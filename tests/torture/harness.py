"""Run one torture scenario: servers, proxies, worker processes, a fault, a verdict.

A scenario is written as::

    run = Run("redis node killed", env, tmp_path)
    run.start()
    run.load(1.0)              # let the workers warm up
    with run.fault():          # the fault window (times are recorded)
        env.servers[0].restart()
    run.finish()               # recovery phase, stop, check, report

``finish`` asserts zero violations, that no worker hung, and that every
worker acquired again after the fault ended (recovery without restarting
clients).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.conf import settings

from ..procs import context, dump_stacks, dump_stacks_on_signal, start_process
from ..servers import RedisServer
from .history import Verdict, check, read_events
from .proxy import FaultProxy
from .workers import record_key, servant

#: Long mode: ``DISTLOCK_TORTURE_MINUTES`` set (by ``scripts/torture --long``).
LONG_MINUTES = float(os.environ.get("DISTLOCK_TORTURE_MINUTES") or 0)
#: Release mode (``scripts/torture --release``): long mode, and every run keeps
#: its workers going until it checked ``RELEASE_SECTIONS`` critical sections
#: (half before the fault, half after it) or ran ``RELEASE_SECONDS`` longer.
RELEASE = bool(os.environ.get("DISTLOCK_TORTURE_RELEASE"))
RELEASE_SECTIONS = int(os.environ.get("DISTLOCK_TORTURE_RELEASE_SECTIONS") or 0)
RELEASE_SECONDS = float(os.environ.get("DISTLOCK_TORTURE_RELEASE_SECONDS") or 0)
#: Lock names of a release-mode run that names none (more names, less
#: waiting for each other: more sections per second on the same load).
RELEASE_NAMES = [f"torture:{c}" for c in "abcdefgh"]
#: Workers of a release-mode run that asks for the default three.
RELEASE_WORKERS = int(os.environ.get("DISTLOCK_TORTURE_RELEASE_WORKERS") or 3)
LONG = LONG_MINUTES > 0 or RELEASE
#: The availability target after a fault: the name is acquirable again within
#: this many seconds of the fault's end (or the lease's TTL, when longer).
AVAILABILITY_TARGET = 2.0
#: How long the prober keeps trying after a fault before it gives up.
PROBE_LIMIT = 30.0
#: Phase lengths are multiplied by this in long mode.
SCALE = 2.0 if LONG else 1.0
#: Where verdicts are appended as JSON lines (set by ``scripts/torture``).
REPORT = os.environ.get("DISTLOCK_TORTURE_REPORT")
#: Verdicts of this pytest session, for the terminal summary.
VERDICTS: list[Verdict] = []

REDIS_OPTIONS = {"SOCKET_TIMEOUT": 0.5, "SOCKET_CONNECT_TIMEOUT": 0.3}
#: What of each DATABASES entry a job brings its servant
#: (:func:`.workers.use_databases`).
DB_KEYS = ("NAME", "PORT")
REDLOCK_OPTIONS = {"NODE_TIMEOUT": 0.2}


def _serve(loop: Callable, jobs, done) -> None:
    # A servant that hangs at the end of a run has its stacks printed.
    dump_stacks_on_signal()
    loop(jobs, done)


class Servant:
    """A long-lived worker process that runs one load job at a time.

    ``loop`` is the module-level function the process runs: it takes jobs
    from ``jobs`` (None stops it) and puts their results on ``done``.
    """

    def __init__(self, loop: Callable = servant):
        ctx = context()
        self.jobs = ctx.Queue()
        self.done = ctx.Queue()
        self.proc = start_process(_serve, loop, self.jobs, self.done)

    def alive(self) -> bool:
        return self.proc.is_alive()

    def kill(self) -> None:
        self.proc.kill()
        self.proc.join(5)


_SERVANTS: list[Servant] = []
#: Runs started and not finished: stopped by :func:`abort_runs` after a failure.
_ACTIVE: list[Run] = []


def servants(count: int) -> list[Servant]:
    """Return ``count`` idle servants, starting new ones as needed."""
    _SERVANTS[:] = [s for s in _SERVANTS if s.alive()]
    while len(_SERVANTS) < count:
        _SERVANTS.append(Servant())
    return _SERVANTS[:count]


def stop_servants(pool: list[Servant] = _SERVANTS) -> None:
    """Stop every servant of ``pool`` (by default the harness's, at the end
    of the session)."""
    for s in pool:
        s.jobs.put(None)
    for s in pool:
        s.proc.join(10)
        if s.proc.is_alive():
            s.kill()
    pool.clear()


@dataclass
class Env:
    """A backend under test: its servers, the proxies in front of them, LOCKS."""

    kind: str
    locks: dict
    servers: list[RedisServer] = field(default_factory=list)
    proxies: list[FaultProxy] = field(default_factory=list)
    record_db: str = "default"
    reentrant: bool = False
    # tests.cluster_servers.RedisCluster / SentinelSetup for those kinds
    cluster: Any = None

    @property
    def backend(self):
        from django_distlock import locks

        return locks["default"]

    def stop(self) -> None:
        for proxy in self.proxies:
            proxy.stop()
        for server in self.servers:
            server.stop()
        if self.cluster is not None:
            self.cluster.stop()

    def lease_keys(self) -> int:
        """Return how many lock keys (not fencing counters) the nodes hold."""
        total = 0
        for server in self.servers:
            if server.proc is None or server.proc.poll() is not None:
                continue
            client = server.client()
            try:
                for key in client.scan_iter(match="distlock:*", count=1000):
                    if not key.endswith(b":c"):
                        total += 1
            finally:
                client.close()
        return total

    def assert_no_phantom_leases(self, ttl: float) -> None:
        """Fail if a lock key outlives its TTL: none without an expiry, none
        with more than ``ttl`` left, and none at all ``ttl`` + grace after
        every worker stopped."""
        for server in self.servers:
            client = server.client()
            try:
                for key in client.scan_iter(match="distlock:*", count=1000):
                    if key.endswith(b":c"):
                        continue  # fencing counters are kept on purpose
                    pttl = client.pttl(key)
                    assert pttl != -1, f"{key!r} has no expiry"
                    if b":" not in key.rsplit(b"}", 1)[-1]:
                        assert pttl <= ttl * 1000 + 50, f"{key!r}: {pttl} ms left"
            finally:
                client.close()
        wait_until(
            lambda: self.lease_keys() == 0,
            timeout=ttl + 8,
            what="every lock key to expire after the workers stopped",
        )

    def live_rows(self) -> int:
        """Return how many unexpired leases the lock table has."""
        from django.utils import timezone

        from django_distlock.models import LockRecord

        db = self.locks["default"].get("OPTIONS", {}).get("DATABASE", "default")
        return (
            LockRecord.objects.using(db)
            .filter(token__isnull=False, expires_at__gt=timezone.now())
            .count()
        )

    def lock_rows(self) -> int:
        """Return how many held rows the lock table has (database backends)."""
        from django_distlock.models import LockRecord

        db = self.locks["default"].get("OPTIONS", {}).get("DATABASE", "default")
        return LockRecord.objects.using(db).filter(token__isnull=False).count()


def make_env(kind: str, nodes: int = 5) -> Env:
    """Start what backend ``kind`` needs and return its Env (not yet in LOCKS)."""
    if kind in ("redis", "reentrant"):
        server = RedisServer().start()
        proxy = FaultProxy(server.port).start()
        backend = (
            "django_distlock.backends.redis.RedisLockBackend"
            if kind == "redis"
            else "django_distlock.backends.redis.ReentrantRedisLockBackend"
        )
        entry = {
            "BACKEND": backend,
            "LOCATION": proxy.url,
            "TTL": 1.0,
            "OPTIONS": REDIS_OPTIONS,
        }
        return Env(
            kind, {"default": entry}, [server], [proxy], reentrant=kind == "reentrant"
        )
    if kind == "redlock":
        servers = [RedisServer().start() for _ in range(nodes)]
        proxies = [FaultProxy(s.port, seed=i).start() for i, s in enumerate(servers)]
        entry = {
            "BACKEND": "django_distlock.backends.redlock.RedlockBackend",
            "LOCATION": [p.url for p in proxies],
            # The default TTL is also how long a restarted node sits out.
            "TTL": 1.0,
            "OPTIONS": REDLOCK_OPTIONS,
        }
        return Env(kind, {"default": entry}, servers, proxies)
    if kind == "cluster":
        from tests.cluster_servers import RedisCluster

        cluster = RedisCluster().start()
        entry = {
            "BACKEND": "django_distlock.backends.redis.RedisLockBackend",
            "LOCATION": cluster.url,
            "TTL": 1.0,
            "OPTIONS": REDIS_OPTIONS,
        }
        return Env(kind, {"default": entry}, cluster=cluster)
    if kind == "sentinel":
        from tests.cluster_servers import SentinelSetup

        setup = SentinelSetup().start()
        entry = {
            "BACKEND": "django_distlock.backends.redis.RedisLockBackend",
            "TTL": 1.0,
            "OPTIONS": {
                **REDIS_OPTIONS,
                "SENTINELS": setup.sentinels,
                "SERVICE_NAME": setup.SERVICE,
            },
        }
        return Env(kind, {"default": entry}, cluster=setup)
    if kind in ("pgserver", "mariadbserver"):
        # The database backend on a PostgreSQL or MariaDB server of the
        # test's own, which a fault may pause or kill: it comes back on its
        # data, recovering from its log.
        from tests.mariadb_server import MariaDBServer
        from tests.pg_server import PostgresServer

        server_class = PostgresServer if kind == "pgserver" else MariaDBServer
        entry = {
            "BACKEND": "django_distlock.backends.database.DatabaseLockBackend",
            "TTL": 1.0,
            "OPTIONS": {"DATABASE": server_class.alias},
        }
        server = server_class().start()
        return Env(
            kind, {"default": entry}, servers=[server], record_db=server_class.alias
        )
    if kind in ("database", "postgres", "mysql"):
        db = "default" if kind == "database" else kind
        entry = {
            "BACKEND": "django_distlock.backends.database.DatabaseLockBackend",
            "TTL": 1.0,
            "OPTIONS": {"DATABASE": db},
        }
        return Env(kind, {"default": entry}, record_db=db)
    raise AssertionError(kind)


class Run:
    """One scenario run on one backend."""

    def __init__(
        self,
        scenario: str,
        env: Env,
        tmp_path: Path,
        *,
        workers: int | None = None,
        names: list[str] | None = None,
        records: tuple[str, ...] = ("fenced",),
        ttl: float = 1.0,
        timeout: float = 2.0,
        hold: float = 0.004,
        pause: float = 0.004,
        record_redis: str | None = None,
        extra: dict | None = None,
        per_worker: dict[int, dict] | None = None,
        extend: bool = True,
    ):
        self.scenario = scenario
        self.env = env
        self.ttl = ttl
        # Release mode lengthens the run to its share of the sections.
        self.extend = RELEASE and extend and (RELEASE_SECTIONS or RELEASE_SECONDS) > 0
        self.started: float | None = None
        self.probe_free_after: float | None = None
        if names is None and RELEASE:
            names = RELEASE_NAMES
        if workers is None:
            workers = RELEASE_WORKERS if RELEASE else 3
        self.dir = tmp_path / "run"
        self.log_dir = self.dir / "logs"
        self.log_dir.mkdir(parents=True)
        (self.dir / "files").mkdir()
        self.stop_path = self.dir / "stop"
        self.names = names or ["torture:a", "torture:b"]
        self.records = records
        self.fault_start: float | None = None
        self.fault_end: float | None = None
        self.procs = []
        spec: dict = {}
        if "file" in records:
            spec["file"] = str(self.dir / "files")
        if "redis" in records:
            spec["redis"] = record_redis
        if "fenced" in records:
            spec["fenced"] = env.record_db
        self.spec = spec
        self.configs = []
        for i in range(workers):
            cfg = {
                "wid": f"w{i}",
                "alias": "default",
                "names": self.names,
                "ttl": ttl,
                "timeout": timeout,
                "hold": hold,
                "pause": pause,
                "records": spec,
                "log_dir": str(self.log_dir),
                "stop": str(self.stop_path),
                "seed": i,
                **(extra or {}),
                **((per_worker or {}).get(i, {})),
            }
            self.configs.append(cfg)

    # -- phases ------------------------------------------------------------

    def start(self) -> Run:
        """Create the records, start the workers, wait until they all run."""
        assert settings.LOCKS == self.env.locks, "LOCKS must be in force first"
        if "fenced" in self.records:
            from tests.testapp.models import FencedSetting

            for name in self.names:
                FencedSetting.objects.using(self.env.record_db).get_or_create(
                    key=record_key(name)
                )
        from django.db import connections

        # The test databases of this session, and the ports of those whose
        # server a test starts (a server of its own, a proxy).
        databases = {
            alias: {key: connections[alias].settings_dict[key] for key in DB_KEYS}
            for alias in settings.DATABASES
        }
        self.procs = self.pool(len(self.configs))
        for servant_, cfg in zip(self.procs, self.configs):
            servant_.jobs.put({**cfg, "locks": self.env.locks, "databases": databases})
        _ACTIVE.append(self)
        self.started = time.monotonic()
        deadline = time.monotonic() + 120
        while len(self.events("ready")) < len(self.procs):
            if time.monotonic() > deadline:
                raise AssertionError("the workers did not start")
            if not all(s.alive() for s in self.procs):
                raise AssertionError("a worker died while starting")
            time.sleep(0.05)
        return self

    def pool(self, count: int) -> list[Servant]:
        """Return ``count`` idle worker processes for this run's jobs."""
        return servants(count)

    def events(self, kind: str | None = None) -> list[dict]:
        events = read_events(self.log_dir)
        return [e for e in events if kind is None or e["k"] == kind]

    def pids(self) -> list[int]:
        return [e["pid"] for e in self.events("ready")]

    def load(self, seconds: float) -> None:
        """Let the workers run for ``seconds`` (scaled in long mode).

        In release mode the first load before the fault also runs until half
        of the run's sections are done.
        """
        time.sleep(seconds * SCALE)
        if self.extend and self.fault_start is None:
            self.extend_to(0.5)

    def section_count(self) -> int:
        """Return how many critical sections the workers logged so far
        (cheaply: counts log lines, without parsing them)."""
        return sum(
            path.read_bytes().count(b'"k": "cs"')
            for path in self.log_dir.glob("*.jsonl")
        )

    def extend_to(self, share: float) -> None:
        """Release mode: let the workers run until ``share`` of the run's
        sections are done, or ``share`` of its extra seconds went by."""
        assert self.started is not None
        deadline = self.started + share * RELEASE_SECONDS if RELEASE_SECONDS else None
        goal = share * RELEASE_SECTIONS if RELEASE_SECTIONS else None
        while True:
            if deadline is not None and time.monotonic() >= deadline:
                return
            if goal is not None and self.section_count() >= goal:
                return
            if not all(s.alive() for s in self.procs):
                return  # finish() reports it
            time.sleep(1.0)

    def probe(self) -> float | None:
        """Try a name no worker uses with ``timeout=0`` until it is acquired;
        return when that happened, in seconds after the fault's end (None if
        not within :data:`PROBE_LIMIT`)."""
        from django_distlock import lock
        from django_distlock.exceptions import LockError

        assert self.fault_end is not None
        deadline = time.monotonic() + PROBE_LIMIT
        while time.monotonic() < deadline:
            handle = lock("torture:probe", ttl=self.ttl, timeout=0, auto_renew=False)
            try:
                ok = handle.acquire()
            except LockError:
                ok = False
            if ok:
                free = time.monotonic() - self.fault_end
                try:
                    handle.release()
                except LockError:
                    pass  # the lease expires by its TTL
                return free
            time.sleep(0.01)
        return None

    def wait_for_sections(self, count: int, timeout: float = 60) -> None:
        """Wait until the workers completed ``count`` more critical sections."""
        target = len(self.events("cs")) + count
        deadline = time.monotonic() + timeout
        while len(self.events("cs")) < target:
            if time.monotonic() > deadline:
                raise AssertionError(f"fewer than {count} critical sections ran")
            time.sleep(0.05)

    @contextlib.contextmanager
    def fault(self):
        """Mark the fault window (its end starts the recovery phase)."""
        self.fault_start = time.monotonic()
        try:
            yield
        finally:
            self.fault_end = time.monotonic()

    def finish(
        self, recovery: float = 1.0, require_recovery: bool = True, after=None
    ) -> Verdict:
        """Run the recovery phase, stop the workers, check and report.

        ``after`` runs once the workers stopped, before the report; the text
        it returns is added to the verdict's notes.
        """
        begun = time.monotonic()
        if self.fault_end is not None:
            self.probe_free_after = self.probe()
        time.sleep(max(0.0, recovery * SCALE - (time.monotonic() - begun)))
        if self.extend:
            self.extend_to(1.0)
        if require_recovery and self.fault_end is not None:
            # Every worker must take a lock again, however long it takes.
            deadline = time.monotonic() + 30
            while self._recovered() < len(self.procs):
                if time.monotonic() > deadline:
                    break
                time.sleep(0.1)
        self.stop_path.write_text("stop")
        _ACTIVE.remove(self)
        hung = []
        failed = []
        for servant_ in self.procs:
            try:
                wid, outcome = servant_.done.get(timeout=60)
            except Exception:
                hung.append(servant_.proc.pid)
                print(f"worker {servant_.proc.pid} hung:", file=sys.stderr)
                print(dump_stacks(servant_.proc.pid), file=sys.stderr)
                servant_.kill()
                continue
            if outcome != "ok":
                failed.append(f"{wid}: {outcome}")
        verdict = self.verdict()
        assert not failed, f"workers failed: {failed}"
        if hung:
            verdict.notes.append(f"workers hung: {hung}")
        if after is not None and not hung:
            try:
                verdict.notes.append(after())
            except AssertionError as e:
                verdict.notes.append(f"FAILED: {e}")
                report(verdict)
                raise
        report(verdict)
        assert not hung, f"{verdict.summary()}\nworkers hung: {hung}"
        assert verdict.violations == 0, (
            verdict.summary() + "\n" + "\n".join(verdict.notes[:20])
        )
        assert verdict.critical_sections > 0, verdict.summary()
        if require_recovery and self.fault_end is not None:
            assert verdict.recovered_workers == len(self.procs), (
                "locks did not recover after the fault: " + verdict.summary()
            )
        return verdict

    def _recovered(self) -> int:
        return len(
            {
                s["w"]
                for s in self.events("cs")
                if s["start"] > self.fault_end and s["rel"] == "ok"
            }
        )

    def read_records(self) -> dict[str, dict[str, str]]:
        records: dict[str, dict[str, str]] = {}
        if "file" in self.spec:
            folder = Path(self.spec["file"])
            records["file"] = {
                n: (folder / record_key(n)).read_text()
                if (folder / record_key(n)).exists()
                else ""
                for n in self.names
            }
        if "redis" in self.spec:
            import redis

            client = redis.Redis.from_url(self.spec["redis"])
            records["redis"] = {
                n: (client.get(record_key(n)) or b"").decode() for n in self.names
            }
            client.close()
        if "fenced" in self.spec:
            from tests.testapp.models import FencedSetting

            rows = FencedSetting.objects.using(self.env.record_db)
            records["fenced"] = {
                n: rows.get(key=record_key(n)).value for n in self.names
            }
        return records

    def verdict(self) -> Verdict:
        """Judge the run, with its availability figures and target."""
        verdict = self.judge()
        verdict.probe_free_after = self.probe_free_after
        verdict.target = max(AVAILABILITY_TARGET, self.ttl)
        return verdict

    def judge(self) -> Verdict:
        """Check the workers' history (the exclusive-lock oracles)."""
        return check(
            self.scenario,
            self.env.kind,
            self.events(),
            self.read_records(),
            fault_end=self.fault_end,
            reentrant=self.env.reentrant,
        )


def abort_runs() -> None:
    """Stop the workers of runs a failed test left running (or kill them)."""
    while _ACTIVE:
        run = _ACTIVE.pop()
        run.stop_path.write_text("stop")
        for servant_ in run.procs:
            try:
                servant_.done.get(timeout=30)
            except Exception:
                servant_.kill()


def report(verdict: Verdict) -> None:
    """Keep ``verdict`` for the summary and append it to the report file."""
    VERDICTS.append(verdict)
    if REPORT:
        Path(REPORT).parent.mkdir(parents=True, exist_ok=True)
        with open(REPORT, "a") as f:
            f.write(json.dumps(verdict.as_dict()) + "\n")


def pause_servers(env: Env, seconds: float = 3.0) -> None:
    """SIGSTOP the server for ``seconds`` (of Redlock's five, one), then
    SIGCONT it."""
    env.servers[0].pause()
    time.sleep(seconds)
    env.servers[0].resume()


def kill_servers(env: Env) -> None:
    """SIGKILL the server and start it again (of Redlock's five, two).

    Redis comes back empty; ZooKeeper, PostgreSQL and MariaDB on their data
    directories.
    """
    victims = env.servers[:2] if env.kind == "redlock" else env.servers
    for server in victims:
        server.kill()
    time.sleep(0.5)
    for server in victims:
        server.start()


#: The server faults by name: the label of a scenario's report, and the fault.
FAULTS = {
    "paused": ("SIGSTOPped 3 x TTL", pause_servers),
    "killed": ("SIGKILLed, restarted", kill_servers),
}


def wait_until(predicate, timeout: float = 30.0, what: str = "condition") -> None:
    """Poll ``predicate`` until it is true; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)
