"""Force release (``locks clear`` and the admin action) under load."""

from __future__ import annotations

import io
import re
import time

import pytest
from django.core.management import call_command
from django.urls import reverse

from django_distlock import lock
from django_distlock.admin import read_ref
from django_distlock.management.commands import locks as locks_command

from .conftest import backends
from .harness import Run

CHANGELIST = "admin:django_distlock_lock_changelist"
RELEASE = "admin:django_distlock_lock_release"


def refs(client, name_prefix: str) -> list[str]:
    """Return the admin's release references of the listed locks."""
    html = client.get(reverse(CHANGELIST)).content.decode()
    found = re.findall(r'name="ref" value="([^"]+)"', html)
    return [r for r in found if read_ref(r)["n"].startswith(name_prefix)]


@pytest.mark.parametrize(
    "kind", backends("redis", "database", long=("reentrant", "redlock"))
)
def test_force_release_under_load(env, kind, tmp_path, admin_client):
    """Clear held locks again and again while workers use them.

    Each evicted holder must learn it on its next call (LockLost at release,
    or its fenced write refused), and the checker must find no overlap with
    a section that released successfully.
    """
    run = Run(
        "force release under load (locks clear + admin)",
        env,
        tmp_path,
        hold=0.04,
        ttl=2.0,
        timeout=3.0,
    ).start()
    run.load(0.5)
    cleared = 0
    with run.fault():
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            out = io.StringIO()
            call_command(
                "locks", "clear", "--prefix", "torture:", "--noinput", stdout=out
            )
            cleared += int(re.search(r"Cleared (\d+)", out.getvalue()).group(1))
            chosen = refs(admin_client, "torture:")
            if chosen:
                response = admin_client.post(
                    reverse(RELEASE), {"ref": chosen, "post": "yes"}
                )
                assert response.status_code == 302
            time.sleep(0.05)
    verdict = run.finish()
    verdict.notes.append(f"{cleared} cleared by the command")
    assert cleared > 0
    assert verdict.reported_losses > 0, verdict.summary()


@pytest.mark.parametrize("kind", backends("redis", "reentrant", "redlock", "database"))
def test_lock_retaken_between_listing_and_clearing(
    env, kind, admin_client, monkeypatch
):
    """A lease listed, then released and taken again, is not cleared."""
    name = "torture:retake"
    first = lock(name, ttl=10, timeout=5, auto_renew=False)
    assert first.acquire()
    (old_ref,) = refs(admin_client, name)
    holders = locks_command.Command.holders
    swapped = []

    def list_then_retake(self, *args, **kwargs):
        listed = list(holders(self, *args, **kwargs))
        if not swapped:  # between listing and clearing: a new holder
            first.release()
            second = lock(name, ttl=10, timeout=5, auto_renew=False)
            assert second.acquire()
            swapped.append(second)
        return listed

    monkeypatch.setattr(locks_command.Command, "holders", list_then_retake)
    out = io.StringIO()
    call_command("locks", "clear", name, "--noinput", stdout=out)
    assert "Cleared 0 lock(s)" in out.getvalue(), out.getvalue()
    second = swapped[0]
    assert second.locked()
    # The admin's reference names the first lease: it is left alone too.
    response = admin_client.post(reverse(RELEASE), {"ref": old_ref, "post": "yes"})
    assert response.status_code == 302
    assert second.locked()
    token = second.fencing_token
    second.release()
    third = lock(name, ttl=10, timeout=5)
    with third:
        assert third.fencing_token > token
