"""Shared locks and semaphore permits on the database backend.

Every test runs against SQLite (the ``default`` alias, when
``DISTLOCK_TEST_DB`` is ``sqlite``), PostgreSQL (alias ``postgres``, with and
without ``WAIT = "notify"``) and MariaDB/MySQL (alias ``mysql``); a server
that is not reachable skips locally and fails under ``CI=true``. The backend
is called directly (``backend.acquire(name, ttl, timeout, SHARED)``).
"""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import threading
import time
import uuid
from collections.abc import Iterator

import pytest
from django.db import connections
from django.test import override_settings

from django_distlock import locks
from django_distlock.backends.database import (
    DatabaseLockBackend,
    bells,
    shares,
    waiting,
)
from django_distlock.backends.kinds import EXCLUSIVE, SHARED, permit
from django_distlock.exceptions import LockBackendError
from django_distlock.models import LockShare

from . import kinds_workers
from .procs import run_in_processes, start_process

BACKEND = "django_distlock.backends.database.DatabaseLockBackend"


def _param(database: str, *marks, notify: bool = False):
    databases = ["default"] if database == "default" else ["default", database]
    ident = {"default": "sqlite"}.get(database, database)
    return pytest.param(
        (database, notify),
        marks=[pytest.mark.django_db(transaction=True, databases=databases), *marks],
        id=ident + ("-notify" if notify else ""),
    )


DATABASES = [
    _param("default"),
    _param("postgres", pytest.mark.postgres),
    _param("postgres", pytest.mark.postgres, notify=True),
    _param("mysql", pytest.mark.mysql),
]


@pytest.fixture(params=DATABASES)
def backend(request) -> DatabaseLockBackend:
    """The database backend on the database under test (LOCKS["default"])."""
    alias, notify = request.param
    if alias == "default":
        if connections["default"].vendor != "sqlite":
            pytest.skip("the default database is not SQLite (DISTLOCK_TEST_DB)")
    else:
        request.getfixturevalue(f"{alias}_available")
    options = {"DATABASE": alias}
    if notify:
        options["WAIT"] = "notify"
    setting = {"default": {"BACKEND": BACKEND, "TTL": 5, "OPTIONS": options}}
    with override_settings(LOCKS=setting):
        backend = locks["default"]
        assert isinstance(backend, DatabaseLockBackend)
        yield backend
    locks.reset()


@pytest.fixture
def name():
    return f"kinds:{uuid.uuid4().hex[:10]} [%_*?]"


def _rows(backend, **filters):
    return LockShare.objects.using(backend.database).filter(**filters)


def _waiter_gone(backend, channel: str) -> bool:
    """Whether the waiter whose place names ``channel`` has gone, as a
    release sees it: the advisory lock its connection held is free
    (PostgreSQL, migration 0008), so is its user lock (MariaDB), or nobody
    has bound its bell (SQLite)."""
    if backend.dialect.vendor == "sqlite":
        return not bells.rings(channel)
    free = {
        "postgresql": "pg_try_advisory_xact_lock_shared(hashtextextended(%s, 0))",
        "mysql": "IS_USED_LOCK(%s) IS NULL",
    }[backend.dialect.vendor]
    with connections[backend.database].cursor() as cursor:
        cursor.execute(f"SELECT {free}", [channel])
        return bool(cursor.fetchall()[0][0])


def _wait_for(predicate, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.02)


# -- shared locks -------------------------------------------------------------


class TestShared:
    def test_shared_holders_coexist_and_exclude_exclusive(self, backend, name):
        assert "shared" in backend.kinds and "permit" in backend.kinds
        a = backend.acquire(name, 10, 0, SHARED)
        b = backend.acquire(name, 10, 0, SHARED)
        assert a is not None and b is not None
        assert a.kind is SHARED and b.kind is SHARED and a.token != b.token
        assert backend.acquire(name, 10, 0) is None
        assert backend.release(a)
        assert backend.acquire(name, 10, 0) is None  # b still holds it
        assert backend.release(b)
        writer = backend.acquire(name, 10, 0)
        assert writer is not None and writer.kind is EXCLUSIVE
        assert backend.acquire(name, 10, 0, SHARED) is None
        assert backend.release(writer)
        assert backend.acquire(name, 10, 0, SHARED) is not None

    def test_exclusive_waiter_gets_in_when_the_last_reader_leaves(self, backend, name):
        reader = backend.acquire(name, 10, 0, SHARED)
        got = []
        waiter = threading.Thread(
            target=lambda: got.append(backend.acquire(name, 10, 20))
        )
        started = time.monotonic()
        waiter.start()
        time.sleep(0.3)
        assert backend.release(reader)
        waiter.join(30)
        assert got[0] is not None and got[0].kind is EXCLUSIVE
        assert time.monotonic() - started < 10  # woken, not left to the ttl
        assert backend.release(got[0])

    def test_writer_preference(self, backend, name):
        reader = backend.acquire(name, 10, 0, SHARED)
        got = []
        waiter = threading.Thread(
            target=lambda: got.append(backend.acquire(name, 10, 30))
        )
        waiter.start()
        _wait_for(lambda: _rows(backend, kind="writer").exists())
        # A new reader queues behind the waiting writer.
        assert backend.acquire(name, 10, 0, SHARED) is None
        late = []
        late_reader = threading.Thread(
            target=lambda: late.append(backend.acquire(name, 10, 30, SHARED))
        )
        late_reader.start()
        time.sleep(0.2)
        assert backend.release(reader)
        waiter.join(30)
        writer = got[0]
        assert writer is not None
        assert not _rows(backend, kind="writer").exists()  # its place is gone
        time.sleep(0.2)
        assert not late  # still behind the writer
        assert backend.release(writer)
        late_reader.join(30)
        assert late[0] is not None and late[0].fencing_token == writer.fencing_token
        assert backend.release(late[0])

    def test_dead_waiter_does_not_block_readers(self, backend, name):
        reader = backend.acquire(name, 30, 0, SHARED)
        # A waiter's place, left as by a process killed while it waited.
        digest = backend._digest(name)
        backend._call(
            "queue",
            backend._queue_writer,
            digest,
            "f" * 32,
            ("elsewhere", 1, "MainThread"),
        )
        backend._queued.discard("f" * 32)  # its process is gone
        assert backend.acquire(name, 10, 0, SHARED) is None
        started = time.monotonic()
        second = backend.acquire(name, 10, 10, SHARED)
        assert second is not None
        assert time.monotonic() - started < 6
        assert backend.release(second) and backend.release(reader)

    def test_timed_out_writer_leaves_no_place(self, backend, name):
        reader = backend.acquire(name, 30, 0, SHARED)
        assert backend.acquire(name, 10, 0.3) is None
        assert not _rows(backend, kind="writer").exists()
        assert backend.acquire(name, 10, 0, SHARED) is not None
        assert backend.release(reader)

    def test_each_holder_has_its_own_lease(self, backend, name):
        a = backend.acquire(name, 2, 0, SHARED)
        b = backend.acquire(name, 2, 0, SHARED)
        before = a.deadline
        assert backend.extend(a, 30)
        assert a.deadline > before + 20
        assert backend.force_release(name, b.token, SHARED)
        assert not backend.is_held(b) and backend.is_held(a)
        assert not backend.release(b)
        assert not backend.extend(b, 10)
        assert not backend.force_release(name, b.token, SHARED)
        # b's force release left a holding the lock past b's own expiry.
        time.sleep(2.2)
        assert backend.is_held(a)
        assert backend.acquire(name, 10, 0) is None
        assert backend.renew([a, a]) == [True, True]
        assert backend.release(a)
        assert backend.acquire(name, 10, 0) is not None

    def test_dead_readers_expire(self, backend, name):
        a = backend.acquire(name, 0.5, 0, SHARED)
        b = backend.acquire(name, 1.0, 0, SHARED)
        assert backend.acquire(name, 10, 0) is None
        writer = backend.acquire(name, 10, 10)
        assert writer is not None
        assert not backend.is_held(a) and not backend.is_held(b)
        assert not backend.release(a)
        assert backend.is_held(writer)

    def test_fencing_order(self, backend, name):
        first = backend.acquire(name, 10, 0)
        backend.release(first)
        readers = [backend.acquire(name, 10, 0, SHARED) for _ in range(3)]
        assert all(r.fencing_token >= first.fencing_token for r in readers)
        for r in readers:
            backend.release(r)
        second = backend.acquire(name, 10, 0)
        assert second.fencing_token > first.fencing_token
        assert all(second.fencing_token > r.fencing_token for r in readers)
        backend.release(second)
        # A name first taken shared: the next exclusive still goes above it.
        other = name + ":new"
        reader = backend.acquire(other, 10, 0, SHARED)
        backend.release(reader)
        writer = backend.acquire(other, 10, 0)
        assert writer.fencing_token > reader.fencing_token

    def test_clear_stale_takes_expired_shares(self, backend, name):
        backend.acquire(name, 0.3, 0, SHARED)
        live = backend.acquire(name + ":live", 30, 0, SHARED)
        fence = live.fencing_token
        time.sleep(0.6)
        assert backend.clear_stale() >= 1
        assert backend.is_held(live)
        assert [h.token for h in backend.holders(name + ":live")] == [live.token]
        assert backend.release(live)
        writer = backend.acquire(name + ":live", 10, 0)
        assert writer.fencing_token > fence


# -- semaphores ---------------------------------------------------------------


def _queued_count(backend, count):
    return lambda: _rows(backend, kind="queued").count() == count


class TestPermits:
    def test_at_most_limit_permits(self, backend, name):
        three = permit(3)
        held = [backend.acquire(name, 10, 0, three) for _ in range(3)]
        assert all(p is not None and p.kind == three for p in held)
        assert len({p.fencing_token for p in held}) == 3
        assert backend.acquire(name, 10, 0, three) is None
        assert backend.release(held[0])
        again = backend.acquire(name, 10, 0, three)
        assert again.fencing_token > max(p.fencing_token for p in held)
        for p in (*held[1:], again):
            assert backend.release(p)

    def test_apart_from_locks(self, backend, name):
        one = permit(1)
        sem = backend.acquire(name, 10, 0, one)
        exclusive = backend.acquire(name, 10, 0)
        assert sem is not None and exclusive is not None
        assert backend.acquire(name, 10, 0, SHARED) is None
        assert backend.release(exclusive)
        shared = backend.acquire(name, 10, 0, SHARED)
        assert shared is not None
        assert backend.acquire(name, 10, 0, one) is None
        assert not backend.force_release(name, sem.token)  # not a lock's token
        assert backend.is_held(sem)
        assert backend.release(sem) and backend.release(shared)

    def test_limit_mismatch(self, backend, name):
        held = backend.acquire(name, 0.5, 0, permit(2))
        with pytest.raises(ValueError, match="Semaphore") as info:
            backend.acquire(name, 10, 0, permit(3))
        assert repr(name) in str(info.value)
        with pytest.raises(ValueError):
            backend.acquire(name, 10, 0, permit(0))
        time.sleep(0.7)  # the permit of the other limit expired
        assert not backend.is_held(held)
        assert backend.acquire(name, 10, 0, permit(3)) is not None

    def test_dead_holders_permit_expires(self, backend, name):
        backend.acquire(name, 0.5, 0, permit(1))
        assert backend.acquire(name, 10, 0, permit(1)) is None
        started = time.monotonic()
        second = backend.acquire(name, 10, 10, permit(1))
        assert second is not None
        assert time.monotonic() - started < 6
        assert backend.release(second)

    def test_fifo(self, backend, name):
        one = permit(1)
        first = backend.acquire(name, 10, 0, one)
        order = []

        def wait(label):
            lease = backend.acquire(name, 10, 30, one)
            order.append(label)
            time.sleep(0.05)
            backend.release(lease)

        threads = []
        for label in "abc":
            t = threading.Thread(target=wait, args=(label,))
            t.start()
            threads.append(t)
            _wait_for(_queued_count(backend, len(threads)))
        assert backend.release(first)
        for t in threads:
            t.join(30)
        assert order == ["a", "b", "c"]
        assert not _rows(backend, kind="queued").exists()

    def test_timed_out_waiter_leaves_the_queue(self, backend, name):
        one = permit(1)
        first = backend.acquire(name, 10, 0, one)
        assert backend.acquire(name, 10, 0.2, one) is None
        assert not _rows(backend, kind="queued").exists()
        backend.release(first)
        assert backend.acquire(name, 10, 0, one) is not None

    def test_extend_and_force_release_one_permit(self, backend, name):
        two = permit(2)
        a = backend.acquire(name, 1, 0, two)
        b = backend.acquire(name, 1, 0, two)
        assert backend.extend(a, 30)
        assert backend.force_release_many([(name, b.token, two)]) == [True]
        assert not backend.is_held(b) and backend.is_held(a)
        time.sleep(1.2)
        assert backend.is_held(a)
        c = backend.acquire(name, 10, 0, two)
        assert c is not None
        assert backend.acquire(name, 10, 0, two) is None
        assert backend.renew([a, c]) == [True, True]
        assert backend.release(a) and backend.release(c)


# -- permits handed over by the release (PostgreSQL, SQLite on Linux) --------


def _handing_pg(wait: str):
    marks = [
        pytest.mark.postgres,
        pytest.mark.django_db(transaction=True, databases=["default", "postgres"]),
    ]
    return pytest.param(wait, marks=marks, id=f"postgres-{wait}")


HANDING_PG = [_handing_pg("notify"), _handing_pg("poll")]
HANDING_SQLITE = pytest.param(
    "sqlite",
    marks=pytest.mark.django_db(transaction=True, databases=["default"]),
    id="sqlite",
)


def _handing(request) -> Iterator[DatabaseLockBackend]:
    if request.param == "sqlite":
        if connections["default"].vendor != "sqlite":
            pytest.skip("the default database is not SQLite (DISTLOCK_TEST_DB)")
        if not bells.AVAILABLE:
            pytest.skip("Linux's abstract sockets")
        options = {"DATABASE": "default"}
    else:
        request.getfixturevalue("postgres_available")
        options = {"DATABASE": "postgres", "WAIT": request.param}
    setting = {"default": {"BACKEND": BACKEND, "TTL": 5, "OPTIONS": options}}
    with override_settings(LOCKS=setting):
        backend = locks["default"]
        assert backend.hands_over
        yield backend
    locks.reset()


@pytest.fixture(params=[*HANDING_PG, HANDING_SQLITE])
def handing(request) -> Iterator[DatabaseLockBackend]:
    """A backend whose releases hand permits over: PostgreSQL, with and
    without ``WAIT = "notify"``, and a SQLite file (to the waiter's bell)."""
    yield from _handing(request)


@pytest.fixture(params=HANDING_PG)
def handing_pg(request) -> Iterator[DatabaseLockBackend]:
    """The PostgreSQL backend, with and without ``WAIT = "notify"``."""
    yield from _handing(request)


def _queue(backend, name, token, listen=True):
    """One attempt of waiter ``token`` for a permit of 1, which queues it."""
    one = permit(1)
    digest = backend._kind_digest(name, one)
    attempt = backend._attempt
    if listen and backend.dialect.vendor == "postgresql":
        attempt = backend._listen_own_and_attempt
    args = (name, digest, token, 10, ("host", 1, "thread"), one)
    fence, wait = backend._call("acquire", attempt, *args)
    if not listen and backend.dialect.vendor == "sqlite":
        # A waiter of an earlier version: its place names no TTL.
        _rows(backend, token=token, kind="queued").update(ttl=None)
    return fence, wait


def _handed(backend, token: str) -> int | None:
    """Wait up to 5 s for a release to hand ``token`` its permit; its fence."""
    if backend.dialect.vendor == "sqlite":
        return backend._wait_rung(backend._bells, token, 5)
    return backend._call("wait", backend._wait_handed, token, 5)


class TestHandover:
    """One waiter's steps, taken one at a time on this thread's connection."""

    def test_the_release_grants_the_first_waiter_its_permit(self, handing, name):
        first = handing.acquire(name, 10, 0, permit(1))
        token = "a" * 32
        assert _queue(handing, name, token)[0] is None
        place = _rows(handing, token=token).get()
        assert place.kind == "queued" and place.ttl == 10
        assert place.channel.startswith("distlock_wait_")
        assert handing.release(first)
        granted = _rows(handing, token=token).get()
        assert granted.kind == "permit"
        assert granted.fence == first.fencing_token + 1
        assert granted.expires_at > place.expires_at  # the TTL, not the place's
        # The notification carries the fencing token: no attempt needed.
        assert _handed(handing, token) == granted.fence
        # An attempt that comes first finds the permit handed over.
        assert _queue(handing, name, token)[0] == granted.fence
        assert handing.acquire(name, 10, 0, permit(1)) is None
        assert handing.force_release_many([(name, token, permit(1))]) == [True]
        assert handing.acquire(name, 10, 0, permit(1)) is not None

    def test_a_connection_listens_only_while_it_waits(self, handing_pg, name):
        # Every NOTIFY signals every listening backend of the database: a
        # connection that once waited must not stay among them (0009).
        backend = handing_pg

        def listened() -> list[str]:
            def channels(cursor) -> list[str]:
                cursor.execute("SELECT pg_listening_channels()")
                return [c for (c,) in cursor.fetchall() if "_wait_" in c]

            return backend._call("check", channels)

        first = backend.acquire(name, 10, 5, permit(1))  # free: no wait
        assert listened() == []
        token = "a" * 32
        assert _queue(backend, name, token)[0] is None
        assert listened() == [_rows(backend, token=token).get().channel]
        assert backend.release(first)  # hands the permit over, on this session
        fence = _handed(backend, token)
        assert fence is not None and listened() != []
        assert backend.force_release_many([(name, token, permit(1))]) == [True]
        assert listened() == []
        # A place given up stops it too.
        holder = backend.acquire(name, 10, 0, permit(1))
        assert _queue(backend, name, "b" * 32)[0] is None and listened() != []
        backend._withdraw(backend._kind_digest(name, permit(1)), "b" * 32)
        assert listened() == []
        assert backend.release(holder)

    def test_a_waiter_that_gives_up_passes_its_permit_on(self, handing, name):
        first = handing.acquire(name, 10, 0, permit(1))
        early, late = "b" * 32, "c" * 32
        assert _queue(handing, name, early)[0] is None
        assert _queue(handing, name, late)[0] is None
        assert handing.release(first)
        assert _rows(handing, token=early).get().kind == "permit"
        # The early waiter timed out as its permit came: its withdrawal gives
        # the permit back, and the release in it grants the next in line.
        handing._withdraw(handing._kind_digest(name, permit(1)), early)
        assert not _rows(handing, token=early).exists()
        handed = _rows(handing, token=late).get()
        assert handed.kind == "permit" and handed.fence == first.fencing_token + 2
        # The early waiter's datagram (SQLite) is passed over.
        assert _handed(handing, late) == handed.fence

    def test_a_waiter_that_does_not_listen_keeps_its_turn(self, handing, name):
        # A process of a rolling upgrade (code before migration 0006; on
        # SQLite, before handover) queues without a channel (without a TTL):
        # it is woken and takes the permit itself, and the waiter behind it
        # is not served first.
        first = handing.acquire(name, 10, 0, permit(1))
        older, newer = "d" * 32, "e" * 32
        assert _queue(handing, name, older, listen=False)[0] is None
        assert _queue(handing, name, newer)[0] is None
        place = _rows(handing, token=older).get()
        assert place.channel is None or place.ttl is None
        assert handing.release(first)
        assert _rows(handing, token=older).get().kind == "queued"
        assert _rows(handing, token=newer).get().kind == "queued"
        fence, _wait = _queue(handing, name, older, listen=False)
        assert fence == first.fencing_token + 1
        assert handing.force_release_many([(name, older, permit(1))]) == [True]
        assert _rows(handing, token=newer).get().kind == "permit"


# -- permit waiters woken by the release (MariaDB, SQLite) -------------------


WAKING_MARIADB = pytest.param(
    "mysql",
    marks=[
        pytest.mark.mysql,
        pytest.mark.django_db(transaction=True, databases=["default", "mysql"]),
    ],
)
WAKING_SQLITE = pytest.param(
    "default",
    marks=pytest.mark.django_db(transaction=True, databases=["default"]),
    id="sqlite",
)


@pytest.fixture(params=[WAKING_MARIADB, WAKING_SQLITE])
def waking(request, monkeypatch) -> DatabaseLockBackend:
    """The backend on MariaDB or on a SQLite file, whose waiters sleep 60 s
    unless a release wakes them: a test that needs a wake-up to finish
    would time out without one."""
    alias = request.param
    if alias == "default":
        if connections["default"].vendor != "sqlite":
            pytest.skip("the default database is not SQLite (DISTLOCK_TEST_DB)")
    else:
        request.getfixturevalue(f"{alias}_available")
    monkeypatch.setattr(waiting, "NOTIFY_SAFETY_WAIT", 60.0)
    # And their places in the queue outlive the sleep: a place renewed only
    # every minute would expire after its 2 s, and a release would pass over
    # a waiter that had queued more than 2 s before (a loaded machine).
    monkeypatch.setattr(shares, "WAITER_TTL", 240.0)
    options = {"DATABASE": alias}
    setting = {"default": {"BACKEND": BACKEND, "TTL": 60, "OPTIONS": options}}
    with override_settings(LOCKS=setting):
        backend = locks["default"]
        assert backend.wakes_permit_waiters
        assert backend.hands_over == (alias == "default")  # SQLite: to the bell
        yield backend
    locks.reset()


def _dozing(backend, count: int):
    """A predicate: ``count`` waiters wait to be woken.

    On MariaDB they sleep in the database; on SQLite, a waiter whose place
    names its bell is as good as asleep: a datagram sent to it from then on
    waits in the bell's buffer.
    """

    def dozing() -> bool:
        if backend.dialect.vendor == "sqlite":
            places = _rows(backend, kind="queued", channel__isnull=False)
            return places.count() == count
        with connections[backend.database].cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM information_schema.PROCESSLIST "
                "WHERE INFO LIKE 'SELECT ''distlock_doze''%%'"
            )
            return cursor.fetchall()[0][0] == count

    return dozing


@pytest.mark.skipif(not bells.AVAILABLE, reason="Linux's abstract sockets")
def test_a_bell_rings_once_per_datagram_and_is_its_threads_own():
    chime = bells.Bells()
    mine = chime.own()
    assert chime.own() == mine  # bound once per thread
    other = []
    thread = threading.Thread(target=lambda: other.append(chime.own()))
    thread.start()
    thread.join()
    assert other[0] != mine
    # Two datagrams and one to a bell bound by nobody.
    chime.ring([(mine, b"a 1"), (mine, b""), ("distlock_wait_nobody", b"b 2")])
    chime.drain()  # both, sent before the attempt, are spent
    started = time.monotonic()
    assert chime.wait(0.05) is None
    assert time.monotonic() - started >= 0.04, "a drained bell rang"
    chime.ring([(mine, b"c 3")])
    # Returns at once: the datagram waits in the buffer.
    assert chime.wait(30) == b"c 3"
    # A forked child forgets its parent's bell, and binds its own.
    chime.forget()
    assert not bells.rings(mine), "the inherited bell was left open"
    assert chime.own() != mine


@pytest.mark.parametrize("waking", [WAKING_SQLITE], indirect=True)
def test_a_forked_child_closes_the_bell_it_inherits(waking):
    # Else the parent's waiter would look alive for as long as the child
    # lives, whether it is there or not.
    mine = waking._bells.own()
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child, its at-fork hooks run: keep what it has open
        os.write(write_end, b"x")
        time.sleep(30)
        os._exit(0)
    try:
        os.close(write_end)
        assert os.read(read_end, 1) == b"x"
        waking._bells.forget()  # the parent's waiting thread ends
        assert not bells.rings(mine), "the child kept its parent's bell bound"
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(read_end)


def _attempt_args(backend, name: str, token: str, kind) -> tuple:
    """The arguments of one ``backend._attempt`` for ``token``, 60 s TTL."""
    return (name, backend._kind_digest(name, kind), token, 60, ("h", 1, "t"), kind)


def _join(threads: list[threading.Thread], within: float) -> None:
    """Join ``threads``, all of them within ``within`` seconds: less than a
    waiter's minute-long sleep, which only a wake-up cuts short."""
    deadline = time.monotonic() + within
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))


class TestWakes:
    def test_a_release_wakes_the_first_waiter(self, waking, name):
        one = permit(1)
        first = waking.acquire(name, 60, 0, one)
        got = []
        waiter = threading.Thread(
            target=lambda: got.append(waking.acquire(name, 60, 50, one))
        )
        waiter.start()
        try:
            _wait_for(_dozing(waking, 1))
            place = _rows(waking, kind="queued").get()
            assert place.channel.startswith("distlock_wait_")
            assert waking.release(first)
        finally:
            waiter.join(30)
        assert got and got[0] is not None, "the waiter was not woken"
        assert waking.release(got[0])

    def test_a_release_wakes_a_waiter_in_another_process(self, waking, name, tmp_path):
        first = waking.acquire(name, 60, 0, permit(1))
        done = tmp_path / "done"
        proc = start_process(kinds_workers.take_woken_permit, name, 1, str(done))
        try:
            _wait_for(_dozing(waking, 1))
            assert waking.release(first)
            _wait_for(done.exists)
        finally:
            proc.join(10)
            if proc.is_alive():
                os.kill(proc.pid, signal.SIGKILL)
        assert done.read_text() == "held"

    def test_each_release_wakes_as_many_waiters_as_it_frees(self, waking, name):
        # Two permits freed before either woken waiter has taken one: both
        # waiters are woken, not the first twice.
        two = permit(2)
        holders = [waking.acquire(name, 60, 0, two) for _ in range(2)]
        got = []

        def wait() -> None:
            got.append(waking.acquire(name, 60, 120, two))

        waiters = [threading.Thread(target=wait) for _ in range(2)]
        for queued, thread in enumerate(waiters, 1):
            thread.start()  # and queues behind the ones before it
            _wait_for(lambda n=queued: len(_rows(waking, kind="queued")) == n)
        try:
            _wait_for(_dozing(waking, 2))
            assert [waking.release(lease) for lease in holders] == [True, True]
        finally:
            _join(waiters, 30)
        assert len(got) == 2 and all(got), "a waiter was not woken"
        assert [waking.release(lease) for lease in got] == [True, True]

    def test_a_release_before_the_sleep_is_not_slept_through(self, waking, name):
        # The release comes between the waiter's attempt and its sleep, so
        # the waiter is not asleep when it is woken: the sleep must see the
        # free permit (MariaDB) or the datagram already sent (SQLite).
        one = permit(1)
        first = waking.acquire(name, 60, 0, one)
        digest, token = waking._kind_digest(name, one), "a" * 32
        args = _attempt_args(waking, name, token, one)
        queued, released, outcome = threading.Event(), threading.Event(), []

        def wait() -> None:
            outcome.append(waking._call("acquire", waking._attempt, *args)[0])
            queued.set()
            released.wait(30)
            if waking.dialect.vendor == "sqlite":
                waking._bells.wait(50)
            else:
                waking._call("wait", waking._doze, digest, token, 1, 50)
            outcome.append(waking._call("acquire", waking._attempt, *args)[0])

        thread = threading.Thread(target=wait)
        thread.start()
        assert queued.wait(30)
        assert waking.release(first)
        released.set()
        thread.join(30)
        assert not thread.is_alive(), "the waiter slept through the release"
        assert outcome[0] is None and outcome[1] is not None

    def test_a_waiter_behind_one_with_room_waits_to_be_rung(
        self, waking, name, monkeypatch
    ):
        # The permit is free but promised to the waiter ahead: the one behind
        # does not look again every few milliseconds, and the withdrawal of
        # the one ahead rings it.
        one = permit(1)
        holder = waking.acquire(name, 60, 0, one)
        digest, ahead = waking._kind_digest(name, one), "a" * 32
        args = _attempt_args(waking, name, ahead, one)
        assert waking._call("acquire", waking._attempt, *args)[0] is None
        assert waking.release(holder)  # rings the waiter ahead, nobody else
        attempts, attempt, got = [], waking._attempt, []

        def counted(cursor, *args):
            attempts.append(args[2])
            return attempt(cursor, *args)

        monkeypatch.setattr(waking, "_attempt", counted)
        waiter = threading.Thread(
            target=lambda: got.append(waking.acquire(name, 60, 120, one))
        )
        waiter.start()
        _wait_for(lambda: len(attempts) == 1)
        time.sleep(0.5)  # a waiter polling every 5 ms would try ~100 times
        waking._withdraw(digest, ahead)
        _join([waiter], 30)
        assert got and got[0] is not None, "the withdrawal did not ring it"
        assert len(attempts) <= 3
        assert waking.release(got[0])

    def test_no_wake_up_is_lost(self, waking, name):
        # Six threads take turns at two permits: a release that came while
        # a waiter was between its attempt and its sleep would leave it
        # asleep for a minute.
        two, done = permit(2), []

        def work() -> None:
            for _ in range(15):
                lease = waking.acquire(name, 60, 120, two)
                assert lease is not None
                time.sleep(0.002)  # long enough for the others to queue
                assert waking.release(lease)
            done.append(1)

        threads = [threading.Thread(target=work) for _ in range(6)]
        for thread in threads:
            thread.start()
        _join(threads, 40)
        assert len(done) == 6

    def test_a_waiter_that_has_gone_holds_nobody_up(self, waking, name):
        # Its place is left in the queue, but its bell is gone: on MariaDB
        # a user lock that went with its connection, on SQLite a socket that
        # went with its thread. The release passes it over.
        one = permit(1)
        first = waking.acquire(name, 60, 0, one)
        token = "f" * 32
        args = _attempt_args(waking, name, token, one)
        queue = threading.Thread(
            target=waking._call, args=("acquire", waking._attempt, *args)
        )
        queue.start()
        queue.join(30)
        gc.collect()  # the thread's bell closes with its thread-local data
        waking.close()  # and its connection, with the bell it holds
        place = _rows(waking, token=token, kind="queued").get()
        assert place.channel.startswith("distlock_wait_")
        assert waking.release(first)  # rings nobody
        if waking.dialect.vendor == "sqlite":  # passed over: the place goes
            assert not _rows(waking, token=token).exists()
        lease = waking.acquire(name, 60, 0, one)
        assert lease is not None, "the waiter that has gone held the permit up"
        assert waking.release(lease)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True, databases=["default", "postgres"])
class TestRowsReused:
    """PostgreSQL keeps a released row for the name's next holder (0007)."""

    @pytest.mark.parametrize("kind", [SHARED, permit(3)], ids=["shared", "permit"])
    def test_a_release_leaves_a_free_row_the_next_holder_takes(
        self, handing_pg, name, kind
    ):
        digest = handing_pg._kind_digest(name, kind)
        rows = _rows(handing_pg, digest=digest)
        first = handing_pg.acquire(name, 10, 0, kind)
        row = rows.get()
        assert handing_pg.release(first)
        assert rows.get().kind == "free" and rows.get().token == ""
        for _ in range(5):
            lease = handing_pg.acquire(name, 10, 0, kind)
            assert rows.get().id == row.id and rows.get().token == lease.token
            assert handing_pg.release(lease)
        assert list(handing_pg.holders(name)) == []
        two = [handing_pg.acquire(name, 10, 0, kind) for _ in range(2)]
        assert rows.count() == 2
        assert all(handing_pg.release(lease) for lease in two)
        assert handing_pg.clear_stale() == 0  # free rows are not leases
        assert not rows.exists()

    def test_a_reused_place_queues_behind_earlier_waiters(self, handing_pg, name):
        # A waiter's turn is the time it queued, not its row's id: a free row
        # (here a waiter's that gave up) may be older than the places behind
        # which it is taken.
        one = permit(1)
        digest = handing_pg._kind_digest(name, one)
        holder = handing_pg.acquire(name, 10, 0, one)
        gone, early, late = "f" * 32, "1" * 32, "2" * 32
        for token in (gone, early):
            assert _queue(handing_pg, name, token)[0] is None
        handing_pg._withdraw(digest, gone)
        assert _queue(handing_pg, name, late)[0] is None
        assert (
            _rows(handing_pg, token=late).get().id
            < _rows(handing_pg, token=early).get().id
        )
        assert handing_pg.release(holder)
        assert _rows(handing_pg, token=early).get().kind == "permit"
        assert _rows(handing_pg, token=late).get().kind == "queued"


# -- leases nobody holds ------------------------------------------------------


def test_lost_replies_and_cancelled_tasks_give_shares_back(backend, name):
    # What a lost reply's canceller and a cancelled task's undo do: drop
    # whatever the attempt's token holds (here a shared lease, a permit).
    shared = backend.acquire(name, 30, 0, SHARED)
    backend._cancel_in_doubt(shared.state, shared.token, 30)
    _wait_for(lambda: not backend.is_held(shared), 10)
    held = backend.acquire(name, 30, 0, permit(1))
    backend._give_back(held.state, held.token)
    assert not backend.is_held(held)
    assert backend.acquire(name, 10, 0) is not None  # the lock is free
    assert backend.acquire(name, 10, 0, permit(1)) is not None


def test_an_equal_exclusive_kind_takes_the_exclusive_path(backend, name):
    from django_distlock.backends.kinds import Kind

    lease = backend.acquire(name, 10, 0, Kind("exclusive"))
    assert lease is not None and lease.kind.exclusive
    assert backend.acquire(name, 10, 0) is None
    assert [h.kind for h in backend.holders(name)] == [EXCLUSIVE]
    assert backend.release(lease)


def test_a_name_waits_on_no_row_of_another_name(backend, name):
    # Another transaction holds the row locks of one name's holders; every
    # change to the holders of another name goes on meanwhile. A name with
    # most of the table's rows is where MariaDB's optimizer prefers a table
    # scan, which waits on every locked row: two releases of two names, each
    # waiting on the other's row, were a deadlock.
    if backend.database == "default":
        pytest.skip("SQLite locks the whole file, not rows")
    from django.db import transaction

    crowd = [backend.acquire(name + ":b", 30, 0, permit(9)) for _ in range(8)]
    held = [backend.acquire(name + ":a", 30, 0, kind) for kind in (SHARED, permit(2))]
    ids = list(
        _rows(backend, token__in=[h.token for h in held]).values_list("pk", flat=True)
    )
    assert len(ids) == 2
    done = threading.Event()
    errors = []

    def other_name() -> None:
        try:
            mine = backend.acquire(name + ":b", 30, 1, permit(9))
            assert backend.extend(mine, 30)
            assert backend.is_held(mine)
            for lease in (mine, *crowd):
                assert backend.release(lease)
            done.set()
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)
        finally:
            connections.close_all()

    with transaction.atomic(using=backend.database):
        rows = _rows(backend, pk__in=ids).select_for_update()
        assert len(list(rows)) == 2  # locked by primary key: those rows only
        worker = threading.Thread(target=other_name)
        worker.start()
        worker.join(30)
        finished = done.is_set()
    worker.join()
    assert errors == [] and finished, "waited on another name's rows"
    for lease in held:
        assert backend.release(lease)


@pytest.mark.parametrize("mode", ["exclusive", "shared", "permit"])
def test_first_holders_of_a_new_name_arrive_at_once(backend, name, mode):
    # Eight processes take the first lease of names nobody used before, at
    # the same instant: one of them creates the name's row while the others
    # wait, never a deadlock (on InnoDB, locking the row in the transaction
    # that met it as a duplicate key would be one).
    if backend.database == "default":
        pytest.skip("SQLite has one writer at a time")
    names = [f"{name}:{i}" for i in range(12)]
    start_at = time.monotonic() + 3.0
    results = run_in_processes(
        kinds_workers.first_holders, [(names, mode, start_at)] * 8, timeout=120
    )
    assert [e for errors in results for e in errors] == []


# -- listing ------------------------------------------------------------------


def test_listing_kinds(backend, name):
    shared = [backend.acquire(name + ":r", 30, 0, SHARED) for _ in range(2)]
    sem = [backend.acquire(name + ":s", 30, 0, permit(3)) for _ in range(2)]
    backend.extend(sem[1], 10)
    writer = backend.acquire(name + ":w", 30, 0)
    listed = {h.token: h for h in backend.holders(name)}
    assert set(listed) == {x.token for x in (*shared, *sem, writer)}
    for lease in shared:
        holder = listed[lease.token]
        assert holder.kind == SHARED and holder.name == name + ":r"
        assert holder.fencing_token == lease.fencing_token
        assert holder.pid == os.getpid()
    for lease in sem:
        holder = listed[lease.token]
        assert holder.kind == permit(3) and holder.name == name + ":s"
        assert holder.as_dict()["limit"] == 3
    assert listed[writer.token].kind == EXCLUSIVE
    assert backend.holder_of(name + ":s", permit(3)).token == sem[1].token
    assert backend.holder_of(name + ":r", SHARED) is None
    assert backend.holder_of(name + ":r").kind == SHARED
    assert backend.holder_of(name + ":w", SHARED).token == writer.token
    assert backend.holder_of(name + ":w", permit(3)) is None
    assert [h.name for h in backend.holders(name + ":s")] == [name + ":s"] * 2


# -- asyncio ------------------------------------------------------------------


def test_async_twins(backend, name):
    async def scenario():
        a = await backend.aacquire(name, 10, 0, SHARED)
        b = await backend.aacquire(name, 10, 0, SHARED)
        assert a is not None and b is not None
        assert await backend.aacquire(name, 10, 0) is None
        assert await backend.aextend(a, 20)
        assert await backend.ais_held(b)
        assert await backend.arenew([a, b]) == [True, True]
        assert await backend.aholder_of(name) is not None
        assert await backend.arelease(b)
        waiter = asyncio.ensure_future(backend.aacquire(name, 10, 10))
        await asyncio.sleep(0.2)
        assert not waiter.done()
        assert await backend.arelease(a)
        writer = await waiter
        assert writer is not None and writer.fencing_token >= a.fencing_token
        assert await backend.arelease(writer)
        one = permit(1)
        p = await backend.aacquire(name, 10, 0, one)
        assert await backend.aacquire(name, 10, 0, one) is None
        with pytest.raises(ValueError):
            await backend.aacquire(name, 10, 0, permit(2))
        queued = asyncio.ensure_future(backend.aacquire(name, 10, 10, one))
        await asyncio.sleep(0.2)
        assert await backend.arelease(p)
        q = await queued
        assert q is not None and q.kind == one
        assert await backend.arelease(q)

    asyncio.run(scenario())


def test_async_cancelled_waiter_gives_back(backend, name):
    async def scenario():
        one = permit(1)
        p = await backend.aacquire(name, 10, 0, one)
        waiter = asyncio.ensure_future(backend.aacquire(name, 10, 10, one))
        await asyncio.sleep(0.3)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert await backend.arelease(p)

    asyncio.run(scenario())
    # Whatever the cancelled waiter obtained was given back.
    _wait_for(lambda: backend.acquire(name, 10, 0, permit(1)) is not None, 10)


@pytest.mark.parametrize("kind", [permit(1), EXCLUSIVE], ids=["permit", "exclusive"])
def test_async_waiters_leave_the_default_executor_to_releases(backend, name, kind):
    # More waiting tasks than the event loop's default executor has threads:
    # a wait that blocked one of them until a release woke it would hold up
    # the holder's arelease, which runs there, until the waits time out.
    from concurrent.futures import ThreadPoolExecutor

    async def cycle() -> None:
        for _ in range(2):
            lease = await backend.aacquire(name, 10, 60, kind)
            assert lease is not None
            await asyncio.sleep(0.005)
            assert await backend.arelease(lease)

    async def scenario() -> None:
        asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(2))
        await asyncio.wait_for(asyncio.gather(*(cycle() for _ in range(6))), 30)

    asyncio.run(scenario())


# -- processes ----------------------------------------------------------------


def _max_overlap(intervals) -> int:
    starts = [(start, 1) for start, *_ in intervals]
    events = sorted(starts + [(end, -1) for _, end, *_ in intervals])
    inside = most = 0
    for _, step in events:
        inside += step
        most = max(most, inside)
    return most


class TestProcesses:
    def test_readers_overlap_writers_alone(self, backend, name, tmp_path):
        modes = ["exclusive"] * 2 + ["shared"] * 6
        results = run_in_processes(
            kinds_workers.kind_worker,
            [(name, mode, None, 6, 0.05, str(tmp_path), 8) for mode in modes],
            timeout=180,
        )
        intervals = [iv for r in results for iv in r]
        assert len(intervals) == 48
        writers = [iv for iv in intervals if iv[3] == "exclusive"]
        readers = [iv for iv in intervals if iv[3] == "shared"]
        for w in writers:
            for other in intervals:
                if other is w:
                    continue
                assert other[1] <= w[0] or other[0] >= w[1], (w, other)
        assert _max_overlap(readers) >= 2  # readers were in together

    def test_semaphore_of_three(self, backend, name, tmp_path):
        results = run_in_processes(
            kinds_workers.kind_worker,
            [(name, "permit", 3, 5, 0.05, str(tmp_path), 8) for _ in range(8)],
            timeout=180,
        )
        intervals = [iv for r in results for iv in r]
        assert len(intervals) == 40
        assert 2 <= _max_overlap(intervals) <= 3

    def test_killed_holders_permit_comes_back(self, backend, name, tmp_path):
        ready = tmp_path / "ready"
        proc = start_process(
            kinds_workers.hold_permit_forever, name, 1, 3.0, str(ready)
        )
        try:
            _wait_for(ready.exists, 60)
            assert backend.acquire(name, 10, 0, permit(1)) is None
            os.kill(proc.pid, signal.SIGKILL)
            proc.join(10)
            killed = time.monotonic()
            lease = backend.acquire(name, 10, 30, permit(1))
            assert lease is not None and lease.token != ready.read_text()
            assert time.monotonic() - killed < 10
        finally:
            if proc.is_alive():
                os.kill(proc.pid, signal.SIGKILL)

    def test_killed_permit_waiter_is_passed_over(self, backend, name):
        # A waiter killed while it waits is passed over: a release that
        # hands permits over does not hand it one (it would be lost for the
        # waiter's TTL, 60 s), and its place holds up nobody behind it.
        held = backend.acquire(name, 60, 0, permit(1))
        digest = backend._kind_digest(name, permit(1))
        proc = start_process(kinds_workers.wait_permit, name, 1, 60.0)
        try:
            _wait_for(lambda: _rows(backend, digest=digest, kind="queued").exists())
            (place,) = _rows(backend, digest=digest, kind="queued")
            os.kill(proc.pid, signal.SIGKILL)
            proc.join(10)
        finally:
            if proc.is_alive():
                os.kill(proc.pid, signal.SIGKILL)
        # The server drops the lock the waiter's connection held once it
        # sees the connection closed (SQLite: the bell went with the process).
        _wait_for(lambda: _waiter_gone(backend, place.channel))
        assert backend.release(held)
        lease = backend.acquire(name, 10, 0, permit(1))
        assert lease is not None
        assert not _rows(backend, token=place.token, kind="permit").exists()
        assert backend.release(lease)

    def test_killed_writer_waiter_does_not_block_readers(self, backend, name, tmp_path):
        reader = backend.acquire(name, 60, 0, SHARED)
        ready = tmp_path / "ready"
        proc = start_process(kinds_workers.wait_exclusive, name, str(ready))
        try:
            _wait_for(lambda: _rows(backend, kind="writer").exists(), 60)
            assert backend.acquire(name, 10, 0, SHARED) is None
            os.kill(proc.pid, signal.SIGKILL)
            proc.join(10)
            second = backend.acquire(name, 10, 10, SHARED)
            assert second is not None
            assert backend.release(second)
        finally:
            if proc.is_alive():
                os.kill(proc.pid, signal.SIGKILL)
        assert backend.release(reader)


# -- before migration 0003 ----------------------------------------------------


@pytest.mark.parametrize(
    "alias",
    [
        pytest.param(
            "postgres",
            marks=[
                pytest.mark.postgres,
                pytest.mark.django_db(
                    transaction=True, databases=["default", "postgres"]
                ),
            ],
        ),
        pytest.param(
            "mysql",
            marks=[
                pytest.mark.mysql,
                pytest.mark.django_db(transaction=True, databases=["default", "mysql"]),
            ],
        ),
    ],
)
def test_exclusive_locks_before_the_share_table(request, alias, name):
    # A project that upgraded but has not run migrate yet: exclusive locks,
    # their listing and clear_stale go on working.
    from django.core.management import call_command

    request.getfixturevalue(f"{alias}_available")
    setting = {"default": {"BACKEND": BACKEND, "OPTIONS": {"DATABASE": alias}}}
    call_command("migrate", "django_distlock", "0002", database=alias, verbosity=0)
    try:
        with override_settings(LOCKS=setting):
            backend = locks["default"]
            held = backend.acquire(name, 10, 0)
            assert [h.token for h in backend.holders(name)] == [held.token]
            assert backend.clear_stale() == 0
            assert backend.release(held)
    finally:
        locks.reset()
        call_command("migrate", "django_distlock", database=alias, verbosity=0)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True, databases=["default", "postgres"])
def test_postgres_shares_need_migration_0004(request, name):
    # On PostgreSQL shared leases and permits are taken by the function that
    # migration 0004 installs: without it, a clear error that says so, and
    # exclusive locks go on working.
    from django.core.management import call_command

    request.getfixturevalue("postgres_available")
    setting = {"default": {"BACKEND": BACKEND, "OPTIONS": {"DATABASE": "postgres"}}}
    call_command("migrate", "django_distlock", "0003", database="postgres", verbosity=0)
    try:
        with override_settings(LOCKS=setting):
            backend = locks["default"]
            with pytest.raises(LockBackendError, match="manage.py migrate"):
                backend.acquire(name, 10, 0, SHARED)
            with pytest.raises(LockBackendError, match="manage.py migrate"):
                backend.acquire(name, 10, 0, permit(3))
            held = backend.acquire(name, 10, 0)
            assert backend.release(held)
    finally:
        locks.reset()
        call_command("migrate", "django_distlock", database="postgres", verbosity=0)
    with override_settings(LOCKS=setting):
        backend = locks["default"]
        reader = backend.acquire(name, 10, 0, SHARED)
        assert reader is not None and backend.release(reader)
    locks.reset()
