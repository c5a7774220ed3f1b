"""Run the test project's ``manage.py`` in real, separate processes.

Each process gets a settings module of its own, written to a temporary
directory: the test settings, the database names of the running test session
(so a subprocess sees the test database) and the LOCKS in force.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from pathlib import Path

from django.conf import settings
from django.db import connections

ROOT = Path(__file__).resolve().parent.parent
MANAGE = ROOT / "testproject" / "manage.py"
_numbers = itertools.count()


class ManagePy:
    """``manage.py`` with the settings of the running test, LOCKS as given."""

    def __init__(self, directory: Path, locks: dict | None = None, extra: str = ""):
        databases = {}
        for alias, entry in settings.DATABASES.items():
            entry = dict(entry)
            entry["NAME"] = connections[alias].settings_dict["NAME"]
            databases[alias] = entry
        module = f"distlock_settings_{os.getpid()}_{next(_numbers)}"
        locks = settings.LOCKS if locks is None else locks
        (directory / f"{module}.py").write_text(
            "from tests.settings import *  # noqa\n\n"
            f"DATABASES = {databases!r}\n"
            f"LOCKS = {locks!r}\n{extra}"
        )
        self.env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": module,
            "PYTHONPATH": os.pathsep.join([str(ROOT), str(directory)]),
            "PYTHONUNBUFFERED": "1",
        }

    def argv(self, *args: str) -> list[str]:
        return [sys.executable, str(MANAGE), *args]

    def start(self, *args: str) -> subprocess.Popen:
        """Start ``manage.py ARGS`` and return the process (not waited for)."""
        return subprocess.Popen(
            self.argv(*args),
            env=self.env,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def run(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        """Run ``manage.py ARGS`` to completion."""
        return subprocess.run(
            self.argv(*args),
            env=self.env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
