"""A missing driver is a system check error that names the ``pip install`` line.

The check runs in a child interpreter that sees Django and this package
alone (no site-packages), the way a project that installed
``django-distlock`` without its extras sees them.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CHILD = textwrap.dedent(
    """
    import django
    from django.conf import settings
    from django.core.management import call_command
    from django.core.management.base import SystemCheckError

    settings.configure(
        INSTALLED_APPS=["django_distlock"],
        DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3",
                               "NAME": ":memory:"}},
        LOCKS={
            "default": {
                "BACKEND": "django_distlock.backends.database.DatabaseLockBackend"
            },
            "cache": {"BACKEND": "django_distlock.backends.redis.RedisLockBackend",
                      "LOCATION": "redis://127.0.0.1:6379/0"},
            "quorum": {"BACKEND": "django_distlock.backends.redlock.RedlockBackend",
                       "LOCATION": ["redis://127.0.0.1:1", "redis://127.0.0.1:2",
                                    "redis://127.0.0.1:3"]},
            "zk": {"BACKEND": "django_distlock.backends.zookeeper.ZooKeeperLockBackend",
                   "LOCATION": "127.0.0.1:2181"},
        },
    )
    django.setup()
    for module in ("redis", "kazoo"):
        try:
            __import__(module)
        except ImportError:
            pass
        else:
            raise SystemExit(f"{module} is importable: the test is void")
    try:
        call_command("check")
    except SystemCheckError as e:
        print(e)
    else:
        print("no errors")
    """
)


def _django_alone(tmp_path: Path) -> Path:
    """A directory holding Django, its dependencies and this package only."""
    alone = tmp_path / "site"
    alone.mkdir()
    for module in ("django", "asgiref", "sqlparse"):
        spec = importlib.util.find_spec(module)
        assert spec is not None and spec.origin is not None
        (alone / module).symlink_to(Path(spec.origin).parent)
    (alone / "django_distlock").symlink_to(ROOT / "django_distlock")
    return alone


def test_missing_drivers_are_check_errors_with_the_pip_line(tmp_path):
    alone = _django_alone(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(alone)}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    out = subprocess.run(
        [sys.executable, "-S", "-c", CHILD],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert text.count("distlock.E019") == 3, text
    assert 'pip install "django-distlock[redis]"' in text
    assert 'pip install "django-distlock[zookeeper]"' in text
    for alias in ("cache", "quorum", "zk"):
        assert f"LOCKS['{alias}']" in text
    assert "LOCKS['default']" not in text  # the database backend needs nothing
