"""The quickstart's install lines work as written: the wheel it names is the
one a checkout builds, its extras exist, and the installed package imports."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
QUICKSTART = ROOT / "docs" / "quickstart.md"

pytestmark = pytest.mark.slow


def pip(*args: str, cwd: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", *args, "-q", "--disable-pip-version-check"],
        cwd=cwd,
        check=True,
        timeout=600,
    )


def test_quickstart_install_lines(tmp_path):
    page = QUICKSTART.read_text()
    lines = re.findall(r"^\$ (.*)$", page, re.M)
    # Not from an index: the package name alone is not how to get it.
    assert "pip install django-distlock" not in lines
    assert "pip install -e /path/to/django-distlock" in lines
    assert "pip wheel . --no-deps -w dist" in lines

    # The wheel, built from a checkout exactly as the page says: a copy of
    # this one, so that parallel runs never share a build directory.
    checkout = tmp_path / "django-distlock"
    shutil.copytree(
        ROOT,
        checkout,
        ignore=shutil.ignore_patterns(
            ".*", "build", "dist", "site", "*.egg-info", "__pycache__", "*.sqlite3"
        ),
    )
    pip("wheel", ".", "--no-deps", "-w", str(tmp_path / "dist"), cwd=checkout)
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    assert f'pip install "dist/{wheel.name}"' in lines
    with zipfile.ZipFile(wheel) as archive:
        (metadata,) = [n for n in archive.namelist() if n.endswith("/METADATA")]
        provided = set(
            re.findall(
                r"^Provides-Extra: (\S+)$", archive.read(metadata).decode(), re.M
            )
        )
    named = set(re.findall(r"^\| `\[([a-z-]+)\]` \|", page, re.M))
    assert named == provided - {"test", "bench"}

    # Installed (its dependencies are here already), it imports from there.
    pip(
        "install",
        "--no-deps",
        "--target",
        str(tmp_path / "site"),
        str(wheel),
        cwd=tmp_path,
    )
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            "import django_distlock; print(django_distlock.__file__)",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(tmp_path / "site")},
        timeout=120,
        check=True,
    )
    assert result.stdout.startswith(str(tmp_path / "site"))
    installed = tmp_path / "site" / "django_distlock"
    assert (installed / "templates" / "admin" / "django_distlock").is_dir()
    assert (installed / "migrations" / "0001_initial.py").is_file()
