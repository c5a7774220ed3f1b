"""The README's first command: the flash-sale demo, end to end, small."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def run_demo(tmp_path, *args, redis_url=None):
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("DJANGO_SETTINGS_MODULE", "REDIS_URL")
    }
    env["DEMO_DB"] = str(tmp_path / "demo.sqlite3")
    if redis_url:
        env["REDIS_URL"] = redis_url
    proc = subprocess.run(
        [sys.executable, "testproject/manage.py", "flash_sale", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return proc


def figures(output: str) -> dict[str, int]:
    sold = re.search(r"items sold:\s+(\d+) of (\d+)", output)
    oversold = re.search(r"oversold:\s+(\d+)", output)
    return {
        "sold": int(sold.group(1)),
        "stock": int(sold.group(2)),
        "oversold": int(oversold.group(1)),
    }


@pytest.mark.parametrize("where", ["database", "redis"])
def test_flash_sale_never_oversells(tmp_path, request, where):
    redis_url = request.getfixturevalue("redis_url") if where == "redis" else None
    proc = run_demo(tmp_path, "--stock", "8", "--processes", "3", redis_url=redis_url)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    out = proc.stdout
    assert figures(out) == {"sold": 8, "stock": 8, "oversold": 0}
    assert "lock wait:" in out and "p50" in out and "p99" in out
    assert "423 locked" in out
    assert "/admin/django_distlock/lock/" in out
    assert "createsuperuser" in out
    expected = "database backend" if where == "database" else "Redis at"
    assert expected in out
