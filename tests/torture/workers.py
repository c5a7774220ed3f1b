"""Worker processes of the torture suite (spawned through :mod:`tests.procs`).

A load worker loops until its stop file appears: it picks a lock name, tries
to acquire it, and in the critical section reads every shared record, pauses,
then appends ``<token>:<section id>,`` to each (a deliberately non-atomic
read-modify-write, so two overlapping sections lose an update). Every attempt
and every critical section is logged (see :mod:`tests.torture.history`).

Records: ``file`` (a file per lock name), ``redis`` (a key per lock name on a
Redis server that no fault touches) and ``fenced`` (a
:class:`~tests.testapp.models.FencedSetting` row per lock name, written with
``save(fence=held)``, so a late write from a holder whose lease lapsed is
refused).
"""

from __future__ import annotations

import hashlib
import os
import random
import signal
import time
from pathlib import Path

from .history import EventLog


def record_key(name: str) -> str:
    """Return a short, unique key for lock ``name``'s record."""
    return "t" + hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:40]


class Records:
    """The shared records one critical section reads and writes."""

    def __init__(self, spec: dict):
        self.spec = spec
        self._redis = None

    def read(self, name: str) -> dict:
        values = {}
        key = record_key(name)
        if "file" in self.spec:
            path = Path(self.spec["file"]) / key
            values["file"] = path.read_text() if path.exists() else ""
        if "redis" in self.spec:
            if self._redis is None:
                import redis

                self._redis = redis.Redis.from_url(self.spec["redis"])
            values["redis"] = (self._redis.get(key) or b"").decode()
        if "fenced" in self.spec:
            from tests.testapp.models import FencedSetting

            db = self.spec["fenced"]
            try:
                values["fenced"] = FencedSetting.objects.using(db).get(key=key)
            except Exception as e:
                self._db_error(db)
                values["fenced"] = e
        return values

    def write(self, name: str, values: dict, handle, entry: str) -> dict:
        from django_distlock.exceptions import LockLost, StaleFencingToken

        outcome = {}
        key = record_key(name)
        if "file" in values:
            path = Path(self.spec["file"]) / key
            tmp = path.with_suffix(f".{os.getpid()}")
            tmp.write_text(values["file"] + entry)
            tmp.replace(path)
            outcome["file"] = "ok"
        if "redis" in values:
            try:
                self._redis.set(key, values["redis"] + entry)
                outcome["redis"] = "ok"
            except Exception as e:
                outcome["redis"] = f"error:{type(e).__name__}"
        if "fenced" in values:
            row = values["fenced"]
            if isinstance(row, Exception):
                outcome["fenced"] = f"error:{type(row).__name__}"
            else:
                row.value += entry
                try:
                    row.save(fence=handle)
                    outcome["fenced"] = "ok"
                except StaleFencingToken:
                    outcome["fenced"] = "stale"
                except LockLost:
                    outcome["fenced"] = "lost"
                except Exception as e:
                    # The outcome of a write whose connection died is unknown.
                    self._db_error(self.spec["fenced"])
                    outcome["fenced"] = f"error:{type(e).__name__}"
        return outcome

    @staticmethod
    def _db_error(db: str) -> None:
        from django.db import connections

        try:
            connections[db].close()
        except Exception:  # noqa: S110 - the connection is gone anyway
            pass


def _prepare(cfg: dict) -> None:
    if cfg.get("mysql_lock_wait_timeout"):
        # This worker's own lock connections give up on a row lock quickly.
        from django.conf import settings

        options = settings.DATABASES["mysql"].setdefault("OPTIONS", {})
        options["init_command"] = (
            f"SET SESSION innodb_lock_wait_timeout = {cfg['mysql_lock_wait_timeout']}"
        )


def load_worker(cfg: dict) -> None:
    """Take locks and write the records until ``cfg["stop"]`` exists."""
    from django_distlock import lock
    from django_distlock.exceptions import LockError, LockLost

    _prepare(cfg)
    wid = cfg["wid"]
    log = EventLog(Path(cfg["log_dir"]) / f"{wid}.jsonl")
    records = Records(cfg["records"])
    rng = random.Random(cfg.get("seed", 0) * 1000 + hash(wid) % 1000)
    stop = Path(cfg["stop"])
    victim = cfg.get("stop_self_in_cs")  # section number at which to SIGSTOP
    log.log(k="ready", w=wid, pid=os.getpid(), t=time.monotonic())
    n = 0
    while not stop.exists():
        name = rng.choice(cfg["names"])
        handle = lock(
            name,
            using=cfg["alias"],
            ttl=cfg["ttl"],
            timeout=cfg["timeout"],
            auto_renew=cfg.get("auto_renew", True),
        )
        t0 = time.monotonic()
        try:
            ok = handle.acquire()
        except LockError as e:
            log.log(
                k="attempt",
                w=wid,
                t0=t0,
                t1=time.monotonic(),
                ok=False,
                err=type(e).__name__,
            )
            time.sleep(0.05)
            continue
        except Exception as e:  # surfaced to the checker as a note
            log.log(
                k="attempt",
                w=wid,
                t0=t0,
                t1=time.monotonic(),
                ok=False,
                err=f"unexpected:{type(e).__name__}:{e}"[:300],
            )
            time.sleep(0.05)
            continue
        log.log(k="attempt", w=wid, t0=t0, t1=time.monotonic(), ok=ok, err=None)
        if not ok:
            continue
        n += 1
        cs_id = f"{wid}.{n}"
        start = time.monotonic()
        token = handle.fencing_token
        values = records.read(name)
        if victim is not None and n == victim:
            os.kill(os.getpid(), signal.SIGSTOP)  # a "GC pause" mid-section
        time.sleep(cfg["hold"] * rng.random() * 2)
        write = records.write(name, values, handle, f"{token}:{cs_id},")
        end = time.monotonic()
        try:
            handle.release()
            rel = "ok"
        except LockLost:
            rel = "LockLost"
        except Exception as e:
            rel = type(e).__name__
        log.log(
            k="cs",
            w=wid,
            id=cs_id,
            name=name,
            inv=t0,
            start=start,
            end=end,
            done=time.monotonic(),
            token=token,
            write=write,
            rel=rel,
        )
        if cfg.get("pause"):
            time.sleep(cfg["pause"] * rng.random())


def use_databases(databases: dict[str, dict]) -> None:
    """Point each alias at what a job brings for it: the test databases of
    the session (not the real ones), and the port of a server a test started
    (``NAME`` and ``PORT``)."""
    from django.conf import settings
    from django.db import connections

    for alias, entry in databases.items():
        settings.DATABASES[alias].update(entry)
        connections[alias].close()
        connections[alias].settings_dict.update(entry)


def servant(jobs, done) -> None:
    """Run load jobs from ``jobs`` one after another; report each on ``done``.

    A pool of these long-lived processes saves every scenario the cost of
    starting Python and Django in fresh processes. Each job brings the LOCKS
    setting of its scenario.
    """
    from django.conf import settings
    from django.db import connections

    from django_distlock.handler import locks

    mysql_options = dict(settings.DATABASES["mysql"].get("OPTIONS") or {})
    while True:
        cfg = jobs.get()
        if cfg is None:
            return
        use_databases(cfg["databases"])
        settings.LOCKS = cfg["locks"]
        locks.reset()
        try:
            load_worker(cfg)
            done.put((cfg["wid"], "ok"))
        except BaseException as e:  # reported to the test
            done.put((cfg["wid"], f"{type(e).__name__}: {e}"))
        finally:
            locks.reset()
            settings.DATABASES["mysql"]["OPTIONS"] = dict(mysql_options)
            for conn in connections.all():
                conn.close()
