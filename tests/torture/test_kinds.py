"""Shared locks and semaphores under server faults: paused, killed, restarted.

Readers and writers of one readers-writer lock, and the holders of one
permit of a limit-3 semaphore, run in spawned worker processes
(:mod:`.kinds_workers`) while the server is SIGSTOPped for three TTLs, or
SIGKILLed and started again: single-instance Redis (restarted empty), Redlock
(a minority of its five nodes), ZooKeeper (restarted on its data) and the
database backend on a PostgreSQL or MariaDB server of the test's own
(``pgserver``, ``mariadbserver``: restarted on its data, recovering from
its log); on the PostgreSQL server shared with the rest of the suite the
fault is ``pg_terminate_backend``, as in ``test_databases``.
Redlock offers no semaphores (docs/backends/redlock.md), so it runs the
readers-writer scenarios only.

The scenarios reuse :class:`~.harness.Run` (phases, fault window, recovery,
the report), with two adapters kept in this file so that the harness is
untouched: a pool of servants that run the kinds worker, and the oracle
below, which turns a kinds history into the same :class:`~.history.Verdict`
the exclusive scenarios report (its ``overlaps`` count the kinds'
violations; the kinds' own counts go to its notes).
"""

from __future__ import annotations

import os
import signal
import time
from collections import Counter, defaultdict

import pytest
from django.test import override_settings

from .conftest import backends
from .harness import FAULTS, Env, Run, Servant, abort_runs, make_env, stop_servants
from .history import Verdict, check, names_free_after
from .kinds_workers import kinds_servant

LIMIT = 3
TTL = 1.0

# -- the oracle ----------------------------------------------------------------


def _confirmed(section: dict) -> bool:
    """True if the section's holder released it: it held the lease throughout.

    A section whose holder learned of the loss (``LockLost``, or a backend
    error at release) is excluded as the exclusive oracle excludes it.
    """
    return section["rel"] == "ok"


def _granted_first(late: dict, section: dict) -> bool:
    """Whether ``late``, which started during ``section``, was granted before
    it (see :func:`.history._granted_before`, its exclusive twin): its holder
    heard of the grant late, its lease lapsed meanwhile (so it reported the
    loss), and the tokens prove the order. A shared holder's token is the
    current one and an exclusive grant raises it, so a writer granted before
    a reader has a token no larger than the reader's, and a reader granted
    before a writer a smaller one."""
    a, b = late.get("token"), section.get("token")
    if _confirmed(late) or not (isinstance(a, int) and isinstance(b, int)):
        return False
    if late["mode"] == "exclusive" and section["mode"] == "shared":
        return a <= b
    return a < b


def _most_at_once(sections: list[dict]) -> int:
    """Return the largest number of ``sections`` inside at one instant."""
    edges = sorted(
        [(s["start"], 1) for s in sections] + [(s["end"], -1) for s in sections],
        key=lambda e: (e[0], e[1]),  # an end before a start at the same instant
    )
    inside = most = 0
    for _, step in edges:
        inside += step
        most = max(most, inside)
    return most


def check_kinds(
    scenario: str,
    backend: str,
    events: list[dict],
    fault_end: float | None,
    limit: int | None = None,
) -> Verdict:
    """Judge a history of readers and writers, or of permits of ``limit``.

    As :func:`~.history.check` does for exclusive locks, sections of a name
    are taken in the order they started, and a later section that starts
    before an earlier one ended overlaps it; an overlap is a violation only
    if the earlier section's release succeeded (its holder kept the lease
    all along; one whose loss was reported is the fencing case, counted in
    ``reported_losses``), and the later one's grant did not provably come
    first (:func:`_granted_first`: a grant heard late). Counted in
    ``overlaps``:

    - readers-writer: every overlapping pair with a writer in it;
    - semaphore: every section that started while ``limit`` earlier
      confirmed sections were still inside (for ``limit`` 1, exactly the
      exclusive rule).

    ``token_regressions``: a confirmed writer whose fencing token is not
    above every token of the confirmed sections that started before it.
    Attempts, waits and contract errors are counted by ``check`` itself
    (without the mutex oracle, which does not model readers or permits).
    """
    verdict = check(
        scenario,
        backend,
        [e for e in events if e["k"] != "cs"],
        {},
        fault_end=fault_end,
        reentrant=True,  # skips check_mutex: not a mutex history
    )
    sections = [e for e in events if e["k"] == "cs"]
    verdict.critical_sections = len(sections)
    verdict.confirmed = sum(1 for s in sections if _confirmed(s))
    verdict.reported_losses = len(sections) - verdict.confirmed
    by_name = defaultdict(list)
    for s in sections:
        by_name[s["name"]].append(s)
    for items in by_name.values():
        items.sort(key=lambda s: s["start"])
        for i, later in enumerate(items):
            inside = [
                earlier
                for earlier in items[:i]
                if later["start"] < earlier["end"] and _confirmed(earlier)
            ]
            if limit is not None:
                if len(inside) >= limit:
                    verdict.overlaps += 1
                    verdict.notes.append(
                        f"overlap: {later['id']} started {later['start']:.4f} "
                        f"with {len(inside)} confirmed permits inside "
                        f"({', '.join(e['id'] for e in inside)})"
                    )
                continue
            for earlier in inside:
                if _granted_first(later, earlier):
                    continue
                if "exclusive" in (earlier["mode"], later["mode"]):
                    verdict.overlaps += 1
                    verdict.notes.append(
                        f"overlap: {earlier['mode']} {earlier['id']} "
                        f"[{earlier['start']:.4f}, {earlier['end']:.4f}] "
                        f"released ok, {later['mode']} {later['id']} started "
                        f"{later['start']:.4f}"
                    )
        if limit is None:
            highest = None
            for s in items:
                if not _confirmed(s):
                    continue
                if s["mode"] == "exclusive" and highest is not None:
                    if s["token"] <= highest:
                        verdict.token_regressions += 1
                        verdict.notes.append(
                            f"writer {s['id']} got token {s['token']} after {highest}"
                        )
                highest = s["token"] if highest is None else max(highest, s["token"])
    modes = Counter(s["mode"] for s in sections)
    if limit is None:
        readers = [s for s in sections if s["mode"] == "shared"]
        verdict.notes.append(
            f"{modes['exclusive']} writer and {modes['shared']} reader sections, "
            f"up to {_most_at_once(readers)} readers at once"
        )
    else:
        verdict.notes.append(
            f"{modes['permit']} permit sections of {limit}, up to "
            f"{_most_at_once([s for s in sections if _confirmed(s)])} confirmed "
            f"({_most_at_once(sections)} counting lost ones) at once"
        )
    if fault_end is not None:
        verdict.recovered_workers = len(
            {s["w"] for s in sections if s["start"] > fault_end and _confirmed(s)}
        )
        verdict.names_free_after = names_free_after(sections, fault_end)
    else:
        verdict.recovered_workers = len({s["w"] for s in sections})
    return verdict


# -- the run: the harness's, with kinds servants and the kinds oracle -------------


class KindsServant(Servant):
    """A long-lived worker process that runs kinds jobs."""

    def __init__(self):
        super().__init__(kinds_servant)


_POOL: list[KindsServant] = []


def kinds_servants(count: int) -> list[KindsServant]:
    """Return ``count`` idle kinds servants, starting new ones as needed."""
    _POOL[:] = [s for s in _POOL if s.alive()]
    while len(_POOL) < count:
        _POOL.append(KindsServant())
    return _POOL[:count]


@pytest.fixture(scope="module", autouse=True)
def _kinds_pool():
    """Stop the kinds servants at the end of the module."""
    yield
    stop_servants(_POOL)


class KindsRun(Run):
    """A :class:`~.harness.Run` of readers and writers (``limit`` None) or of
    permits of a ``limit``-permit semaphore, judged by :func:`check_kinds`."""

    def __init__(self, scenario, env, tmp_path, *, limit=None, writers=0.3, **kw):
        self.limit = limit
        extra = {"limit": limit, "writers": writers}
        super().__init__(scenario, env, tmp_path, records=(), extra=extra, **kw)

    def pool(self, count: int) -> list[KindsServant]:
        return kinds_servants(count)

    def judge(self) -> Verdict:
        return check_kinds(
            self.scenario, self.env.kind, self.events(), self.fault_end, self.limit
        )


# -- backends ----------------------------------------------------------------------


class ZooKeeperNode:
    """A ZooKeeper server with the fault methods a RedisServer has."""

    def __init__(self):
        from tests.cluster_servers import ZooKeeperServer

        self.server = ZooKeeperServer()

    def start(self) -> ZooKeeperNode:
        self.server.start()
        return self

    def kill(self) -> None:
        self.resume()
        self.server.kill()
        self.server.log.close()

    def pause(self) -> None:
        os.kill(self.server.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        if self.server.proc is not None and self.server.proc.poll() is None:
            os.kill(self.server.proc.pid, signal.SIGCONT)

    def stop(self) -> None:
        self.resume()
        self.server.stop()


def zookeeper_env() -> Env:
    """One ZooKeeper server (it keeps its data across a restart)."""
    from tests.test_zookeeper import BACKEND

    node = ZooKeeperNode().start()
    entry = {
        "BACKEND": BACKEND,
        "LOCATION": node.server.hosts,
        "TTL": TTL,
        # A paused or dead server is noticed (SUSPENDED: leases lost) within
        # about two thirds of this; the restart comes back within it.
        "OPTIONS": {"SESSION_TIMEOUT": 3.0, "CONNECT_TIMEOUT": 3.0},
    }
    return Env("zookeeper", {"default": entry}, servers=[node])


def kinds_backends(*kinds: str) -> list:
    """pytest params: :func:`~.conftest.backends` plus ``zookeeper``."""
    params = backends(*[k for k in kinds if k != "zookeeper"])
    if "zookeeper" in kinds:
        params.append(pytest.param("zookeeper", id="zookeeper"))
    return params


@pytest.fixture
def kinds_env(request, kind):
    """Start the backend of ``kind`` (ZooKeeper too); LOCKS point at it."""
    if kind == "postgres":
        request.getfixturevalue("postgres_available")
    environment = zookeeper_env() if kind == "zookeeper" else make_env(kind)
    try:
        with override_settings(LOCKS=environment.locks):
            yield environment
    finally:
        abort_runs()
        environment.stop()


# -- faults --------------------------------------------------------------------------


def terminate_backends(env: Env, seconds: float = 2.0) -> int:
    """``pg_terminate_backend`` the lock connections, then every other
    connection of the test database, in turn every 0.25 s for ``seconds``
    (as ``test_databases`` does: the PostgreSQL server is shared, so it is
    never paused or killed). Return how many backends were terminated."""
    from django.db import connections

    terminated = 0
    only_locks = True
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with connections[env.record_db].cursor() as cursor:
            cursor.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
                + (" AND application_name = 'django_distlock'" if only_locks else "")
            )
            terminated += len(cursor.fetchall())
        only_locks = not only_locks
        time.sleep(0.25)
    return terminated


# -- scenarios -------------------------------------------------------------------------


@pytest.mark.parametrize("fault", list(FAULTS))
@pytest.mark.parametrize(
    "kind",
    kinds_backends("redis", "redlock", "zookeeper", "pgserver", "mariadbserver"),
)
def test_readers_and_writers(kinds_env, kind, fault, tmp_path):
    """Readers and writers of one lock, the server paused or killed.

    No writer's section may overlap any other section (of a confirmed
    holder); readers do overlap (the report says how many at once).
    """
    label, inject = FAULTS[fault]
    run = KindsRun(
        f"readers+writers, node {label}",
        kinds_env,
        tmp_path,
        workers=4,
        names=["torture:rw"],
        ttl=TTL,
        hold=0.02,
        pause=0.005,
    ).start()
    run.load(1.0)
    with run.fault():
        inject(kinds_env)
    run.finish(recovery=1.0)


@pytest.mark.parametrize("fault", list(FAULTS))
@pytest.mark.parametrize(
    "kind", kinds_backends("redis", "zookeeper", "pgserver", "mariadbserver")
)
def test_semaphore(kinds_env, kind, fault, tmp_path):
    """Five workers on a limit-3 semaphore, the server paused or killed.

    Never more than three confirmed permit holders inside at once.
    """
    label, inject = FAULTS[fault]
    run = KindsRun(
        f"semaphore of {LIMIT}, node {label}",
        kinds_env,
        tmp_path,
        workers=5,
        names=["torture:sem"],
        limit=LIMIT,
        ttl=TTL,
        hold=0.02,
        pause=0.005,
    ).start()
    run.load(1.0)
    with run.fault():
        inject(kinds_env)
    run.finish(recovery=1.0)


@pytest.mark.parametrize("limit", [None, LIMIT], ids=["rw", "semaphore"])
@pytest.mark.parametrize("kind", kinds_backends("postgres"))
def test_postgres_backends_terminated(kinds_env, kind, limit, tmp_path):
    """Readers and writers, or a limit-3 semaphore, on the database backend
    (PostgreSQL) while its connections are terminated under load.

    A holder whose connection died must find out (LockLost, an error at
    release), never hang; the oracle is the same as above.
    """
    what = "readers+writers" if limit is None else f"semaphore of {limit}"
    run = KindsRun(
        f"{what}, pg_terminate_backend under load",
        kinds_env,
        tmp_path,
        workers=4 if limit is None else 5,
        names=["torture:rw" if limit is None else "torture:sem"],
        limit=limit,
        ttl=TTL,
        hold=0.02,
        pause=0.005,
    ).start()
    run.load(0.5)
    with run.fault():
        terminated = terminate_backends(kinds_env)
    # The count goes into the report through finish(after=...).
    run.finish(recovery=1.0, after=lambda: f"{terminated} backends terminated")
    assert terminated > 0


# -- the oracle itself (no servers) ---------------------------------------------------


def _cs(cs_id, mode, start, end, rel="ok", token=1, w=None):
    return {
        "k": "cs",
        "w": w or cs_id,
        "id": cs_id,
        "name": "n",
        "mode": mode,
        "inv": start,
        "start": start,
        "end": end,
        "done": end,
        "token": token,
        "write": {},
        "rel": rel,
    }


def test_oracle_readers_and_writers():
    """Readers may overlap each other, never a writer; a reported loss is
    excluded as in the exclusive oracle; a writer's token must exceed every
    earlier one."""
    ok = check_kinds(
        "t",
        "b",
        [
            _cs("r1", "shared", 0, 2, token=5),
            _cs("r2", "shared", 1, 3, token=5),
            _cs("w1", "exclusive", 4, 5, token=6),
            _cs("r3", "shared", 6, 8, rel="LockLost", token=6),
            _cs("w2", "exclusive", 7, 9, token=7),
        ],
        fault_end=None,
    )
    assert (ok.violations, ok.reported_losses, ok.confirmed) == (0, 1, 4)
    assert "up to 2 readers at once" in ok.notes[-1]
    bad = check_kinds(
        "t",
        "b",
        [
            _cs("r1", "shared", 0, 2, token=5),
            _cs("w1", "exclusive", 1, 3, token=6),
            _cs("r2", "shared", 2.5, 4, token=6),
            _cs("w2", "exclusive", 5, 6, token=6),
        ],
        fault_end=None,
    )
    assert (bad.overlaps, bad.token_regressions) == (2, 1)


def test_oracle_a_grant_heard_late():
    """A holder that heard of its grant only after its lease lapsed (a server
    stopped between the grant and the reply) reports the loss; if its token
    proves the grant came first, the other section's start inside it is no
    overlap, in either order of reader and writer."""

    def overlaps(events):
        return check_kinds("t", "b", events, fault_end=None).overlaps

    reader = _cs("r1", "shared", 0, 2, token=5)
    # The writer was granted fence 5 and lapsed; the reader then took the
    # name with the current fence, 5. Granted after the reader: 6.
    assert overlaps([reader, _cs("w1", "exclusive", 1, 3, "LockLost", 5)]) == 0
    assert overlaps([reader, _cs("w1", "exclusive", 1, 3, "LockLost", 6)]) == 1
    assert overlaps([reader, _cs("w1", "exclusive", 1, 3, token=5)]) == 1
    writer = _cs("w1", "exclusive", 0, 2, token=6)
    assert overlaps([writer, _cs("r1", "shared", 1, 3, "LockLost", 5)]) == 0
    assert overlaps([writer, _cs("r1", "shared", 1, 3, "LockLost", 6)]) == 1


def test_oracle_semaphore():
    """A section started while ``limit`` confirmed permits were inside is a
    violation; lost permits do not count."""
    inside = [_cs(f"p{i}", "permit", i * 0.1, 5) for i in range(3)]
    bad = check_kinds(
        "t", "b", [*inside, _cs("p3", "permit", 1, 2)], fault_end=None, limit=3
    )
    assert bad.overlaps == 1
    inside[0]["rel"] = "LockBackendError"
    ok = check_kinds(
        "t", "b", [*inside, _cs("p3", "permit", 1, 2)], fault_end=None, limit=3
    )
    assert (ok.overlaps, ok.reported_losses) == (0, 1)
    assert "up to 3 confirmed (4 counting lost ones)" in ok.notes[-1]
