"""Fencing tokens enforced by the ORM (FencedModel, FencedQuerySet).

Three parts: the semantics of fenced writes, in one process, on each database
(SQLite, PostgreSQL, MariaDB); the pause test across real processes on every
lock backend; and a hypothesis property test of random interleavings.
"""

from __future__ import annotations

import asyncio
import importlib
import itertools
import multiprocessing
import os
import signal
import uuid

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db import transaction
from django.db.models.signals import post_save, pre_save
from django.test import override_settings
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from django_distlock import lock, lock_for, locks
from django_distlock.exceptions import LockLost, LockNotHeld, StaleFencingToken
from tests.conftest import redis_locks
from tests.procs import start_process
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
        assert seen == [("pre", fields), ("post", False, fields), ("pre", None)]

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

    def test_delete_cascades_to_multi_table_children(self, db_alias):
        sav = SavingsAccount.objects.using(db_alias).create(owner="s")
        h = held()
        deleted, _ = Account.objects.using(db_alias).filter(pk=sav.pk).fenced(h).delete()
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
            return await acc.adelete(fence=new)

        assert asyncio.run(scenario())[0] == 1
