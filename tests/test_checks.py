"""System checks report every malformed LOCKS entry, each with a hint.

Redlock (E011, W001) and database (E012) ids are tested with their backends.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.checks import run_checks
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.test import override_settings

from django_distlock.checks import check_locks_setting

REDIS = "django_distlock.backends.redis.RedisLockBackend"
LOCMEM = "django_distlock.backends.locmem.LocMemLockBackend"
URL = "redis://127.0.0.1:6399/0"
DJANGO_REDIS = {
    "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
    "plain": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
    "shared": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": URL},
}


def redis_entry(**extra):
    return {"BACKEND": REDIS, "LOCATION": URL, **extra}


def entries(**entry):
    return {"default": {"BACKEND": LOCMEM, **entry}}


# (LOCKS, the one id it must produce)
BROKEN = [
    pytest.param(["not", "a", "dict"], "distlock.E001", id="E001-list"),
    pytest.param({"default": "redis://x"}, "distlock.E001", id="E001-entry-str"),
    pytest.param({"other": {"BACKEND": LOCMEM}}, "distlock.E002", id="E002"),
    pytest.param({}, "distlock.E002", id="E002-empty"),
    pytest.param({"default": {}}, "distlock.E003", id="E003-missing"),
    pytest.param({"default": {"BACKEND": 42}}, "distlock.E003", id="E003-not-str"),
    pytest.param(
        {"default": {"BACKEND": "nowhere.Backend"}}, "distlock.E003", id="E003-import"
    ),
    pytest.param(
        {"default": {"BACKEND": "django_distlock.backends.redis.Nope"}},
        "distlock.E003",
        id="E003-attribute",
    ),
    pytest.param(
        {"default": {"BACKEND": "collections.OrderedDict"}},
        "distlock.E003",
        id="E003-not-a-backend",
    ),
    pytest.param({"default": {"BACKEND": REDIS}}, "distlock.E004", id="E004-none"),
    pytest.param(
        {"default": redis_entry(LOCATION="127.0.0.1:6379")},
        "distlock.E004",
        id="E004-no-scheme",
    ),
    pytest.param(
        {"default": redis_entry(LOCATION=[URL, URL, URL])},
        "distlock.E004",
        id="E004-list",
    ),
    pytest.param(entries(TTL=0), "distlock.E005", id="E005-zero"),
    pytest.param(entries(TTL=-1), "distlock.E005", id="E005-negative"),
    pytest.param(entries(TTL="30"), "distlock.E005", id="E005-str"),
    pytest.param(entries(TTL=True), "distlock.E005", id="E005-bool"),
    pytest.param(entries(TTL=float("nan")), "distlock.E005", id="E005-nan"),
    pytest.param(entries(TTL=float("inf")), "distlock.E005", id="E005-inf"),
    pytest.param(entries(TIMEOUT=-1), "distlock.E006", id="E006-negative"),
    pytest.param(entries(TIMEOUT="10"), "distlock.E006", id="E006-str"),
    pytest.param(entries(AUTO_RENEW="yes"), "distlock.E007", id="E007"),
    pytest.param(entries(KEY_PREFIX=1), "distlock.E008", id="E008"),
    pytest.param(entries(OPTIONS=[]), "distlock.E009", id="E009-not-dict"),
    pytest.param(
        {"default": redis_entry(OPTIONS={"SOCKET_TIMEUOT": 1})},
        "distlock.E009",
        id="E009-unknown-option",
    ),
    pytest.param(
        {"default": redis_entry(OPTIONS={"SOCKET_TIMEOUT": 0})},
        "distlock.E009",
        id="E009-socket-timeout",
    ),
    pytest.param(
        {"default": redis_entry(OPTIONS={"SOCKET_CONNECT_TIMEOUT": None})},
        "distlock.E009",
        id="E009-connect-timeout",
    ),
    pytest.param(
        {"default": redis_entry(OPTIONS={"CONNECTION_POOL_KWARGS": [1]})},
        "distlock.E009",
        id="E009-pool-kwargs",
    ),
    pytest.param(
        {"default": {"BACKEND": REDIS, "OPTIONS": {"CACHE": "plain"}}},
        "distlock.E010",
        id="E010-not-django-redis",
    ),
    pytest.param(
        {"default": {"BACKEND": REDIS, "OPTIONS": {"CACHE": "missing"}}},
        "distlock.E010",
        id="E010-missing",
    ),
    pytest.param(entries(TIME_OUT=5), "distlock.E013", id="E013"),
    pytest.param(entries(MAX_HOLD=0), "distlock.E024", id="E024-zero"),
    pytest.param(entries(MAX_HOLD="600"), "distlock.E024", id="E024-str"),
    pytest.param(entries(MAX_HOLD=float("inf")), "distlock.E024", id="E024-inf"),
]


def distlock_messages():
    return [m for m in run_checks() if m.id and m.id.startswith("distlock.")]


@pytest.mark.parametrize(("locks_setting", "expected"), BROKEN)
def test_broken_setting_reported(locks_setting, expected):
    with override_settings(LOCKS=locks_setting, CACHES=DJANGO_REDIS, DEBUG=True):
        messages = check_locks_setting()
        assert [m.id for m in messages] == [expected], messages
        (message,) = messages
        assert message.hint
        assert message.obj == "settings.LOCKS"
        assert message.is_serious()
        # The same through Django's registry (``manage.py check``).
        assert [m.id for m in distlock_messages()] == [expected]


def test_tiny_ttl_renewed_without_a_bound_warns():
    with override_settings(LOCKS=entries(TTL=0.5), DEBUG=True):
        (message,) = check_locks_setting()
    assert message.id == "distlock.W004"
    assert "MAX_HOLD" in message.hint and not message.is_serious()
    for fine in (
        entries(TTL=0.5, MAX_HOLD=60),
        entries(TTL=0.5, AUTO_RENEW=False),
        entries(TTL=1),
        entries(MAX_HOLD=600),
    ):
        with override_settings(LOCKS=fine, DEBUG=True):
            assert check_locks_setting() == [], fine


def test_locmem_without_debug_warns():
    with override_settings(LOCKS=entries(), DEBUG=False):
        (message,) = check_locks_setting()
    assert message.id == "distlock.W002"
    assert message.hint and not message.is_serious()
    with override_settings(LOCKS=entries(), DEBUG=True):
        assert check_locks_setting() == []


def test_locmem_reads_no_options():
    with override_settings(LOCKS=entries(OPTIONS={"BOGUS": 1}), DEBUG=True):
        (message,) = check_locks_setting()
    assert message.id == "distlock.E009" and "BOGUS" in message.msg


@pytest.mark.parametrize(
    "locks_setting",
    [
        pytest.param(None, id="no-LOCKS"),
        pytest.param(entries(), id="locmem"),
        pytest.param(
            {
                "default": redis_entry(
                    TTL=0.5,
                    TIMEOUT=None,
                    AUTO_RENEW=False,
                    KEY_PREFIX="p",
                    OPTIONS={
                        "SOCKET_TIMEOUT": 1,
                        "SOCKET_CONNECT_TIMEOUT": 0.5,
                        "CONNECTION_POOL_KWARGS": {"max_connections": 10},
                    },
                ),
                "cached": {"BACKEND": REDIS, "OPTIONS": {"CACHE": "shared"}},
                "tls": redis_entry(LOCATION="rediss://h:6380/1", TIMEOUT=0),
                "socket": redis_entry(LOCATION="unix:///tmp/redis.sock"),
            },
            id="redis",
        ),
    ],
)
def test_valid_settings_give_no_message(locks_setting):
    with override_settings(LOCKS=locks_setting, CACHES=DJANGO_REDIS, DEBUG=True):
        if locks_setting is None:
            from django.conf import settings

            del settings.LOCKS
        assert check_locks_setting() == []
        assert distlock_messages() == []


def test_every_error_reported_at_once():
    broken = {
        "default": {"BACKEND": REDIS, "TTL": 0, "TIMEOUT": -1, "AUTO_RENEW": 1},
        "other": {"BACKEND": "nowhere.X", "KEY_PREFIX": None},
    }
    with override_settings(LOCKS=broken):
        ids = sorted(m.id for m in check_locks_setting())
    assert ids == [
        "distlock.E003",
        "distlock.E004",
        "distlock.E005",
        "distlock.E006",
        "distlock.E007",
        "distlock.E008",
    ]


def test_check_command_reports_them():
    with override_settings(LOCKS=entries(TTL=0, TIMEOUT="soon"), DEBUG=True):
        with pytest.raises(SystemCheckError) as info:
            call_command("check")
    text = str(info.value)
    assert "distlock.E005" in text and "distlock.E006" in text
    assert "HINT" in text and "settings.LOCKS" in text


def test_manage_py_check_in_a_real_process(tmp_path):
    (tmp_path / "broken_settings.py").write_text(
        "from tests.settings import *  # noqa\n"
        "LOCKS = {'default': {'BACKEND': "
        "'django_distlock.backends.redis.RedisLockBackend'}}\n"
    )
    root = Path(__file__).resolve().parent.parent
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "broken_settings",
        "PYTHONPATH": os.pathsep.join([str(tmp_path), str(root)]),
    }
    result = subprocess.run(
        [sys.executable, "-m", "django", "check"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )
    assert result.returncode == 1
    assert "distlock.E004" in result.stderr
    assert "HINT: Set LOCATION" in result.stderr


# -- silent misconfiguration --------------------------------------------------


def test_lock_without_s_is_reported():
    lock_like = {"default": {"BACKEND": LOCMEM}}
    with override_settings(LOCK=lock_like, DISTLOCK_LOCKS=lock_like, DEBUG=True):
        messages = [m for m in run_checks() if m.id == "distlock.E017"]
        assert sorted(m.obj for m in messages) == [
            "settings.DISTLOCK_LOCKS",
            "settings.LOCK",
        ]
        (message,) = [m for m in messages if m.obj == "settings.LOCK"]
        assert message.msg == (
            "settings.LOCK looks like a LOCKS setting, but django_distlock reads "
            "LOCKS only."
        )
        assert message.hint == "Rename LOCK to LOCKS."
        from django.conf import settings

        del settings.LOCKS
        (message, _) = sorted(
            (m for m in run_checks() if m.id == "distlock.E017"), key=lambda m: m.obj
        )
        assert message.msg.endswith(
            ": without it, every lock uses the default database backend."
        )
    with override_settings(LOCK={"BACKEND": LOCMEM}):
        (message,) = [m for m in run_checks() if m.id == "distlock.E017"]
        assert message.obj == "settings.LOCK"
    # A project's own LOCK setting is its business.
    with override_settings(LOCK={"default": {"BACKEND": "myapp.Thing"}}, LOCKS_X=3):
        assert [m for m in run_checks() if m.id == "distlock.E017"] == []


def run_django(tmp_path, settings: str, *args: str) -> subprocess.CompletedProcess:
    """Run ``python <args>`` with ``settings`` as the settings module."""
    (tmp_path / "fw_settings.py").write_text(settings)
    root = Path(__file__).resolve().parent.parent
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "fw_settings",
        "PYTHONPATH": os.pathsep.join([str(tmp_path), str(root)]),
    }
    return subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )


def test_app_missing_from_installed_apps(tmp_path):
    # A project app whose models use django_distlock, the app itself missing.
    (tmp_path / "shop").mkdir()
    (tmp_path / "shop" / "__init__.py").write_text("")
    (tmp_path / "shop" / "models.py").write_text("from django_distlock import lock\n")
    settings = (
        "SECRET_KEY = 'x'\n"
        "INSTALLED_APPS = ['django.contrib.contenttypes', 'shop']\n"
        "DATABASES = {}\n"
        "LOCKS = {'default': {'BACKEND': "
        "'django_distlock.backends.locmem.LocMemLockBackend'}}\n"
    )
    result = run_django(tmp_path, settings, "-m", "django", "check")
    assert result.returncode == 1
    assert (
        "settings.INSTALLED_APPS: (distlock.E018) django_distlock is imported, but "
        "'django_distlock' is not in INSTALLED_APPS." in result.stderr
    )
    assert "HINT: Add 'django_distlock' to INSTALLED_APPS" in result.stderr
    # And at run time, before anything else can go wrong.
    script = (
        "import django; django.setup()\n"
        "from django_distlock import lock\n"
        "try:\n"
        "    lock('x').acquire()\n"
        "except Exception as e:\n"
        "    print(type(e).__name__, e)\n"
    )
    result = run_django(tmp_path, settings, "-c", script)
    assert result.stdout == (
        "InvalidLockBackendError 'django_distlock' is not in INSTALLED_APPS: add it "
        "there. Its system checks, its lock table (migrations) and its admin page "
        "need it.\n"
    ), result.stderr


def test_forgotten_migrate_says_so(tmp_path):
    settings = (
        "from tests.settings import *  # noqa\n"
        "DATABASES = {'default': {'ENGINE': 'django.db.backends.sqlite3', "
        f"'NAME': {str(tmp_path / 'never-migrated.sqlite3')!r}}}}}\n"
        "LOCKS = {'default': {'BACKEND': "
        "'django_distlock.backends.database.DatabaseLockBackend'}}\n"
    )
    script = (
        "import asyncio, django; django.setup()\n"
        "from django.test import Client\n"
        "from django_distlock import lock\n"
        "async def alock():\n"
        "    async with lock('x'):\n"
        "        pass\n"
        "for attempt in (lambda: lock('x').acquire(), lambda: asyncio.run(alock()),\n"
        "                lambda: Client().get('/buy-now/x/')):\n"
        "    try:\n"
        "        attempt()\n"
        "    except Exception as e:\n"
        "        print(type(e).__name__, e)\n"
    )
    result = run_django(tmp_path, settings, "-c", script)
    expected = (
        "InvalidLockBackendError The lock table 'django_distlock_lockrecord' of "
        "LOCKS['default'] does not exist on database 'default': run 'python "
        "manage.py migrate django_distlock --database default'.\n"
    )
    assert result.stdout == expected * 3, result.stderr
