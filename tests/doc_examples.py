"""Run the example project files of a docs page with pytest, in a subprocess.

A page shows files of a small project as fenced blocks with a ``title``
(```` ```python title="shop/jobs.py" ````, ```` ```ini title="pytest.ini" ````);
:func:`run_page_project` writes them to a temporary directory (with a
``manage.py`` and, unless the page shows one, ``mysite/settings.py``) and runs
pytest there, as the reader would.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

TITLED = re.compile(
    r'^(?P<indent>[ \t]*)(?P<fence>`{3,})\w+ title="(?P<title>[^"]+)"[^\n]*\n'
    r"(?P<code>.*?)^(?P=indent)(?P=fence)[ \t]*$",
    re.M | re.S,
)

SETTINGS = """\
SECRET_KEY = "docs-example"
USE_TZ = True
INSTALLED_APPS = [
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django_distlock",
]
DATABASES = {{
    "default": {{"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}
}}
# A Redis that is not running: the examples must not need it.
LOCKS = {{
    "default": {{
        "BACKEND": "django_distlock.backends.redis.RedisLockBackend",
        "LOCATION": "redis://127.0.0.1:{port}/0",
    }}
}}
{extra}
"""


def page_files(page: str) -> dict[str, str]:
    """Return ``{title: code}`` of the titled blocks of ``page``."""
    text = (ROOT / page).read_text(encoding="utf-8")
    files: dict[str, str] = {}
    for match in TITLED.finditer(text):
        indent = match.group("indent")
        lines = [
            line[len(indent) :] if line.startswith(indent) else line
            for line in match.group("code").splitlines()
        ]
        files[match.group("title")] = "\n".join(lines) + "\n"
    return files


def run_page_project(
    page: str,
    *,
    passed: int,
    args: tuple[str, ...] = (),
    settings_extra: str = "",
    env: dict[str, str] | None = None,
    timeout: float = 240,
) -> str:
    """Write the page's files, run pytest on them; assert ``passed`` tests passed.

    Return pytest's output.
    """
    from .servers import free_port

    with tempfile.TemporaryDirectory(prefix="distlock-docs-") as tmp:
        base = Path(tmp)
        files = {"manage.py": "", **page_files(page)}
        files.setdefault(
            "mysite/settings.py",
            SETTINGS.format(port=free_port(), extra=settings_extra),
        )
        for title, code in files.items():
            path = base / title
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(code)
            for parent in path.relative_to(base).parents:
                if parent != Path(".") and path.suffix == ".py":
                    (base / parent / "__init__.py").touch()
        environ = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
        result = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
            cwd=base,
            env={**environ, **(env or {})},
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert re.search(rf"\b{passed} passed\b", output), output
    return output
