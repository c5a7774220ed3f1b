"""Fencing tokens enforced by the ORM (FencedModel, FencedQuerySet).

Three parts: the semantics of fenced writes, in one process, on each database
(SQLite, PostgreSQL, MariaDB); the pause test across real processes on every
lock backend; and a hypothesis property test of random interleavings.
"""

from __future__ import annotations

import asyncio
import importlib
import itertools
import os
import signal
import uuid
from contextlib import nullcontext

import pytest
from asgiref.sync import sync_to_async
from django.core.exceptions import ImproperlyConfigured
from django.db import IntegrityError, connections, transaction
from django.db.models.signals import post_save, pre_save
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import django_distlock.models
from django_distlock import lock, lock_for, locks
from django_distlock.exceptions import LockLost, LockNotHeld, StaleFencingToken
from tests.conftest import redis_locks
from tests.procs import context, start_process
from tests.servers import RedisServer
from tests.testapp.models import (
    Account,
    FencedListing,
    FencedSetting,
    Product,
    SavingsAccount,
)

from .fencing_workers import stale_writer

ALL_DBS = ["default", "postgres", "mysql"]
_names = itertools.count()


def unique(prefix: str = "fence") -> str:
    return f"{prefix}:{uuid.uuid4().hex}:{next(_names)}"


def db_param(alias: str):
    """A database alias as a test parameter, with the django_db mark it needs."""
    dbs = ["default"] if alias == "default" else ["default", alias]
    return pytest.param(
        alias,
        id=alias,
        marks=[pytest.mark.django_db(transaction=True, databases=dbs)],
    )


DB_PARAMS = [db_param(a) for a in ALL_DBS]


@pytest.fixture
def db_alias(request):
    """The database the rows live in; skips (fails in CI) if its server is down."""
    alias = request.param
    if alias == "postgres":
        request.getfixturevalue("postgres_available")
    elif alias == "mysql":
        request.getfixturevalue("mysql_available")
    return alias


_taken: list = []


@pytest.fixture(autouse=True)
def _release_leftovers():
    """Release whatever a test left held (the locmem table outlives tests)."""
    yield
    while _taken:
        handle = _taken.pop()
        while handle.lease is not None:
            try:
                handle.release()
            except LockNotHeld:
                if handle._leases:  # refused before popping (another pid)
                    handle._leases.pop()


def takeover(old, **options):
    """Let ``old``'s lease lapse behind its back and take the lock anew.

    ``old`` keeps believing it holds the lock, like a paused process.
    """
    lease = old.lease
    assert locks[old.using].force_release(lease.name, lease.token)
    new = lock(old.name, using=old.using, timeout=0, auto_renew=False, **options)
    assert new.acquire()
    _taken.append(new)
    assert new.fencing_token > old.fencing_token
    return new


def held(name=None, **options):
    handle = lock(name or unique(), timeout=0, auto_renew=False, **options)
    assert handle.acquire()
    _taken.append(handle)
    return handle


# ---------------------------------------------------------------------------
# Semantics, one process, every database (locks: the locmem backend)
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("db_alias", DB_PARAMS, indirect=True)
class TestFencedSave:
    def test_save_stores_token_and_same_holder_saves_again(self, db_alias):
        acc = Account.objects.using(db_alias).create(owner="x")
        assert acc.fencing_token == 0
        h = held(lock_name_for_row(acc))
        acc.balance = 5
        acc.save(fence=h)
        assert acc.fencing_token == h.fencing_token
        acc.balance = 6
        acc.save(fence=h)
        acc.save(fence=h.lease)  # a Lease works as well as the handle
        row = Account.objects.using(db_alias).get(pk=acc.pk)
        assert (row.balance, row.fencing_token) == (6, h.fencing_token)

    def test_statements(self, db_alias):
        acc = Account.objects.using(db_alias).create(owner="x")
        h = held()
        with CaptureQueriesContext(connections[db_alias]) as ctx:
            acc.save(fence=h)
        writes = [
            q["sql"]
            for q in ctx.captured_queries
            if q["sql"].startswith(("UPDATE", "INSERT"))
        ]
        # The claim (conditional, locks the row), then Django's own UPDATE,
        # which leaves the token the claim wrote.
        assert len(writes) == 2, writes
        assert all(w.startswith("UPDATE") for w in writes), writes
        assert "fencing_token" in writes[0].split("WHERE")[1]
        with CaptureQueriesContext(connections[db_alias]) as ctx:
            Account(owner="y").save(using=db_alias, fence=h)
        writes = [
            q["sql"]
            for q in ctx.captured_queries
            if q["sql"].startswith(("UPDATE", "INSERT"))
        ]
        assert len(writes) == 1 and writes[0].startswith("INSERT"), writes

    def test_older_holder_is_refused_and_writes_nothing(self, db_alias):
        acc = Account.objects.using(db_alias).create(owner="x")
        old = held()
        stale_copy = Account.objects.using(db_alias).get(pk=acc.pk)
        new = takeover(old)
        acc.owner = "new"
        acc.save(fence=new)
        stale_copy.owner = "old"
        with pytest.raises(StaleFencingToken) as info:
            stale_copy.save(fence=old)
        assert info.value.name == old.name
        assert info.value.stored_token == new.fencing_token
        assert stale_copy.fencing_token == 0  # the in-memory token is restored
        row = Account.objects.using(db_alias).get(pk=acc.pk)
        assert (row.owner, row.fencing_token) == ("new", new.fencing_token)

    def test_older_holder_may_write_until_a_newer_one_does(self, db_alias):
        acc = Account.objects.using(db_alias).create(owner="x")
        old = held()
        new = takeover(old)
        acc.owner = "old"
        acc.save(fence=old)  # the newer holder has not written yet
        acc.owner = "new"
        acc.save(fence=new)
        acc.owner = "old again"
        with pytest.raises(StaleFencingToken):
            acc.save(fence=old)

    def test_unfenced_save_leaves_the_token_alone(self, db_alias):
        acc = Account.objects.using(db_alias).create(owner="x")
        h = held()
        copy = Account.objects.using(db_alias).get(pk=acc.pk)  # token 0 in memory
        acc.save(fence=h)
        copy.owner = "plain"
        copy.save()
        copy.save(update_fields=["owner"])
        row = Account.objects.using(db_alias).get(pk=acc.pk)
        assert (row.owner, row.fencing_token) == ("plain", h.fencing_token)

    def test_update_fields(self, db_alias):
        acc = Account.objects.using(db_alias).create(owner="x", balance=1)
        h = held()
        acc.owner = "not saved"
        acc.balance = 2
        acc.save(fence=h, update_fields=["balance"])
        row = Account.objects.using(db_alias).get(pk=acc.pk)
        assert (row.owner, row.balance) == ("x", 2)
        assert row.fencing_token == h.fencing_token
        acc.save(fence=h, update_fields=[])  # Django's no-op

    def test_create_under_a_fence(self, db_alias):
        h = held()
        acc = Account(owner="new")
        acc.save(using=db_alias, fence=h)
        row = Account.objects.using(db_alias).get(pk=acc.pk)
        assert row.fencing_token == h.fencing_token

    def test_create_with_chosen_pk(self, db_alias):
        key = unique("k")
        old = held()
        new = takeover(old)
        FencedSetting(key=key, value="new").save(using=db_alias, fence=new)
        # A late creation by an older holder finds the newer row: refused.
        with pytest.raises(StaleFencingToken):
            FencedSetting(key=key, value="old").save(using=db_alias, fence=old)
        newest = takeover(new)
        FencedSetting(key=key, value="newest").save(using=db_alias, fence=newest)
        row = FencedSetting.objects.using(db_alias).get(key=key)
        assert (row.value, row.fencing_token) == ("newest", newest.fencing_token)

    @pytest.mark.parametrize("in_atomic", [False, True], ids=["autocommit", "atomic"])
    @pytest.mark.parametrize("racer_is_newer", [True, False], ids=["newer", "older"])
    def test_create_race_with_chosen_pk(
        self, db_alias, monkeypatch, in_atomic, racer_is_newer
    ):
        # Another holder creates the row between our claim (no row yet) and
        # our INSERT: the INSERT fails on the key and becomes a fenced claim.
        key = unique("k")
        old = held()
        new = takeover(old)
        ours, theirs = (old, new) if racer_is_newer else (new, old)
        real_claim_row = django_distlock.models.claim_row

        def racing_claim_row(*args, **kwargs):
            result = real_claim_row(*args, **kwargs)
            if not result:  # no row: the INSERT comes next; the racer is first
                FencedSetting.objects.using(db_alias).create(
                    key=key, value="theirs", fencing_token=theirs.fencing_token
                )
            return result

        monkeypatch.setattr(django_distlock.models, "claim_row", racing_claim_row)
        with transaction.atomic(using=db_alias) if in_atomic else nullcontext():
            mine = FencedSetting(key=key, value="ours")
            if racer_is_newer:
                with pytest.raises(StaleFencingToken):
                    mine.save(using=db_alias, fence=ours)
            else:
                mine.save(using=db_alias, fence=ours)
            # The transaction is still usable either way.
            assert FencedSetting.objects.using(db_alias).filter(key=key).exists()
        row = FencedSetting.objects.using(db_alias).get(key=key)
        winner = theirs if racer_is_newer else ours
        assert row.value == ("theirs" if racer_is_newer else "ours")
        assert row.fencing_token == winner.fencing_token

    def test_force_insert_is_respected(self, db_alias):
        key = unique("k")
        h = held()
        FencedSetting(key=key).save(using=db_alias, fence=h)
        with pytest.raises(IntegrityError):
            with transaction.atomic(using=db_alias):
                FencedSetting(key=key, value="x").save(
                    using=db_alias, fence=h, force_insert=True
                )
        assert FencedSetting.objects.using(db_alias).get(key=key).value == ""

    def test_deleted_row_is_not_recreated(self, db_alias):
        acc = Account.objects.using(db_alias).create(owner="x")
        h = held()
        Account.objects.using(db_alias).filter(pk=acc.pk).delete()
        with pytest.raises(StaleFencingToken, match="deleted"):
            acc.save(fence=h)
        assert not Account.objects.using(db_alias).filter(pk=acc.pk).exists()

    def test_signals(self, db_alias):
        acc = Account.objects.using(db_alias).create(owner="x")
        old = held()
        new = takeover(old)
        seen = []

        def pre(sender, instance, **kw):
            seen.append(("pre", kw["update_fields"]))

        def post(sender, instance, created, **kw):
            seen.append(("post", created, kw["update_fields"]))

        pre_save.connect(pre, sender=Account)
        post_save.connect(post, sender=Account)
        try:
            acc.save(fence=new, update_fields=["owner"])
            with pytest.raises(StaleFencingToken):
                acc.save(fence=old)
        finally:
            pre_save.disconnect(pre, sender=Account)
            post_save.disconnect(post, sender=Account)
        fields = frozenset({"owner", "fencing_token"})
        # The refused save wrote nothing and sent nothing.
        assert seen == [("pre", fields), ("post", False, fields)]

    def test_refusal_inside_atomic_keeps_the_transaction_usable(self, db_alias):
        acc = Account.objects.using(db_alias).create(owner="x")
        old = held()
        new = takeover(old)
        acc.save(fence=new)
        with transaction.atomic(using=db_alias):
            with pytest.raises(StaleFencingToken):
                acc.save(fence=old)
            Account.objects.using(db_alias).create(owner="after")
        assert Account.objects.using(db_alias).filter(owner="after").exists()

    def test_multi_table_child_of_fenced_model(self, db_alias):
        sav = SavingsAccount.objects.using(db_alias).create(owner="x", rate=1)
        old = held()
        new = takeover(old)
        stale_copy = SavingsAccount.objects.using(db_alias).get(pk=sav.pk)
        sav.rate = 2
        sav.save(fence=new)
        stale_copy.owner = "old"
        stale_copy.rate = 3
        with pytest.raises(StaleFencingToken):
            stale_copy.save(fence=old)
        row = SavingsAccount.objects.using(db_alias).get(pk=sav.pk)
        assert (row.owner, row.rate, row.fencing_token) == ("x", 2, new.fencing_token)

    def test_multi_table_token_in_child_table_rolls_parent_back(self, db_alias):
        item = FencedListing.objects.using(db_alias).create(sku=unique("s")[:30])
        old = held()
        new = takeover(old)
        stale_copy = FencedListing.objects.using(db_alias).get(pk=item.pk)
        item.price = 2
        item.save(fence=new)
        stale_copy.stock = 99  # parent table
        stale_copy.price = 3  # child table, where the token is
        with transaction.atomic(using=db_alias):
            with pytest.raises(StaleFencingToken):
                stale_copy.save(fence=old)
        row = FencedListing.objects.using(db_alias).get(pk=item.pk)
        assert (row.stock, row.price) == (0, 2)
        assert Product.objects.using(db_alias).get(pk=item.pk).stock == 0

    def test_instance_delete(self, db_alias):
        a = Account.objects.using(db_alias).create(owner="a")
        b = Account.objects.using(db_alias).create(owner="b")
        old = held()
        new = takeover(old)
        a.save(fence=new)
        with pytest.raises(StaleFencingToken):
            a.delete(fence=old)
        assert Account.objects.using(db_alias).filter(pk=a.pk).exists()
        assert a.delete(fence=new)[0] == 1
        b_copy = Account.objects.using(db_alias).get(pk=b.pk)
        assert b.delete(fence=old)[0] == 1  # no newer write on b
        with pytest.raises(StaleFencingToken, match="deleted"):
            b_copy.delete(fence=new)


def lock_name_for_row(instance) -> str:
    return lock_for(instance).name


@pytest.mark.parametrize("db_alias", DB_PARAMS, indirect=True)
class TestFencedQuerySet:
    def test_update_stamps_rows(self, db_alias):
        objs = Account.objects.using(db_alias)
        pks = [objs.create(owner=f"o{i}").pk for i in range(3)]
        h = held()
        assert objs.filter(pk__in=pks).fenced(h).update(balance=7) == 3
        assert set(objs.filter(pk__in=pks).values_list("balance", "fencing_token")) == {
            (7, h.fencing_token)
        }

    def test_update_is_all_or_nothing(self, db_alias):
        objs = Account.objects.using(db_alias)
        pks = [objs.create(owner=f"o{i}").pk for i in range(3)]
        old = held()
        new = takeover(old)
        objs.filter(pk=pks[1]).fenced(new).update(balance=1)
        with pytest.raises(StaleFencingToken):
            objs.filter(pk__in=pks).fenced(old).update(balance=2)
        assert sorted(objs.filter(pk__in=pks).values_list("balance", flat=True)) == [
            0,
            0,
            1,
        ]
        # Inside a transaction the refusal rolls back to a savepoint only.
        with transaction.atomic(using=db_alias):
            with pytest.raises(StaleFencingToken):
                objs.filter(pk__in=pks).fenced(old).update(balance=2)
            objs.filter(pk=pks[0]).update(owner="kept")
        assert objs.get(pk=pks[0]).owner == "kept"
        with pytest.raises(TypeError):
            objs.fenced(new).update(fencing_token=1)

    def test_unfenced_update_and_chaining(self, db_alias):
        objs = Account.objects.using(db_alias)
        acc = objs.create(owner="x")
        h = held()
        qs = objs.fenced(h).filter(owner="x")  # the fence survives chaining
        assert qs.update(balance=3) == 1
        assert objs.filter(pk=acc.pk).update(balance=4) == 1
        row = objs.get(pk=acc.pk)
        assert (row.balance, row.fencing_token) == (4, h.fencing_token)

    def test_delete(self, db_alias):
        objs = Account.objects.using(db_alias)
        pks = [objs.create(owner=f"o{i}").pk for i in range(3)]
        old = held()
        new = takeover(old)
        objs.filter(pk=pks[2]).fenced(new).update(balance=1)
        with pytest.raises(StaleFencingToken):
            objs.filter(pk__in=pks).fenced(old).delete()
        assert objs.filter(pk__in=pks).count() == 3
        deleted, per_model = objs.filter(pk__in=pks).fenced(new).delete()
        assert deleted == 3
        assert per_model == {"testapp.Account": 3}

    def test_update_of_multi_table_child(self, db_alias):
        # The token is in the parent table, the updated field in the child's.
        objs = SavingsAccount.objects.using(db_alias)
        pks = [objs.create(owner=f"s{i}").pk for i in range(2)]
        old = held()
        new = takeover(old)
        assert objs.filter(pk=pks[0]).fenced(new).update(rate=1) == 1
        with pytest.raises(StaleFencingToken):
            objs.filter(pk__in=pks).fenced(old).update(rate=2)
        assert objs.filter(pk__in=pks).fenced(new).update(rate=3) == 2
        got = sorted(objs.filter(pk__in=pks).values_list("rate", "fencing_token"))
        assert got == [(3, new.fencing_token)] * 2

    def test_delete_cascades_to_multi_table_children(self, db_alias):
        sav = SavingsAccount.objects.using(db_alias).create(owner="s")
        h = held()
        qs = Account.objects.using(db_alias).filter(pk=sav.pk)
        deleted, _ = qs.fenced(h).delete()
        assert deleted == 2
        assert not SavingsAccount.objects.using(db_alias).exists()


@pytest.mark.django_db(transaction=True)
class TestGuards:
    def test_unheld_released_and_lost_locks_are_refused(self):
        acc = Account.objects.create(owner="x")
        handle = lock(unique(), timeout=0, auto_renew=False)
        with pytest.raises(LockNotHeld):
            acc.save(fence=handle)
        with pytest.raises(LockNotHeld):
            Account.objects.fenced(handle)
        assert handle.acquire()
        lease = handle.lease
        handle.release()
        with pytest.raises(LockNotHeld):
            acc.save(fence=handle)
        assert handle.acquire()
        handle.lease.lost = True  # what the watchdog does when renewal fails
        with pytest.raises(LockLost):
            acc.save(fence=handle)
        lease.lost = True
        with pytest.raises(LockLost):
            acc.delete(fence=lease)
        assert Account.objects.get(pk=acc.pk).fencing_token == 0

    def test_lease_of_another_process_is_refused(self):
        acc = Account.objects.create(owner="x")
        h = held()
        h.lease.pid = os.getpid() + 1  # as seen in a forked child
        with pytest.raises(LockNotHeld):
            acc.save(fence=h)
        h.lease.pid = os.getpid()

    def test_wrong_type(self):
        acc = Account.objects.create(owner="x")
        with pytest.raises(TypeError):
            acc.save(fence=42)

    def test_backend_without_durable_tokens_is_refused(self):
        acc = Account.objects.create(owner="x")
        entry = {"BACKEND": "tests.fencing_workers.NonDurableLocMemBackend"}
        with override_settings(LOCKS={"default": entry}):
            h = held()
            with pytest.raises(ImproperlyConfigured, match="not durable"):
                acc.save(fence=h)
            with pytest.raises(ImproperlyConfigured):
                Account.objects.fenced(h).update(balance=1)
            h.release()

    def test_async_twins(self):
        acc = Account.objects.create(owner="x")
        old = held()
        new = takeover(old)

        async def scenario():
            acc.owner = "async"
            await acc.asave(fence=new)
            with pytest.raises(StaleFencingToken):
                await acc.asave(fence=old)
            qs = Account.objects.filter(pk=acc.pk)
            assert await qs.fenced(new).aupdate(balance=9) == 1
            with pytest.raises(StaleFencingToken):
                await qs.fenced(old).adelete()
            try:
                return await acc.adelete(fence=new)
            finally:
                # The ORM ran in asgiref's worker thread: close its connections
                # (an open one would keep the test database from being dropped).
                await sync_to_async(connections.close_all)()

        assert asyncio.run(scenario())[0] == 1


# ---------------------------------------------------------------------------
# The pause test: real processes, every backend
# ---------------------------------------------------------------------------

BACKEND_MODULES = {
    "redis": "django_distlock.backends.redis",
    "reentrant": "django_distlock.backends.redis",
    "redlock": "django_distlock.backends.redlock",
    "database": "django_distlock.backends.database",
    "zookeeper": "django_distlock.backends.zookeeper",
}
BACKEND_CLASSES = {
    "redis": "RedisLockBackend",
    "reentrant": "ReentrantRedisLockBackend",
    "redlock": "RedlockBackend",
    "database": "DatabaseLockBackend",
    "zookeeper": "ZooKeeperLockBackend",
}


def backend_param(backend: str, rows_db: str = "default"):
    dbs = ["default"] if rows_db == "default" else ["default", rows_db]
    return pytest.param(
        (backend, rows_db),
        id=f"{backend}-{rows_db}",
        marks=[pytest.mark.django_db(transaction=True, databases=dbs)],
    )


PAUSE_BACKENDS = [
    backend_param("redis"),
    backend_param("reentrant"),
    backend_param("redlock"),
    backend_param("database", "default"),
    backend_param("database", "postgres"),
    backend_param("database", "mysql"),
    backend_param("zookeeper"),
]


@pytest.fixture(scope="session")
def redlock_servers():
    """Three redis-servers of their own for Redlock (started on first use)."""
    servers = [RedisServer().start() for _ in range(3)]
    yield servers
    for server in servers:
        server.stop()


@pytest.fixture(scope="session")
def zookeeper_server():
    """A single-node ZooKeeper of its own (started on first use)."""
    from .cluster_servers import ZooKeeperServer

    server = ZooKeeperServer().start()
    yield server
    server.stop()


def backend_locks(request, backend: str, rows_db: str) -> dict:
    """Return the LOCKS setting for ``backend``; a backend that fails to import
    fails the test (every backend has landed: no skipping)."""
    module = importlib.import_module(BACKEND_MODULES[backend])
    assert hasattr(module, BACKEND_CLASSES[backend])
    path = f"{BACKEND_MODULES[backend]}.{BACKEND_CLASSES[backend]}"
    if rows_db == "postgres":
        request.getfixturevalue("postgres_available")
    elif rows_db == "mysql":
        request.getfixturevalue("mysql_available")
    if backend in ("redis", "reentrant"):
        return redis_locks(request.getfixturevalue("redis_url"), BACKEND=path)
    if backend == "redlock":
        servers = request.getfixturevalue("redlock_servers")
        for server in servers:
            server.client().flushall()
        location = [server.url for server in servers]
        return {"default": {"BACKEND": path, "LOCATION": location}}
    if backend == "zookeeper":
        server = request.getfixturevalue("zookeeper_server")
        # A session long enough that only the paused worker's lock lapses
        # (through its TTL), not the sessions of the processes still running.
        options = {"SESSION_TIMEOUT": 10}
        return {
            "default": {"BACKEND": path, "LOCATION": server.hosts, "OPTIONS": options}
        }
    return {"default": {"BACKEND": path, "OPTIONS": {"DATABASE": rows_db}}}


@pytest.fixture
def pause_backend(request):
    """Point LOCKS at the backend under test; return the rows' database alias."""
    backend, rows_db = request.param
    with override_settings(LOCKS=backend_locks(request, backend, rows_db)):
        yield rows_db


TTL = 0.5


def run_paused_writer(op, db, pks, name, newer_write, *, auto_renew=False):
    """The pause scenario; return ``(a_token, b_token, a_outcome, a_release)``.

    A worker process takes ``name`` with a short TTL and loads the rows; it is
    stopped (SIGSTOP) past the TTL; this process takes the lock over and
    calls ``newer_write(held)``; then the worker is resumed (SIGCONT) and makes
    its write ``op`` with its lapsed lease.
    """
    ctx = context()
    out, go = ctx.Queue(), ctx.Queue()
    proc = start_process(stale_writer, op, db, pks, name, TTL, auto_renew, out, go)
    stopped = False
    try:
        state, a_token, pid = out.get(timeout=120)
        assert state == "held", state
        os.kill(proc.pid, signal.SIGSTOP)
        stopped = True
        # The worker cannot renew now; its lease lapses after TTL and this
        # process gets the lock (waiting for it as long as needed).
        with lock(name, ttl=30, timeout=60, auto_renew=False) as b:
            b_token = b.fencing_token
            assert b_token > a_token
            newer_write(b)
            go.put("go")
            os.kill(proc.pid, signal.SIGCONT)
            stopped = False
            a_outcome, a_release = out.get(timeout=120)
        return a_token, b_token, a_outcome, a_release
    finally:
        go.put("go")
        if stopped:
            os.kill(proc.pid, signal.SIGCONT)
        proc.join(30)
        if proc.is_alive():
            proc.kill()
            proc.join()


@pytest.mark.parametrize("pause_backend", PAUSE_BACKENDS, indirect=True)
class TestPause:
    def test_save(self, pause_backend):
        db = pause_backend
        row = Account.objects.using(db).create(owner="before", balance=1)

        def newer_write(b):
            fresh = Account.objects.using(db).get(pk=row.pk)
            fresh.owner, fresh.balance = "B", 2
            fresh.save(fence=b)

        a, b, outcome, released = run_paused_writer(
            "save", db, [row.pk], lock_for(row).name, newer_write
        )
        assert outcome == "stale"
        assert released in ("LockLost", "LockNotHeld")
        got = Account.objects.using(db).get(pk=row.pk)
        assert (got.owner, got.balance, got.fencing_token) == ("B", 2, b)

    def test_save_with_auto_renew(self, pause_backend):
        # The worker's renewal thread is stopped too; when it resumes it may
        # learn of the loss before the write (LockLost) or not (the fence
        # refuses it). Either way the newer data stays.
        db = pause_backend
        row = Account.objects.using(db).create(owner="before")

        def newer_write(b):
            fresh = Account.objects.using(db).get(pk=row.pk)
            fresh.owner = "B"
            fresh.save(fence=b)

        a, b, outcome, released = run_paused_writer(
            "save", db, [row.pk], lock_for(row).name, newer_write, auto_renew=True
        )
        assert outcome in ("stale", "lost")
        got = Account.objects.using(db).get(pk=row.pk)
        assert (got.owner, got.fencing_token) == ("B", b)

    @pytest.mark.parametrize("op", ["update", "qs_delete"])
    def test_queryset_write(self, pause_backend, op):
        # One lock guards a group of rows; the newer holder wrote one of them.
        db = pause_backend
        objs = Account.objects.using(db)
        pks = [objs.create(owner=f"r{i}").pk for i in range(3)]

        def newer_write(b):
            assert objs.filter(pk=pks[1]).fenced(b).update(owner="B") == 1

        a, b, outcome, released = run_paused_writer(
            op, db, pks, unique("accounts:group"), newer_write
        )
        assert outcome == "stale"
        got = list(objs.filter(pk__in=pks).order_by("pk"))
        assert [(r.owner, r.fencing_token) for r in got] == [
            ("r0", 0),
            ("B", b),
            ("r2", 0),
        ]

    def test_delete(self, pause_backend):
        db = pause_backend
        row = Account.objects.using(db).create(owner="before")

        def newer_write(b):
            fresh = Account.objects.using(db).get(pk=row.pk)
            fresh.owner = "B"
            fresh.save(fence=b)

        a, b, outcome, released = run_paused_writer(
            "delete", db, [row.pk], lock_for(row).name, newer_write
        )
        assert outcome == "stale"
        got = Account.objects.using(db).get(pk=row.pk)
        assert (got.owner, got.fencing_token) == ("B", b)


# ---------------------------------------------------------------------------
# Property: no interleaving lets an older token write after a newer one
# ---------------------------------------------------------------------------

HOLDERS = 3
# Holder 0 takes the lock, its lease lapses and holder 1 takes it over.
PAUSE = [("acquire", 0), ("takeover", 1)]
LOCMEM = "django_distlock.backends.locmem.LocMemLockBackend"
# Weighted: a delete ends the row's story, so it comes up less often.
OP_NAMES = ["acquire", "takeover", "takeover", "expire", "release"]
OP_NAMES += ["save"] * 3 + ["update"] * 2 + ["delete"]
OPS = st.lists(
    st.tuples(st.sampled_from(OP_NAMES), st.integers(0, HOLDERS - 1)),
    min_size=4,
    max_size=30,
)


def check_interleaving(ops):
    """Play ``ops`` with HOLDERS handles on one lock guarding one row.

    ``expire`` makes the current lease lapse behind its holder's back (the
    holder still believes it holds the lock, like a paused process);
    ``takeover`` expires it and lets holder ``i`` acquire. Writes and releases
    are made by one of the holders that believe they hold the lock. The
    model predicts every write: it succeeds exactly when the writer's token is
    not older than the newest token written so far (and the row exists).
    """
    name = unique("prop")
    row = Account.objects.create(owner="init")
    backend = locks["default"]
    handles = [lock(name, timeout=0, auto_renew=False, ttl=60) for _ in range(HOLDERS)]
    loaded = [None] * HOLDERS  # each holder's copy of the row, read on acquire
    current = None  # the index of the holder whose lease is live
    newest = 0  # the newest token written to the row
    expected = ("init", 0)  # (owner, balance) of the last successful write
    exists = True
    try:
        for step, (op, i) in enumerate(ops):
            if op in ("save", "update", "delete", "release"):
                # Done by one of the holders that believe they hold the lock,
                # oldest lease first (hypothesis favours small indexes).
                holding = sorted(
                    (k for k in range(HOLDERS) if handles[k].lease is not None),
                    key=lambda k: handles[k].fencing_token,
                )
                if not holding:
                    continue
                i = holding[i % len(holding)]
            h = handles[i]
            if op in ("expire", "takeover") and current is not None:
                lease = handles[current].lease
                assert backend.force_release(lease.name, lease.token)
                current = None
            if op in ("acquire", "takeover"):
                if h.lease is not None:
                    continue
                assert h.acquire() == (current is None)
                if current is None:
                    current = i
                    loaded[i] = Account.objects.filter(pk=row.pk).first()
            elif op == "expire":
                pass
            elif op == "release":
                if h.lease is None:
                    continue
                if current == i:
                    h.release()
                    current = None
                else:
                    with pytest.raises(LockLost):
                        h.release()
            elif h.lease is not None:  # a write: save, update or delete
                token = h.fencing_token
                allowed = token >= newest
                owner = f"h{i}s{step}"
                if op == "save":
                    if loaded[i] is None:
                        continue
                    loaded[i].owner, loaded[i].balance = owner, step
                    write = loaded[i].save
                elif op == "update":
                    qs = Account.objects.filter(pk=row.pk).fenced(h)

                    def write(fence, qs=qs, owner=owner, step=step):
                        qs.update(owner=owner, balance=step)

                else:
                    if loaded[i] is None:
                        continue
                    write = loaded[i].delete
                    loaded[i] = None
                if not exists:
                    # Nothing to fence against: a fenced update matches no
                    # row; a save or delete of the gone row is refused.
                    allowed = op == "update"
                if allowed:
                    write(fence=h)
                    if exists:
                        newest = token
                        expected = (owner, step)
                    if op == "delete":
                        exists = False
                else:
                    with pytest.raises(StaleFencingToken):
                        write(fence=h)
            got = Account.objects.filter(pk=row.pk).first()
            if not exists:
                assert got is None
            else:
                assert (got.owner, got.balance) == expected
                assert got.fencing_token == newest
    finally:
        for h in handles:
            while h.lease is not None:
                try:
                    h.release()
                except LockNotHeld:
                    pass


@pytest.mark.parametrize(
    "backend",
    [
        pytest.param(b, marks=[pytest.mark.django_db(transaction=True)])
        for b in ("locmem", "redis", "database")
    ],
)
def test_property(request, backend):
    if backend == "locmem":
        setting = {"default": {"BACKEND": LOCMEM}}
    else:
        setting = backend_locks(request, backend, "default")

    @settings(
        max_examples=100 if backend == "locmem" else 50,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture],
    )
    @given(ops=OPS)
    @example(ops=PAUSE + [("save", 1), ("save", 0)])  # the pause test, in short
    @example(ops=PAUSE + [("update", 1), ("update", 0), ("delete", 0)])
    @example(ops=PAUSE + [("delete", 1), ("save", 0), ("update", 0)])
    @example(ops=PAUSE + [("save", 0), ("save", 1), ("save", 0), ("release", 0)])
    def run(ops):
        check_interleaving(ops)

    with override_settings(LOCKS=setting):
        run()


@pytest.mark.django_db
def test_fencing_field_needs_no_migration():
    # The column's class is ours (its pre_save keeps unfenced UPDATEs off the
    # token) but migrations see a plain BigIntegerField: no user migration.
    from django.core.management import call_command

    # With a router configured, makemigrations checks the migration history
    # of every database; this test is about the models, on the default one.
    with override_settings(DATABASE_ROUTERS=[]):
        call_command("makemigrations", "--check", "--dry-run", verbosity=0)
