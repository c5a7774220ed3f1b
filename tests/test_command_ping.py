"""``manage.py locks ping``: one round trip per backend, exit 1 if any failed."""

from __future__ import annotations

import io
import re

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import override_settings

from .manage_py import ManagePy
from .servers import RedisServer

pytestmark = [pytest.mark.redis, pytest.mark.django_db(transaction=True)]


def ping(*args):
    out, err = io.StringIO(), io.StringIO()
    call_command("locks", "ping", *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


@pytest.fixture
def server():
    """A redis-server of this test's own, which the test may stop."""
    server = RedisServer().start()
    yield server
    server.stop()


def setting(url: str) -> dict:
    return {
        "default": {
            "BACKEND": "django_distlock.backends.database.DatabaseLockBackend",
            "OPTIONS": {"DATABASE": "default"},
        },
        "cache": {
            "BACKEND": "django_distlock.backends.redis.RedisLockBackend",
            "LOCATION": url,
            "OPTIONS": {"SOCKET_CONNECT_TIMEOUT": 0.5, "SOCKET_TIMEOUT": 0.5},
        },
        "mem": {"BACKEND": "django_distlock.backends.locmem.LocMemLockBackend"},
    }


OK = re.compile(r"^(\w+): ok in \d+\.\d ms$")


def test_every_backend_answers(server):
    with override_settings(LOCKS=setting(server.url)):
        out, err = ping()
        assert err == ""
        lines = out.splitlines()
        assert [OK.match(line).group(1) for line in lines] == [
            "default",
            "cache",
            "mem",
        ]
        out, _ = ping("--using", "cache")
        assert OK.match(out.strip()).group(1) == "cache"
        with pytest.raises(CommandError, match="Unknown LOCKS alias 'nope'"):
            ping("--using", "nope")


def test_a_stopped_server_fails_the_ping(server, tmp_path):
    locks = setting(server.url)
    manage = ManagePy(tmp_path, locks)
    assert manage.run("locks", "ping").returncode == 0
    server.kill()
    with override_settings(LOCKS=locks):
        with pytest.raises(CommandError, match="1 of 3 backend") as raised:
            ping()
        assert raised.value.returncode == 1
    done = manage.run("locks", "ping")
    assert done.returncode == 1
    # The others are still pinged and reported.
    assert [OK.match(line).group(1) for line in done.stdout.splitlines()] == [
        "default",
        "mem",
    ]
    assert re.search(
        r"^cache: unreachable \(LockBackendError: .+\)$", done.stderr, re.M
    )
    assert "CommandError: 1 of 3 backend(s) unreachable: 'cache'." in done.stderr
    alone = manage.run("locks", "ping", "--using", "mem")
    assert alone.returncode == 0
    server.start()
    assert manage.run("locks", "ping", "--using", "cache").returncode == 0
