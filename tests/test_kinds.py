"""Shared locks and semaphores: the handle, the locmem reference backend, views,
checks, fencing, listing, the admin and the metrics.

The backend-level semantics run on locmem (the reference implementation);
the networked backends run their own kinds tests.
"""

from __future__ import annotations

import asyncio
import io
import json
import re
import threading
import time

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.test import AsyncClient, Client, override_settings
from django.urls import reverse

from django_distlock import (
    LockNotAcquired,
    Semaphore,
    lock,
    lock_for,
    locks,
    semaphore,
)
from django_distlock.backends.kinds import EXCLUSIVE, SHARED, Kind, permit
from django_distlock.backends.locmem import LocMemLockBackend
from django_distlock.exceptions import InvalidLockBackendError, LockNotHeld
from django_distlock.signals import (
    lock_acquired,
    lock_contended,
    lock_lost,
    lock_released,
)

LOCMEM = "django_distlock.backends.locmem.LocMemLockBackend"


class ExclusiveOnlyBackend(LocMemLockBackend):
    """A backend that offers exclusive locks only (like the reentrant one);
    any acquire of another kind would be a bug of the handle."""

    kinds = frozenset({"exclusive"})

    def acquire(self, name, ttl, timeout, kind=EXCLUSIVE):
        assert kind is EXCLUSIVE, "the handle must refuse before any round trip"
        return super().acquire(name, ttl, timeout)


class RecordingBackend(LocMemLockBackend):
    """locmem, recording the arguments the handle passes."""

    kinds = LocMemLockBackend.kinds
    calls: list = []

    def acquire(self, *args):
        self.calls.append(("acquire", args[3:]))
        return super().acquire(*args)

    async def aacquire(self, *args):
        self.calls.append(("aacquire", args[3:]))
        return await super().aacquire(*args)

    def holder_of(self, *args):
        self.calls.append(("holder_of", args[1:]))
        return super().holder_of(*args)

    async def aholder_of(self, *args):
        self.calls.append(("aholder_of", args[1:]))
        return await super().aholder_of(*args)


@pytest.fixture(autouse=True)
def kinds_locks(request):
    """LOCKS on a fresh locmem table, plus "plain" offering exclusive only."""
    setting = {
        "default": {"BACKEND": LOCMEM, "LOCATION": f"kinds-{request.node.nodeid}"},
        "plain": {
            "BACKEND": f"{__name__}.ExclusiveOnlyBackend",
            "LOCATION": f"plain-{request.node.nodeid}",
        },
        "recording": {
            "BACKEND": f"{__name__}.RecordingBackend",
            "LOCATION": f"recording-{request.node.nodeid}",
        },
    }
    with override_settings(LOCKS=setting):
        yield setting


def in_thread(target, *args) -> threading.Thread:
    thread = threading.Thread(target=target, args=args, daemon=True)
    thread.start()
    return thread


def wait_until(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


# -- shared locks: the handle on locmem ------------------------------------------


def test_shared_holders_coexist_and_exclude_exclusive():
    first, second = lock("doc", shared=True, timeout=0), lock("doc", shared=True)
    assert first.acquire() and second.acquire(timeout=0)
    assert first.lease.kind is SHARED and first.locked() and second.locked()
    assert not lock("doc", timeout=0).acquire()
    first.release()
    assert not lock("doc", timeout=0).acquire()  # the second still reads
    second.release()
    with lock("doc", timeout=0):
        assert not lock("doc", shared=True, timeout=0).acquire()
    assert repr(lock("doc", shared=True)).startswith(
        "<Lock 'doc' using='default' shared"
    )


def test_each_shared_holder_has_its_own_lease():
    backend = locks["default"]
    a, b = lock("per", shared=True, timeout=0), lock("per", shared=True, timeout=0)
    assert a.acquire() and b.acquire()
    assert a.lease.token != b.lease.token
    a.extend(60)
    assert a.lease.remaining() > 50 and b.lease.remaining() < 35
    assert backend.force_release("per", b.lease.token, SHARED)
    assert a.locked() and not b.locked()
    assert not backend.force_release("per", b.lease.token, SHARED)
    # A shared token is no exclusive lease, nor the other way round.
    assert not backend.force_release("per", a.lease.token)
    a.release()
    with pytest.raises(LockNotHeld):
        b.release()


def test_writer_preference_and_a_gone_waiter_frees_the_readers():
    reader = lock("wp", shared=True, timeout=0)
    assert reader.acquire()
    order = []

    def writer():
        with lock("wp", timeout=10):
            order.append("writer")

    thread = in_thread(writer)
    wait_until(lambda: "wp" in locks["default"]._table.writers_waiting)
    # A new reader queues behind the waiting writer...
    assert not lock("wp", shared=True, timeout=0).acquire()
    assert not lock("wp", shared=True).acquire(timeout=0.05)
    reader.release()
    thread.join(10)
    assert order == ["writer"]
    # ... and a writer that gave up leaves no place behind.
    assert reader.acquire()
    assert not lock("wp", timeout=0.05).acquire()
    assert lock("wp", shared=True, timeout=0).acquire()


def test_shared_fencing_tokens_stay_below_the_next_exclusive():
    with lock("fence", timeout=0) as first:
        before = first.fencing_token
    with lock("fence", shared=True, timeout=0) as reader:
        shared = reader.fencing_token
    with lock("fence", timeout=0) as after:
        assert before <= shared < after.fencing_token


def test_a_shared_lease_expires_by_ttl():
    reader = lock("ttl", shared=True, ttl=0.2, auto_renew=False, timeout=0)
    assert reader.acquire()
    assert lock("ttl", timeout=2).acquire()


def test_busy_shared_names_the_exclusive_holder():
    with lock("who", timeout=0):
        with pytest.raises(LockNotAcquired) as info:
            with lock("who", shared=True, timeout=0):
                pass
    assert info.value.holder.kind == EXCLUSIVE
    assert "is held by" in str(info.value)
    assert info.value.kind is SHARED


def test_kinds_are_refused_before_any_round_trip_where_not_offered():
    with pytest.raises(InvalidLockBackendError, match="does not offer shared locks"):
        lock("x", using="plain", shared=True).acquire()
    with pytest.raises(
        ImproperlyConfigured, match="'plain'.*does not offer semaphores"
    ):
        with semaphore("x", 2, using="plain"):
            pass
    with lock("x", using="plain", timeout=0):  # exclusive stays as before
        pass


def test_exclusive_acquisitions_pass_no_kind_to_the_backend():
    calls = RecordingBackend.calls
    calls.clear()
    with lock("r", using="recording", timeout=0):
        with pytest.raises(LockNotAcquired):
            with lock("r", using="recording", timeout=0):
                pass
    assert calls == [("acquire", ()), ("acquire", ()), ("holder_of", ())]
    calls.clear()

    async def main():
        async with lock("ar", using="recording", timeout=0):
            with pytest.raises(LockNotAcquired):
                async with lock("ar", using="recording", timeout=0):
                    pass
            await lock("ar", using="recording").aacquire(timeout=0)

    asyncio.run(main())
    # (The async twins run the sync methods in turn: only theirs are the
    # handle's calls.)
    assert [c for c in calls if c[0] in ("aacquire", "aholder_of")] == [
        ("aacquire", ()),
        ("aacquire", ()),
        ("aholder_of", ()),
        ("aacquire", ()),
    ]
    calls.clear()
    with lock("r", using="recording", shared=True, timeout=0):
        with pytest.raises(LockNotAcquired):
            with lock("r", using="recording", timeout=0):
                pass
    with semaphore("r", 1, using="recording", timeout=0):
        with pytest.raises(LockNotAcquired):
            with semaphore("r", 1, using="recording", timeout=0):
                pass
    assert calls == [
        ("acquire", (SHARED,)),
        ("acquire", ()),
        ("holder_of", ()),
        ("acquire", (permit(1),)),
        ("acquire", (permit(1),)),
        ("holder_of", (permit(1),)),
    ]


def test_shared_must_be_a_bool():
    with pytest.raises(TypeError, match="shared"):
        lock("x", shared="yes")


def test_lock_for_shared(db):
    from .testapp.models import Product

    product = Product.objects.create(sku="kinds-1", stock=3)
    with lock_for(product, shared=True, timeout=0) as reader:
        assert reader.name == f"testapp.product:{product.pk}"
        assert reader.lease.kind is SHARED
        with lock_for(Product, pk=product.pk, shared=True, timeout=0):
            pass
        assert not lock_for(product, timeout=0).acquire()


@pytest.mark.django_db(transaction=True)
def test_on_commit_shared_lock_is_adopted_by_shared_only():
    from django.db import transaction

    from .testapp.models import Product

    product = Product.objects.create(sku="kinds-2", stock=3)
    options = {"release": "on_commit", "timeout": 0}
    with transaction.atomic():
        with lock_for(product, shared=True, **options) as first:
            lease = first.lease
        # Kept until the commit; another shared block adopts it...
        with lock_for(product, shared=True, **options) as again:
            assert again.lease is lease
        # ... an exclusive one does not: it is a different acquisition.
        assert not lock_for(product, **options).acquire()
        assert locks["default"].is_held(lease)
    assert not locks["default"].is_held(lease)
    with lock_for(product, **options):
        pass


@pytest.mark.django_db
def test_fenced_save_from_a_shared_holder_or_a_permit_is_refused():
    from .testapp.models import Account

    account = Account.objects.create(owner="kinds")
    for held in (lock("acct", shared=True), semaphore("acct", 2)):
        with held:
            account.balance = 100
            with pytest.raises(ValueError, match="fenced writes need an exclusive"):
                account.save(fence=held)
            with pytest.raises(ValueError, match="exclusive"):
                Account.objects.fenced(held).update(balance=7)
    account.refresh_from_db()
    assert (account.balance, account.fencing_token) == (0, 0)
    with lock("acct") as held:
        account.save(fence=held)  # an exclusive holder writes


# -- semaphores ------------------------------------------------------------------


def test_semaphore_limits_the_holders():
    first, second = semaphore("export", 2), semaphore("export", 2, timeout=0)
    assert isinstance(first, Semaphore)
    assert first.acquire(timeout=0) and second.acquire()
    assert first.lease.kind == permit(2)
    assert first.fencing_token < second.fencing_token
    with pytest.raises(LockNotAcquired) as info:
        with semaphore("export", 2, timeout=0):
            pass
    message = str(info.value)
    assert message.startswith("Semaphore 'export' was not acquired within 0 s")
    assert "all 2 permits are held" in message
    assert info.value.holder.token == first.lease.token  # expiring first
    assert 0 < info.value.expires_in <= 30
    first.release()
    with semaphore("export", 2, timeout=0) as third:
        assert third.locked()
    second.release()


def test_semaphores_and_locks_live_apart():
    with semaphore("same", 1, timeout=0), lock("same", timeout=0):
        assert not semaphore("same", 1, timeout=0).acquire()
        assert not lock("same", timeout=0).acquire()


def test_a_reader_that_asks_to_write_is_told_there_is_no_upgrade():
    with lock("upgrade", shared=True, timeout=0):
        with pytest.raises(LockNotAcquired) as info:
            with lock("upgrade", timeout=0):
                pass
    message = str(info.value)
    assert "already holds it shared" in message and "no upgrade" in message
    assert "Reentrant" not in message  # which offers no shared locks


def test_a_permit_is_no_nested_hold_of_the_lock():
    def hold_elsewhere(taken, done):
        with lock("nest", timeout=0):
            taken.set()
            done.wait(10)

    taken, done = threading.Event(), threading.Event()
    thread = in_thread(hold_elsewhere, taken, done)
    assert taken.wait(10)
    try:
        with semaphore("nest", 1, timeout=0):
            with pytest.raises(LockNotAcquired) as info:
                with lock("nest", timeout=0):
                    pass
        assert "already holds it" not in str(info.value)
    finally:
        done.set()
        thread.join(10)


def test_every_holder_passes_the_same_limit():
    with semaphore("lim", 3, timeout=0):
        with pytest.raises(ValueError) as info:
            semaphore("lim", 4, timeout=0).acquire()
        assert str(info.value).startswith(
            "Semaphore 'lim' is held with a limit of 3 permits, not 4"
        )
    # No live permit: another limit is fine.
    with semaphore("lim", 4, timeout=0):
        pass


@pytest.mark.parametrize(
    "limit, error",
    [
        (0, ValueError),
        (-2, ValueError),
        ("3", TypeError),
        (True, TypeError),
        (2.0, TypeError),
    ],
)
def test_limit_is_an_int_of_at_least_one(limit, error):
    with pytest.raises(error, match="Semaphore 'bad': limit must be"):
        semaphore("bad", limit)


def test_permits_are_granted_in_fifo_order():
    holder = semaphore("fifo", 1, timeout=0)
    assert holder.acquire()
    order = []

    def waiter(i):
        with semaphore("fifo", 1, timeout=10):
            order.append(i)

    threads = []
    for i in range(4):
        threads.append(in_thread(waiter, i))
        wait_until(
            lambda i=i: len(locks["default"]._table.semaphores["fifo"].queue) == i + 1
        )
    holder.release()
    for thread in threads:
        thread.join(10)
    assert order == [0, 1, 2, 3]


def test_a_dead_holders_permit_expires():
    gone = semaphore("die", 1, ttl=0.2, auto_renew=False, timeout=0)
    assert gone.acquire()
    started = time.monotonic()
    with semaphore("die", 1, timeout=5):
        assert time.monotonic() - started < 4


def test_a_released_permit_wakes_a_waiter_at_once():
    holder = semaphore("wake", 1, timeout=0)
    assert holder.acquire()
    got = []
    thread = in_thread(lambda: got.append(semaphore("wake", 1, timeout=None).acquire()))
    wait_until(lambda: locks["default"]._table.semaphores["wake"].queue)
    released = time.monotonic()
    holder.release()
    thread.join(10)
    assert got == [True]
    assert time.monotonic() - released < 1  # woken, not polled after a ttl


def test_semaphore_is_a_decorator_with_a_fresh_handle_per_call():
    calls = []

    @semaphore("deco", 1, timeout=0)
    def job():
        with lock("deco", timeout=0) as held:  # locks live apart
            calls.append(held.locked())
        assert not semaphore("deco", 1, timeout=0).acquire()

    job()
    job()
    assert calls == [True, True]


def test_async_shared_and_semaphore():
    async def main():
        async with lock("adoc", shared=True, timeout=0) as reader:
            assert reader.lease.kind is SHARED
            other = lock("adoc", shared=True, timeout=0)
            assert await other.aacquire()
            await other.arelease()
            with pytest.raises(LockNotAcquired):
                async with lock("adoc", timeout=0):
                    pass
        async with semaphore("aexp", 1, timeout=0) as permit_:
            assert await permit_.alocked()
            await permit_.aextend(10)
            with pytest.raises(LockNotAcquired, match="all 1 permits are held"):
                async with semaphore("aexp", 1, timeout=0):
                    pass

    asyncio.run(main())


def test_signals_carry_the_kind():
    seen = []

    def receiver(signal, **kwargs):
        seen.append((signal, kwargs["kind"]))

    signals = (lock_acquired, lock_released, lock_contended, lock_lost)
    for signal in signals:
        signal.connect(receiver, dispatch_uid="kinds-test")
    try:
        with lock("sig", shared=True, timeout=0):
            lock("sig", timeout=0).acquire()
        lost = semaphore("sig", 1, ttl=0.1, auto_renew=False, timeout=0)
        lost.acquire()
        time.sleep(0.2)
        with pytest.raises(LockNotHeld):
            lost.release()
    finally:
        for signal in signals:
            signal.disconnect(dispatch_uid="kinds-test")
    assert seen == [
        (lock_acquired, "shared"),
        (lock_contended, "exclusive"),
        (lock_released, "shared"),
        (lock_acquired, "permit"),
        (lock_lost, "permit"),
    ]


def test_lock_error_carries_the_kind():
    from django_distlock.exceptions import LockBackendError
    from django_distlock.signals import lock_error

    from .surface import down_locks

    seen = []

    def receiver(**kwargs):
        seen.append(kwargs["kind"])

    lock_error.connect(receiver, dispatch_uid="kinds-error")
    try:
        with override_settings(LOCKS=down_locks()):
            with pytest.raises(LockBackendError):
                lock("e", timeout=0).acquire()
    finally:
        lock_error.disconnect(dispatch_uid="kinds-error")
    assert seen == ["exclusive"]


# -- the locmem backend directly -------------------------------------------------


def test_locmem_lists_holders_with_their_kind():
    backend = locks["default"]
    assert backend.kinds == {"exclusive", "shared", "permit"}
    a = backend.acquire("l:r", 30, 0, SHARED)
    backend.acquire("l:r", 30, 0, SHARED)
    backend.acquire("l:s", 5, 0, permit(3))
    first = backend.acquire("l:s", 2, 0, permit(3))
    backend.acquire("l:x", 30, 0)
    kinds = sorted((h.name, h.kind.mode, h.kind.limit) for h in backend.holders("l:"))
    assert kinds == [
        ("l:r", "shared", None),
        ("l:r", "shared", None),
        ("l:s", "permit", 3),
        ("l:s", "permit", 3),
        ("l:x", "exclusive", None),
    ]
    assert backend.holder_of("l:s", permit(3)).token == first.token
    assert backend.holder_of("l:r").token in {h.token for h in backend.holders("l:r")}
    assert backend.holder_of("l:r", SHARED) is None  # readers do not block readers
    assert backend.holder_of("l:s") is None  # the semaphore is no lock
    assert backend.force_release_many(
        [("l:r", a.token, SHARED), ("l:s", first.token, permit(3)), ("l:x", "nope")]
    ) == [True, True, False]
    assert len(list(backend.holders("l:"))) == 3


def test_locmem_clear_stale_counts_every_kind():
    backend = locks["default"]
    assert backend.acquire("st:r", 0.05, 0, SHARED)
    assert backend.acquire("st:r", 0.05, 0, permit(2))
    assert backend.acquire("st:x", 0.05, 0)
    time.sleep(0.1)
    assert backend.clear_stale() == 3


# -- views ------------------------------------------------------------------------


@override_settings(ROOT_URLCONF="tests.urls_kinds")
def test_views_shared_lock_and_semaphore():
    client = Client()
    with lock("doc:1", shared=True, timeout=0):
        assert client.get("/read/1/").content == b"read 1"
        response = client.get("/write/1/")
        assert response.status_code == 423
    with lock("doc:1", timeout=0):
        assert client.get("/read/1/").status_code == 423
    first = semaphore("export:acme", 2, ttl=20, timeout=0)
    with first, semaphore("export:acme", 2, ttl=40, timeout=0):
        response = client.get("/export/acme/")
        assert response.status_code == 429
        assert response.content.startswith(b"Too many requests")
        # From the permit that expires first.
        assert 15 <= int(response["Retry-After"]) <= 20
        assert client.get("/export/other/").status_code == 200
    assert client.get("/export/acme/").content == b"exported acme"


@override_settings(ROOT_URLCONF="tests.urls_kinds")
def test_async_views_shared_lock_and_semaphore():
    async def main():
        client = AsyncClient()
        async with lock("doc:2", shared=True, timeout=0):
            assert (await client.get("/aread/2/")).content == b"async read 2"
        async with (
            semaphore("export:a", 2, timeout=0),
            semaphore("export:a", 2, timeout=0),
        ):
            response = await client.get("/aexport/a/")
            assert response.status_code == 429
            assert int(response["Retry-After"]) >= 1
        assert (await client.get("/aexport/a/")).status_code == 200

    asyncio.run(main())


@override_settings(ROOT_URLCONF="tests.urls_kinds")
def test_system_checks_of_kinds():
    from django.core.checks import run_checks

    messages = run_checks()
    e026 = sorted(m.msg for m in messages if m.id == "distlock.E026")
    assert e026 == [
        "distributed_lock('both:<pk>') on view tests.views_kinds.shared_and_limit: "
        "shared=True and limit= are mutually exclusive.",
        "distributed_lock('text:<pk>') on view tests.views_kinds.text_limit: "
        "limit must be an int >= 1, not '3'.",
        "distributed_lock('zero:<pk>') on view tests.views_kinds.zero_limit: "
        "limit must be an int >= 1, not 0.",
    ]
    e027 = sorted(m.msg for m in messages if m.id == "distlock.E027")
    assert e027 == [
        "distributed_lock('plain:<pk>') on view tests.views_kinds.semaphore_on_plain: "
        "LOCKS['plain'] does not offer semaphores (it offers: exclusive).",
        "distributed_lock('plain:<pk>') on view tests.views_kinds.shared_on_plain: "
        "LOCKS['plain'] does not offer shared locks (it offers: exclusive).",
    ]
    ours = [m for m in messages if m.id in ("distlock.E026", "distlock.E027")]
    assert all(m.hint and m.obj.startswith("tests.views_kinds.") for m in ours)


@override_settings(ROOT_URLCONF="tests.urls_kinds")
def test_misconfigured_kinds_fail_the_request():
    client = Client()
    with pytest.raises(ImproperlyConfigured, match="mutually exclusive"):
        client.get("/both/1/")
    with pytest.raises(ImproperlyConfigured, match="limit must be an int >= 1"):
        client.get("/zero/1/")
    with pytest.raises(ImproperlyConfigured, match="does not offer shared locks"):
        client.get("/shared-plain/1/")
    with pytest.raises(ImproperlyConfigured, match="does not offer semaphores"):
        client.get("/semaphore-plain/1/")


def test_suite_urls_raise_no_kinds_check():
    from django.core.checks import run_checks

    ids = ("distlock.E026", "distlock.E027")
    assert [m for m in run_checks() if m.id in ids] == []


# -- listing, clearing, the admin ----------------------------------------------------


def run_command(*args) -> str:
    out = io.StringIO()
    call_command("locks", *args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


def test_list_shows_the_kind():
    with (
        lock("k:doc", shared=True, timeout=0),
        lock("k:doc", shared=True, timeout=0),
        lock("k:job", timeout=0),
        semaphore("k:exp", 3, timeout=0),
    ):
        time.sleep(0.002)  # the second permit is the younger
        with semaphore("k:exp", 3, timeout=0):
            table = run_command("list", "--prefix", "k:")
            listed = json.loads(
                run_command("list", "--prefix", "k:", "--format", "json")
            )
    head, *rows, total = table.rstrip("\n").split("\n")
    assert total == "5 lock(s) held."
    kind = slice(head.index("KIND"), head.index("HOLDER"))
    shown = sorted((row[: kind.start].split()[1], row[kind].rstrip()) for row in rows)
    assert shown == [
        ("k:doc", "shared"),
        ("k:doc", "shared"),
        ("k:exp", "permit 1 of 3"),
        ("k:exp", "permit 2 of 3"),
        ("k:job", "exclusive"),
    ]
    assert sorted((r["name"], r["kind"], r["limit"]) for r in listed) == [
        ("k:doc", "shared", None),
        ("k:doc", "shared", None),
        ("k:exp", "permit", 3),
        ("k:exp", "permit", 3),
        ("k:job", "exclusive", None),
    ]


def test_clear_name_clears_every_holder_of_it():
    readers = [lock("c:doc", shared=True, timeout=0) for _ in range(3)]
    permits = [semaphore("c:doc", 2, timeout=0) for _ in range(2)]
    other = lock("c:other", shared=True, timeout=0)
    for handle in [*readers, *permits, other]:
        assert handle.acquire()
    out = run_command("clear", "c:doc", "--noinput")
    assert "Cleared 5 lock(s)." in out
    assert not any(h.locked() for h in [*readers, *permits])
    assert other.locked()


@pytest.mark.django_db
def test_admin_shows_the_kind_and_releases_one_holder(admin_client):
    from django.contrib.admin.models import LogEntry

    changelist = reverse("admin:django_distlock_lock_changelist")
    release = reverse("admin:django_distlock_lock_release")
    one, two = (
        lock("a:doc", shared=True, timeout=0),
        lock("a:doc", shared=True, timeout=0),
    )
    permit_ = semaphore("a:exp", 4, timeout=0)
    for handle in (one, two, permit_):
        assert handle.acquire()
    response = admin_client.get(changelist)
    kinds = sorted(row.kind for row in response.context["rows"])
    assert kinds == ["permit of 4", "shared", "shared"]
    assert '<td class="field-kind">permit of 4</td>' in response.content.decode()
    (ref,) = [
        ref
        for row in response.context["rows"]
        if row.holder.token == one.lease.token
        for ref in [row.ref]
    ]
    confirm = admin_client.post(release, {"ref": ref})
    assert "shared" in confirm.content.decode()
    done = admin_client.post(release, {"ref": ref, "post": "yes"})
    assert done.status_code == 302
    assert not one.locked() and two.locked() and permit_.locked()
    entry = LogEntry.objects.get()
    assert entry.get_change_message().startswith(
        "Force-released one holder (shared) of 'a:doc' on backend 'default'"
    )
    # And one permit, leaving the semaphore's other holders (none here) alone.
    (ref,) = [
        row.ref
        for row in admin_client.get(changelist).context["rows"]
        if row.kind.startswith("permit")
    ]
    admin_client.post(release, {"ref": ref, "post": "yes"})
    assert not permit_.locked() and two.locked()


# -- metrics ---------------------------------------------------------------------


def test_prometheus_counts_by_kind():
    from prometheus_client import CollectorRegistry

    from django_distlock.contrib.prometheus import LockMetrics

    registry = CollectorRegistry()
    metrics = LockMetrics(registry)
    metrics.connect()
    try:
        with lock("m", shared=True, timeout=0):
            pass
        with semaphore("m", 1, timeout=0):
            assert not semaphore("m", 1, timeout=0).acquire()
        with lock("m", timeout=0):
            pass
    finally:
        metrics.disconnect()
    total = "distlock_acquisitions_total"
    busy = {"backend": "default", "outcome": "busy", "kind": "permit"}
    assert registry.get_sample_value(total, busy) == 1
    for kind in ("shared", "permit", "exclusive"):
        labels = {"backend": "default", "outcome": "acquired", "kind": kind}
        assert registry.get_sample_value(total, labels) == 1
        assert (
            registry.get_sample_value(
                "distlock_held", {"backend": "default", "kind": kind}
            )
            == 0
        )


def test_otel_spans_carry_the_kind():
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
        InMemorySpanExporter,
    )

    from django_distlock.contrib.otel import LockTracing

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing = LockTracing(provider)
    tracing.connect()
    try:
        with semaphore("o", 5, timeout=0):
            pass
        with lock("o", shared=True, timeout=0):
            pass
    finally:
        tracing.disconnect()
    found = [
        (s.name, s.attributes["distlock.kind"], s.attributes.get("distlock.limit"))
        for s in exporter.get_finished_spans()
    ]
    assert found == [
        ("distlock.acquire", "permit", 5),
        ("distlock.hold", "permit", 5),
        ("distlock.acquire", "shared", None),
        ("distlock.hold", "shared", None),
    ]


def test_kind_strings():
    assert str(permit(3)) == "permit of 3" and str(SHARED) == "shared"
    assert Kind("exclusive") == EXCLUSIVE
    assert re.fullmatch(
        r"<Semaphore 'r' limit=2 using='default' unheld>", repr(semaphore("r", 2))
    )


# -- the surface on every surface backend ------------------------------------------


def offers(*modes: str) -> None:
    """Skip unless the default alias's backend offers ``modes`` (not yet all do)."""
    missing = set(modes) - set(locks["default"].kinds)
    if missing:
        pytest.skip(f"{type(locks['default']).__name__} offers no {sorted(missing)}")


@override_settings(ROOT_URLCONF="tests.urls_kinds")
def test_views_and_listing_on_each_backend(backend_kind):
    offers("shared", "permit")
    client = Client()
    handles = [
        lock("doc:9", shared=True, timeout=0),
        lock("doc:9", shared=True, timeout=0),
        semaphore("export:t9", 2, ttl=20, timeout=0),
        semaphore("export:t9", 2, ttl=30, timeout=0),
    ]
    assert all(h.acquire() for h in handles)
    listed = json.loads(run_command("list", "--format", "json"))
    assert sorted((r["name"], r["kind"], r["limit"]) for r in listed) == [
        ("doc:9", "shared", None),
        ("doc:9", "shared", None),
        ("export:t9", "permit", 2),
        ("export:t9", "permit", 2),
    ]
    table = run_command("list")
    assert table.count(" shared ") == 2
    assert " permit 1 of 2 " in table and " permit 2 of 2 " in table
    assert client.get("/write/9/").status_code == 423
    response = client.get("/export/t9/")
    assert response.status_code == 429
    assert 1 <= int(response["Retry-After"]) <= 20
    out = run_command("clear", "doc:9", "export:t9", "--noinput")
    assert "Cleared 4 lock(s)." in out
    assert client.get("/export/t9/").status_code == 200
    assert client.get("/write/9/").status_code == 200
    for handle in handles:
        with pytest.raises(LockNotHeld):  # LockLost: cleared
            handle.release()
    with lock("doc:9", shared=True, timeout=0):
        assert client.get("/read/9/").status_code == 200
        assert client.get("/write/9/").status_code == 423
