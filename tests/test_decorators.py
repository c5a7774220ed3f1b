"""The view decorator: function, async and class-based views; 423/503; names."""

from __future__ import annotations

import time

import pytest
from asgiref.sync import async_to_sync
from django.core.exceptions import ImproperlyConfigured
from django.test import AsyncClient, Client, override_settings

from django_distlock import distributed_lock, lock, locks
from django_distlock.decorators import locked_view
from django_distlock.exceptions import LockBackendError, LockNotAcquired

from .procs import run_in_processes, start_process
from .surface import (
    buyer,
    down_locks,
    hold_lock,
    is_listed,
    locks_setting,
    wait_until,
)
from .testapp.models import Product


def test_free_lock_runs_the_view(backend_kind):
    for url, body in [
        ("/buy-now/a1/", b"bought a1"),
        ("/cbv/a1/", b"cbv bought a1"),
    ]:
        response = Client().get(url)
        assert response.status_code == 200
        assert response.content == body


def test_async_views_run(backend_kind):
    async_to_sync(async_views_run)()


async def async_views_run():
    client = AsyncClient()
    response = await client.get("/abuy/a1/")
    assert response.status_code == 200
    assert response.content == b"async bought a1"
    response = await client.get("/acbv/a1/")
    assert response.status_code == 200
    assert response.content == b"async cbv bought a1"


def test_decorated_view_keeps_its_identity():
    from . import views

    assert views.buy_now.__name__ == "buy_now"
    assert views.buy_now.__wrapped__.__name__ == "buy_now"


@pytest.mark.django_db(transaction=True)
def test_busy_from_another_process_is_423(cross_process_kind):
    proc = start_process(hold_lock, "inventory:hot", 30)
    try:
        wait_until(lambda: is_listed("inventory:hot"), what="the other holder")
        response = Client().get("/buy-now/hot/")
        assert response.status_code == 423
        assert int(response["Retry-After"]) >= 1
        # Another SKU is another lock.
        assert Client().get("/buy-now/cold/").status_code == 200
    finally:
        proc.kill()
        proc.join()


def test_busy_async_views_are_423(backend_kind):
    async_to_sync(busy_async_views)()


async def busy_async_views():
    # The holder here is this process's other code; the view waits 0 s.
    for name, url in [("inventory:a2", "/abuy/a2/"), ("acbv:a3", "/acbv/a3/")]:
        held = lock(name, timeout=0)
        assert await held.aacquire()
        try:
            response = await AsyncClient().get(url)
            assert response.status_code == 423
            assert "Retry-After" in response
        finally:
            await held.arelease()
        assert (await AsyncClient().get(url)).status_code == 200


def test_views_do_not_wait_by_default(backend_kind):
    # The alias's TIMEOUT (10 s here) is for lock(); a view answers at once.
    with override_settings(LOCKS=with_timeout(10)), lock("inventory:d1", timeout=0):
        started = time.monotonic()
        response = Client().get("/buy-default/d1/")
        assert response.status_code == 423
        assert time.monotonic() - started < 2


def test_views_wait_for_an_explicit_timeout(backend_kind):
    with lock("inventory:d2", timeout=0):
        started = time.monotonic()
        response = Client().get("/buy-waiting/d2/")
        assert response.status_code == 423
        assert time.monotonic() - started >= 0.45


def with_timeout(seconds):
    from django.conf import settings

    return {
        alias: {**entry, "TIMEOUT": seconds} for alias, entry in settings.LOCKS.items()
    }


def test_lease_lost_while_the_view_ran_keeps_its_response(backend_kind, caplog):
    from django_distlock.signals import lock_lost

    lost = []

    def record(sender, name, reason, **kwargs):
        lost.append(name)

    lock_lost.connect(record)
    try:
        with caplog.at_level("WARNING", logger="django_distlock.release"):
            response = Client().get("/loses/l1/")
            assert response.status_code == 201
            assert response.content == b"done anyway"
            response = async_to_sync(AsyncClient().get)("/aloses/l2/")
            assert response.status_code == 201
    finally:
        lock_lost.disconnect(record)
    assert lost == ["lost:l1", "lost:l2"]
    messages = [r.getMessage() for r in caplog.records]
    assert any(
        "Lock 'lost:l1' was lost while view tests.views.loses_its_lock answered "
        "GET /loses/l1/; its response (201) was sent anyway" in m
        for m in messages
    ), messages
    assert any("'lost:l2' was lost while view" in m for m in messages)
    # The lock is free again.
    with lock("lost:l1", timeout=0), lock("lost:l2", timeout=0):
        pass


def test_view_error_propagates_unchanged_when_the_lease_was_lost(backend_kind):
    with pytest.raises(ValueError, match="the view's own error"):
        Client().get("/loses-and-raises/l3/")


def test_busy_cbv_is_423(backend_kind):
    with lock("cbv:a3", timeout=0):
        assert Client().get("/cbv/a3/").status_code == 423


def test_backend_down_is_503():
    with override_settings(LOCKS=down_locks()):
        response = Client().get("/buy-now/x/")
        assert response.status_code == 503
        assert int(response["Retry-After"]) >= 1
        response = async_to_sync(AsyncClient().get)("/abuy/x/")
        assert response.status_code == 503
        assert "Retry-After" in response


def test_on_locked_callable_overrides(backend_kind):
    with lock("inventory:c1", timeout=0):
        response = Client().get("/custom/c1/")
    assert response.status_code == 418
    assert response.content == b"busy: LockNotAcquired"


def test_setting_overrides_the_default_answer(backend_kind):
    with (
        override_settings(DISTLOCK_LOCKED_VIEW="tests.views.teapot"),
        lock("inventory:s1", timeout=0),
    ):
        response = Client().get("/buy-now/s1/")
    assert response.status_code == 418
    with override_settings(
        DISTLOCK_LOCKED_VIEW="tests.views.teapot", LOCKS=down_locks()
    ):
        response = Client().get("/buy-now/s1/")
    assert response.content == b"busy: LockBackendError"


def test_bad_setting_is_reported(backend_kind):
    with (
        override_settings(DISTLOCK_LOCKED_VIEW="tests.views.nope"),
        lock("inventory:s2", timeout=0),
        pytest.raises(ImproperlyConfigured, match="DISTLOCK_LOCKED_VIEW"),
    ):
        Client().get("/buy-now/s2/")


def test_default_answers():
    assert locked_view(None, LockNotAcquired("x")).status_code == 423
    assert locked_view(None, LockBackendError("x")).status_code == 503


@override_settings(ROOT_URLCONF="tests.urls_placeholders")
def test_unknown_placeholder_names_placeholder_and_view(backend_kind):
    with pytest.raises(ImproperlyConfigured) as info:
        Client().get("/misconfigured/m1/")
    message = str(info.value)
    assert "<colour>" in message
    assert "tests.views.misconfigured" in message
    assert "sku" in message
    # Given by an enclosing route or as an extra kwarg: fine.
    assert Client().get("/shop/blue/m1/").status_code == 200
    assert Client().get("/fixed/m1/").status_code == 200


@override_settings(ROOT_URLCONF="tests.urls_placeholders")
def test_system_check_reports_unknown_placeholders():
    from django.core.checks import run_checks

    errors = [m for m in run_checks() if m.id == "distlock.E020"]
    assert len(errors) == 2
    by_route = {e.msg.split("route ")[1] for e in errors}
    assert by_route == {"'misconfigured/<str:sku>/'.", "'cbv/<str:item>/'."}
    assert all("tests.views." in e.msg for e in errors)
    assert any("<colour>" in e.msg for e in errors)
    assert any("<sku>" in e.msg and "BuyView" in e.msg for e in errors)


@override_settings(ROOT_URLCONF="tests.urls_placeholders")
def test_system_check_reports_bad_arguments():
    from django.core.checks import run_checks

    messages = run_checks()
    (alias,) = [m for m in messages if m.id == "distlock.E022"]
    assert alias.msg == (
        "distributed_lock('bad:<sku>') on view tests.views.unknown_alias: "
        "using='nope' is not an alias of settings.LOCKS."
    )
    assert "'default'" in alias.hint
    bad = sorted(m.msg for m in messages if m.id == "distlock.E023")
    assert bad == [
        "distributed_lock('bad:<sku>') on view tests.views.BadTypesView: "
        "ttl must be a number of seconds, not '30' (str).",
        "distributed_lock('bad:<sku>') on view tests.views.BadTypesView: "
        "using must be a LOCKS alias (str), not ['not', 'an', 'alias'].",
        "distributed_lock('bad:<sku>') on view tests.views.bad_numbers: "
        "timeout must be None or a number >= 0 (seconds), not -3.",
        "distributed_lock('bad:<sku>') on view tests.views.bad_numbers: "
        "ttl must be a positive number of seconds, not -1.",
    ]
    ours = [m for m in messages if m.id in ("distlock.E022", "distlock.E023")]
    assert all(m.hint and m.obj.startswith("tests.views.") for m in ours)


@override_settings(ROOT_URLCONF="tests.urls_placeholders")
def test_bad_arguments_fail_the_request_with_the_same_sentence():
    with pytest.raises(ImproperlyConfigured, match=r"ttl must be a positive"):
        Client().get("/bad-numbers/b1/")
    with pytest.raises(ImproperlyConfigured) as info:
        Client().get("/bad-types/b1/")
    assert str(info.value) == (
        "distributed_lock('bad:<sku>') on view tests.views.BadTypesView.dispatch: "
        "using must be a LOCKS alias (str), not ['not', 'an', 'alias']."
    )
    with pytest.raises(ImproperlyConfigured, match="'nope'"):
        Client().get("/unknown-alias/b1/")


def test_system_check_clean_for_the_suite_urls():
    from django.core.checks import run_checks

    ids = ("distlock.E020", "distlock.E021", "distlock.E022", "distlock.E023")
    assert [m for m in run_checks() if m.id in ids] == []
    with override_settings(DISTLOCK_LOCKED_VIEW="tests.views.nope"):
        (error,) = [m for m in run_checks() if m.id == "distlock.E021"]
        assert "tests.views.nope" in error.msg


def test_callable_name(backend_kind):
    with lock("user:7", timeout=0):
        assert Client().get("/by-callable/?user=7").status_code == 423
    assert Client().get("/by-callable/?user=7").status_code == 200


def test_template_rejects_other_types():
    with pytest.raises(TypeError):
        distributed_lock(42)(lambda request: None)


UNTRUSTED = [
    "*",
    "a?b[c]d",
    "{tag}:}{",
    "distlock:{x}",
    "../../etc/passwd",
    "100% tab\there",
    "\N{SNOWMAN} snow man",
    "<sku>",
    "x" * 5000,
]


@pytest.mark.parametrize("value", UNTRUSTED, ids=range(len(UNTRUSTED)))
def test_url_input_is_plain_data(backend_kind, value):
    from urllib.parse import quote

    url = "/echo/" + quote(value, safe="")
    response = Client().get(url)
    assert response.status_code == 200
    assert response.json()["held"] == ["echo:" + value]
    # That exact lock, and no other.
    with lock("echo:" + value, timeout=0):
        assert Client().get(url).status_code == 423
        assert Client().get(url + "-other").status_code == 200


def test_url_input_keys_stay_bounded_on_redis(redis_server, redis_url):
    with override_settings(LOCKS=locks_setting("redis", _FixtureRequest(redis_url))):
        name = "x" * 100_000
        with lock(f"echo:{name}", timeout=0, ttl=5):
            keys = redis_server.client().keys("*")
        assert keys
        prefix = locks["default"].key_prefix.encode()
        for key in keys:
            assert key.startswith(prefix + b":")
            assert len(key) < 100


class _FixtureRequest:
    def __init__(self, url):
        self.url = url

    def getfixturevalue(self, name):
        assert name == "redis_url"
        return self.url


@pytest.mark.django_db(transaction=True)
def test_no_oversell_across_processes(cross_process_kind):
    Product.objects.create(sku="flash", stock=12)
    results = run_in_processes(buyer, [("flash", 40)] * 3)
    sold = sum(r[0] for r in results)
    assert sold == 12
    assert Product.objects.get(sku="flash").stock == 0


# -- transactions (ATOMIC_REQUESTS and the like) ------------------------------


@pytest.fixture
def in_transaction_kind(backend_kind):
    from django.db import connection

    if backend_kind == "database" and connection.vendor == "sqlite":
        pytest.skip(
            "SQLite has one writer: the database backend on the same file cannot "
            "be used from another thread during a write transaction"
        )
    return backend_kind


@pytest.mark.django_db(transaction=True)
def test_view_in_a_transaction_holds_the_lock_until_commit(in_transaction_kind):
    from . import views

    views.COMMIT_PROBES.clear()
    assert Client().get("/tx/t1/").status_code == 200
    assert Client().get("/tx-on-exit/t2/").status_code == 200
    # Default release="on_commit": still held when the commit completed;
    # release="on_exit": already free before the commit.
    assert views.COMMIT_PROBES == [True, False]
    # And released right after the commit.
    with lock("atomic:t1", timeout=0):
        pass


def test_release_option_is_checked():
    with pytest.raises(ValueError, match="release"):
        distributed_lock("x", release="never")


@pytest.mark.django_db(transaction=True)
def test_no_oversell_in_request_transactions_across_processes(cross_process_kind):
    from django.db import connection

    if cross_process_kind == "database" and connection.vendor == "sqlite":
        pytest.skip("SQLite: deferred read-then-write transactions fail at once")
    Product.objects.create(sku="flash-tx", stock=10)
    results = run_in_processes(buyer, [("flash-tx", 40, "buy-atomic")] * 3)
    assert sum(r[0] for r in results) == 10
    assert Product.objects.get(sku="flash-tx").stock == 0
