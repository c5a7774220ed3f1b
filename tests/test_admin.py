"""The admin Locks page, through Django's test Client."""

from __future__ import annotations

import os
import re
import socket
import threading
import time

import pytest
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.auth.models import Permission
from django.test import Client, override_settings
from django.urls import reverse

from django_distlock import LockLost, lock
from django_distlock.admin import LockAdmin

from .conftest import redis_locks
from .procs import start_process
from .surface import (
    down_locks,
    fill_redis,
    hold_until_lost,
    is_listed,
    wait_until,
)

pytestmark = pytest.mark.django_db

CHANGELIST = "admin:django_distlock_lock_changelist"
RELEASE = "admin:django_distlock_lock_release"


def staff(django_user_model, *perms):
    user = django_user_model.objects.create_user(
        f"staff{len(perms)}{time.monotonic_ns()}", password="pw", is_staff=True
    )
    for codename in perms:
        user.user_permissions.add(Permission.objects.get(codename=codename))
    client = Client()
    client.force_login(user)
    return client


def refs(response) -> list[str]:
    return re.findall(r'name="ref" value="([^"]+)"', response.content.decode())


def test_index_shows_the_locks_entry(admin_client):
    response = admin_client.get(reverse("admin:index"))
    assert response.status_code == 200
    assert reverse(CHANGELIST) in response.content.decode()
    assert reverse(CHANGELIST) == "/admin/django_distlock/lock/"
    response = admin_client.get(
        reverse("admin:app_list", kwargs={"app_label": "django_distlock"})
    )
    assert "Locks" in response.content.decode()


def test_changelist_shows_a_holder_of_another_process(
    cross_process_kind, admin_client, tmp_path
):
    proc = start_process(hold_until_lost, "inventory:sku-9", str(tmp_path / "out"))
    try:
        wait_until(lambda: is_listed("inventory:sku-9"), what="the holder")
        response = admin_client.get(reverse(CHANGELIST))
        assert response.status_code == 200
        html = response.content.decode()
        assert "inventory:sku-9" in html
        assert f", {proc.pid}, MainThread" in html
        row = response.context["rows"][0]
        assert row.backend == "default"
        assert row.fencing_token is not None
        assert 0 < row.expires_in <= 5
        assert row.acquired_at is not None
        # Release it: confirmation, then the real POST.
        (ref,) = refs(response)
        confirm = admin_client.post(reverse(RELEASE), {"ref": ref})
        assert confirm.status_code == 200
        assert "Are you sure?" in confirm.content.decode()
        assert is_listed("inventory:sku-9")
        done = admin_client.post(reverse(RELEASE), {"ref": ref, "post": "yes"})
        assert done.status_code == 302
        assert not is_listed("inventory:sku-9")
        wait_until((tmp_path / "out").exists, what="the holder to notice")
        assert (tmp_path / "out").read_text() == "LockLost"
    finally:
        proc.kill()
        proc.join()


def test_release_is_logged_and_the_holder_finds_out(backend_kind, admin_client):
    held = lock("log:me", timeout=0)
    assert held.acquire()
    token = held.fencing_token
    (ref,) = refs(admin_client.get(reverse(CHANGELIST)))
    response = admin_client.post(reverse(RELEASE), {"ref": ref, "post": "yes"})
    assert response.status_code == 302
    assert response["Location"] == reverse(CHANGELIST)
    with pytest.raises(LockLost):
        held.release()
    entry = LogEntry.objects.get()
    # A change of the lock (its holder lost it), not a deletion.
    assert entry.action_flag == CHANGE
    assert entry.object_repr == "log:me"
    assert entry.get_change_message() == (
        f"Force-released lock 'log:me' on backend 'default' (holder "
        f"{socket.gethostname()}:{os.getpid()}/{threading.current_thread().name}, "
        f"fencing token {token})."
    )
    messages = [
        str(m) for m in admin_client.get(reverse(CHANGELIST)).context["messages"]
    ]
    assert any("Released 1 lock" in m for m in messages)


def test_a_lock_taken_again_is_left_alone(backend_kind, admin_client):
    first = lock("again", timeout=0)
    assert first.acquire()
    (ref,) = refs(admin_client.get(reverse(CHANGELIST)))
    first.release()
    second = lock("again", timeout=0)
    assert second.acquire()
    response = admin_client.post(reverse(RELEASE), {"ref": ref, "post": "yes"})
    assert response.status_code == 302
    assert second.locked()
    assert not LogEntry.objects.exists()
    second.release()


def test_search_filter_and_pagination(admin_client, redis_url, monkeypatch):
    monkeypatch.setattr(LockAdmin, "list_per_page", 4)
    mem = {
        "BACKEND": "django_distlock.backends.locmem.LocMemLockBackend",
        "LOCATION": "admin-filter",
    }
    with override_settings(LOCKS={**redis_locks(redis_url), "mem": mem}):
        handles = [lock(f"order:{i}", timeout=0) for i in range(6)]
        handles += [lock(f"mem:{i}", using="mem", timeout=0) for i in range(3)]
        handles.append(lock("Other Thing", timeout=0))
        for h in handles:
            assert h.acquire()
        try:
            url = reverse(CHANGELIST)
            names = lambda r: [row.holder.name for row in r.context["rows"]]  # noqa: E731

            found = admin_client.get(url, {"q": "ORDER:"})
            page2 = admin_client.get(url, {"q": "order:", "p": 2})
            assert len(names(found)) == 4 and len(names(page2)) == 2
            assert sorted(names(found) + names(page2)) == [
                f"order:{i}" for i in range(6)
            ]
            assert found.context["next_url"] and not page2.context["next_url"]
            assert page2.context["previous_url"]
            assert sorted(names(admin_client.get(url, {"backend": "mem"}))) == [
                f"mem:{i}" for i in range(3)
            ]
            assert names(admin_client.get(url, {"q": "other th"})) == ["Other Thing"]
            assert names(admin_client.get(url, {"q": "nothing like it"})) == []
            # Unknown backend or page: harmless.
            assert (
                admin_client.get(url, {"backend": "nope", "p": "x"}).status_code == 200
            )
        finally:
            for h in handles:
                h.release()


def test_total_count(admin_client, backend_kind, monkeypatch):
    monkeypatch.setattr(LockAdmin, "list_per_page", 2)
    handles = [lock(f"count:{i}", timeout=0) for i in range(5)]
    for h in handles:
        assert h.acquire()
    try:
        response = admin_client.get(reverse(CHANGELIST), {"p": 2})
        assert response.context["total"] == 5
        assert "Locks 3–4 of 5" in response.content.decode()
        response = admin_client.get(reverse(CHANGELIST), {"q": "count:4"})
        assert "Locks 1–1 of 1" in response.content.decode()
        # Counting stops at the limit (a page's cost stays bounded).
        monkeypatch.setattr(LockAdmin, "full_result_count_limit", 3)
        response = admin_client.get(reverse(CHANGELIST))
        assert "Locks 1–2 of more than 3" in response.content.decode()
        response = admin_client.get(reverse(CHANGELIST), {"p": 3})
        assert "Locks 5–5 of 5" in response.content.decode()
    finally:
        for h in handles:
            h.release()


def test_search_filter_and_page_survive_a_release(admin_client, backend_kind):
    handles = [lock(f"keep:{i}", timeout=0) for i in range(3)]
    for h in handles:
        assert h.acquire()
    try:
        listed = admin_client.get(
            reverse(CHANGELIST), {"q": "keep:", "backend": "default"}
        )
        html = listed.content.decode()
        preserved = "q=keep%3A&amp;backend=default"
        assert f'name="_changelist_filters" value="{preserved}"' in html
        ref = refs(listed)[0]
        filters = "q=keep%3A&backend=default"
        confirm = admin_client.post(
            reverse(RELEASE), {"ref": ref, "_changelist_filters": filters}
        )
        page = confirm.content.decode()
        back = f"{reverse(CHANGELIST)}?q=keep%3A&amp;backend=default"
        assert f'href="{back}" class="button cancel-link"' in page
        assert f'name="_changelist_filters" value="{preserved}"' in page
        done = admin_client.post(
            reverse(RELEASE),
            {"ref": ref, "post": "yes", "_changelist_filters": filters},
        )
        assert done["Location"] == f"{reverse(CHANGELIST)}?{filters}"
        # Only the changelist's own parameters travel.
        done = admin_client.post(
            reverse(RELEASE), {"_changelist_filters": "q=x&next=//evil.example/"}
        )
        assert done["Location"] == f"{reverse(CHANGELIST)}?q=x"
    finally:
        for h in handles:
            try:
                h.release()
            except LockLost:
                pass


def test_select_all_and_long_names(admin_client, backend_kind):
    name = "long:" + "x" * 5000
    with lock(name, timeout=0), lock("short", timeout=0):
        html = admin_client.get(reverse(CHANGELIST)).content.decode()
    assert 'id="action-toggle"' in html
    # The cell shows 200 characters, its title (hover) up to 1000.
    assert f'title="{name[:999]}…">{name[:199]}…</span>' in html


def test_an_empty_name_and_edge_spaces_are_quoted(admin_client, backend_kind):
    with lock("", timeout=0), lock(" q", timeout=0), lock("in side", timeout=0):
        html = admin_client.get(reverse(CHANGELIST)).content.decode()
    assert 'title="">&quot;&quot;</span>' in html
    assert 'title=" q">&quot; q&quot;</span>' in html
    assert 'title="in side">in side</span>' in html


def test_unreachable_backend_is_a_note(admin_client, redis_url):
    setting = {**redis_locks(redis_url), "down": down_locks()["default"]}
    with override_settings(LOCKS=setting), lock("up:1", timeout=0):
        response = admin_client.get(reverse(CHANGELIST))
        assert response.status_code == 200
        html = response.content.decode()
        assert "up:1" in html
        assert 'class="errornote"' in html and "down" in html
        response = admin_client.get(reverse(CHANGELIST), {"q": "nothing like it"})
        html = response.content.decode()
        assert "No locks are held" not in html
        assert "No lock is held on the backends that could be read." in html


def test_permissions(django_user_model, backend_kind):
    with lock("perm:1", timeout=0) as held:
        nobody = staff(django_user_model)
        assert nobody.get(reverse(CHANGELIST)).status_code == 403
        viewer = staff(django_user_model, "view_lock")
        response = viewer.get(reverse(CHANGELIST))
        assert response.status_code == 200
        assert "perm:1" in response.content.decode()
        assert refs(response) == []  # no release form, no lease reference
        assert "Force-release" not in response.content.decode()
        admin_ref = refs(
            staff(django_user_model, "view_lock", "release_lock").get(
                reverse(CHANGELIST)
            )
        )[0]
        response = viewer.post(reverse(RELEASE), {"ref": admin_ref, "post": "yes"})
        assert response.status_code == 403
        assert held.locked()


def test_release_needs_post_csrf_and_a_genuine_reference(
    django_user_model, backend_kind
):
    with pytest.raises(LockLost), lock("csrf:1", timeout=0) as held:
        releaser = staff(django_user_model, "view_lock", "release_lock")
        (ref,) = refs(releaser.get(reverse(CHANGELIST)))
        assert releaser.get(reverse(RELEASE), {"ref": ref}).status_code == 405
        strict = Client(enforce_csrf_checks=True)
        strict.force_login(_user_of(releaser))
        response = strict.post(reverse(RELEASE), {"ref": ref, "post": "yes"})
        assert response.status_code == 403
        assert held.locked()
        forged = ref[:-3] + ("AAA" if not ref.endswith("AAA") else "BBB")
        response = releaser.post(reverse(RELEASE), {"ref": forged, "post": "yes"})
        assert response.status_code == 403
        assert held.locked()
        # Nothing selected: back to the list with a warning.
        response = releaser.post(reverse(RELEASE), {"post": "yes"})
        assert response.status_code == 302
        # With the token from the real form, it works.
        page = strict.get(reverse(CHANGELIST))
        token = re.search(
            r'name="csrfmiddlewaretoken" value="([^"]+)"', page.content.decode()
        ).group(1)
        response = strict.post(
            reverse(RELEASE),
            {"ref": ref, "post": "yes", "csrfmiddlewaretoken": token},
        )
        assert response.status_code == 302
        assert not held.locked()


def _user_of(client):
    from django.contrib.auth import get_user_model

    return get_user_model().objects.get(pk=client.session["_auth_user_id"])


@pytest.mark.slow
@pytest.mark.redis
def test_pages_stay_fast_with_100k_holders(admin_client, redis_server, redis_url):
    count = int(os.environ.get("DISTLOCK_SCALE", "100000"))
    fill_redis(redis_url, "bulk:", count)
    with override_settings(LOCKS=redis_locks(redis_url)):
        url = reverse(CHANGELIST)
        timings = {}
        for label, params in [
            ("page 1", {}),
            ("page 10", {"p": 10}),
            ("search, 1 match", {"q": "bulk:99999"}),
        ]:
            started = time.perf_counter()
            response = admin_client.get(url, params)
            timings[label] = time.perf_counter() - started
            assert response.status_code == 200
        assert len(response.context["rows"]) == 1
        page = admin_client.get(url).content.decode()
        assert "Locks 1–100 of more than 10000" in page
        print(
            f"\nadmin Locks page with {count} holders: "
            + ", ".join(f"{k} {v:.2f} s" for k, v in timings.items())
        )
        assert timings["page 1"] < 30  # liveness only
