"""lock_for: row lock names, options, release="on_commit"; and the signals."""

from __future__ import annotations

import threading

import pytest
from django.db import transaction
from django.test import override_settings

from django_distlock import LockLost, lock, lock_for, locks
from django_distlock.instances import OnCommitLock, lock_name_for
from django_distlock.signals import (
    lock_acquired,
    lock_contended,
    lock_lost,
    lock_released,
)

from .procs import run_in_processes, start_process
from .surface import (
    hold_lock,
    increment_under_row_lock,
    is_listed,
    try_lock,
    wait_until,
)
from .testapp.models import Product, ProductProxy

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def in_transaction_kind(backend_kind):
    """A backend that another thread can use while this one is in a transaction."""
    from django.db import connection

    if backend_kind == "database" and connection.vendor == "sqlite":
        pytest.skip(
            "SQLite has one writer: the database backend on the same file cannot "
            "be probed from another thread during a write transaction "
            "(run with DISTLOCK_TEST_DB=postgres)"
        )
    return backend_kind


def held_elsewhere(name: str) -> bool:
    """True if a fresh handle in another thread cannot take ``name`` now."""
    result = []

    def probe():
        handle = lock(name, timeout=0)
        got = handle.acquire()
        if got:
            handle.release()
        result.append(not got)

    thread = threading.Thread(target=probe)
    thread.start()
    thread.join()
    return result[0]


# -- names --------------------------------------------------------------------


def test_names():
    product = Product.objects.create(sku="n1")
    assert lock_for(product).name == f"testapp.product:{product.pk}"
    assert lock_for(Product, pk=product.pk).name == f"testapp.product:{product.pk}"
    assert lock_for(Product, pk="a:b").name == "testapp.product:a:b"


def test_proxy_locks_the_concrete_row():
    product = Product.objects.create(sku="p1")
    proxy = ProductProxy.objects.get(pk=product.pk)
    assert lock_for(proxy).name == lock_for(product).name
    assert lock_name_for(ProductProxy, product.pk) == lock_name_for(product)


def test_unsaved_and_missing_pk_are_errors():
    with pytest.raises(ValueError, match="unsaved"):
        lock_for(Product(sku="u1"))
    with pytest.raises(ValueError):
        lock_for(Product)
    with pytest.raises(TypeError):
        lock_for(Product.objects.create(sku="u2"), pk=3)
    with pytest.raises(ValueError, match="release"):
        lock_for(Product, pk=1, release="later")


def test_every_lock_option_is_taken():
    extra = {"BACKEND": "django_distlock.backends.locmem.LocMemLockBackend"}
    with override_settings(LOCKS={"default": extra, "other": {**extra, "TTL": 9}}):
        for release in ("on_exit", "on_commit"):
            handle = lock_for(
                Product,
                pk=1,
                using="other",
                ttl=3,
                timeout=0.5,
                auto_renew=False,
                release=release,
            )
            assert (handle.using, handle.ttl, handle.timeout, handle.auto_renew) == (
                "other",
                3,
                0.5,
                False,
            )
            assert handle.backend is locks["other"]


def test_proxy_and_concrete_exclude_each_other_across_processes(cross_process_kind):
    product = Product.objects.create(sku="x1")
    proc = start_process(hold_lock, lock_name_for(product), 30)
    try:
        wait_until(lambda: is_listed(lock_name_for(product)), what="the holder")
        assert not lock_for(ProductProxy, pk=product.pk, timeout=0).acquire()
    finally:
        proc.kill()
        proc.join()
    # The killed holder's lease expires after its ttl; then the lock is free.
    assert lock_for(product, timeout=15).acquire()


# -- release="on_commit" --------------------------------------------------------


def test_on_commit_outside_atomic_releases_on_exit(backend_kind):
    product = Product.objects.create(sku="c0")
    with lock_for(product, release="on_commit") as held:
        assert isinstance(held, OnCommitLock)
        assert held_elsewhere(held.name)
    assert not held_elsewhere(held.name)


def test_on_commit_keeps_the_lock_until_commit(in_transaction_kind):
    product = Product.objects.create(sku="c1")
    name = lock_name_for(product)
    released_at = []
    with transaction.atomic():
        with lock_for(product, release="on_commit"):
            Product.objects.filter(pk=product.pk).update(stock=1)
        assert held_elsewhere(name), "released before the commit"
        transaction.on_commit(lambda: released_at.append(held_elsewhere(name)))
    # Our hook was registered after the lock's, so it ran after the release.
    assert released_at == [False]
    assert not held_elsewhere(name)


def test_on_commit_releases_on_rollback(in_transaction_kind):
    product = Product.objects.create(sku="c2")
    name = lock_name_for(product)
    with pytest.raises(ZeroDivisionError), transaction.atomic():
        with lock_for(product, release="on_commit"):
            Product.objects.filter(pk=product.pk).update(stock=5)
        assert held_elsewhere(name)
        raise ZeroDivisionError
    assert not held_elsewhere(name)
    assert Product.objects.get(pk=product.pk).stock == 0


def test_on_commit_releases_when_block_raises_inside_atomic(in_transaction_kind):
    product = Product.objects.create(sku="c3")
    name = lock_name_for(product)
    with pytest.raises(KeyError), transaction.atomic():
        with lock_for(product, release="on_commit"):
            raise KeyError("boom")
    assert not held_elsewhere(name)


def test_on_commit_releases_on_savepoint_rollback(in_transaction_kind):
    product = Product.objects.create(sku="c4")
    name = lock_name_for(product)
    with transaction.atomic():
        try:
            with transaction.atomic():
                with lock_for(product, release="on_commit"):
                    Product.objects.filter(pk=product.pk).update(stock=7)
                raise ValueError
        except ValueError:
            pass
        # The block's writes are undone, so its lock is released at once.
        assert not held_elsewhere(name)
        with lock_for(product, release="on_commit"):
            pass
        assert held_elsewhere(name)
    assert not held_elsewhere(name)


def test_reentering_in_the_same_transaction_adopts_the_pending_lease(
    in_transaction_kind,
):
    product = Product.objects.create(sku="c5")
    with transaction.atomic():
        with lock_for(product, release="on_commit", timeout=0) as first:
            token = first.fencing_token
        with lock_for(product, release="on_commit", timeout=0) as second:
            assert second.fencing_token == token
        assert held_elsewhere(second.name)
    assert not held_elsewhere(second.name)


def test_on_commit_as_decorator(backend_kind):
    product = Product.objects.create(sku="c6")

    @transaction.atomic
    @lock_for(product, release="on_commit")
    def sell():
        Product.objects.filter(pk=product.pk).update(stock=2)

    sell()
    sell()
    assert not held_elsewhere(lock_name_for(product))


def test_no_lost_update_across_processes(cross_process_kind, request):
    # On SQLite, deferred transactions that read then write fail at once with
    # "database is locked" when the lock table is written meanwhile.
    request.getfixturevalue("in_transaction_kind")
    product = Product.objects.create(sku="c7", stock=0)
    results = run_in_processes(increment_under_row_lock, [(product.pk, 8)] * 3)
    assert sum(results) == 24
    assert Product.objects.get(pk=product.pk).stock == 24


def test_on_commit_lock_holds_off_other_processes(cross_process_kind, request):
    request.getfixturevalue("in_transaction_kind")
    product = Product.objects.create(sku="c8")
    name = lock_name_for(product)
    with transaction.atomic():
        with lock_for(product, release="on_commit"):
            pass
        assert run_in_processes(try_lock, [(name,)]) == [False]
    assert run_in_processes(try_lock, [(name,)]) == [True]


# -- signals --------------------------------------------------------------------


class Recorder:
    def __init__(self):
        self.events = []

    def __call__(self, signal, sender, **kwargs):
        self.events.append((signal, kwargs))

    def of(self, signal):
        return [kw for s, kw in self.events if s is signal]


@pytest.fixture
def recorder():
    rec = Recorder()
    signals = (lock_acquired, lock_released, lock_lost, lock_contended)
    for signal in signals:
        signal.connect(rec, weak=False)
    yield rec
    for signal in signals:
        signal.disconnect(rec)


def test_signals_carry_alias_name_and_times(backend_kind, recorder):
    import time

    with lock("sig:a", ttl=5) as held:
        token = held.fencing_token
        time.sleep(0.05)
        assert not lock("sig:a", timeout=0.1).acquire()
    (acquired,) = recorder.of(lock_acquired)
    assert acquired["alias"] == "default"
    assert acquired["name"] == "sig:a"
    assert acquired["lease"].fencing_token == token
    assert acquired["wait"] >= 0
    (contended,) = recorder.of(lock_contended)
    assert contended["name"] == "sig:a"
    assert contended["alias"] == "default"
    assert contended["wait"] >= 0.09
    assert contended["timeout"] == 0.1
    (released,) = recorder.of(lock_released)
    assert released["name"] == "sig:a"
    assert released["held"] >= 0.05


def test_lock_lost_signal_when_cleared(backend_kind, recorder):
    backend = locks["default"]
    with pytest.raises(LockLost):
        with lock("sig:lost", ttl=5, auto_renew=False):
            (holder,) = [h for h in backend.holders("sig:lost")]
            assert backend.force_release(holder.name, holder.token)
    (lost,) = recorder.of(lock_lost)
    assert lost["alias"] == "default"
    assert lost["name"] == "sig:lost"
    assert lost["held"] >= 0
    assert lost["reason"]
