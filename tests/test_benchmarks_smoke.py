"""The benchmark suite's quick mode runs end to end (smoke test, no speed asserted)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .servers import unavailable

ROOT = Path(__file__).resolve().parent.parent

# Not marked slow: CI runs it with the rest of the suite (about 45 s).
pytestmark = pytest.mark.redis


def test_quick_benchmark_run_completes(tmp_path):
    if shutil.which("redis-server") is None:
        unavailable("redis-server is not on PATH")
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--quick", "--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-5000:]
    report = (tmp_path / "latest.md").read_text()
    assert "## Targets (issue 7)" in report
    assert "crashed" not in report
    for section in ("## Uncontended", "## Four processes", "held locks on one Redis"):
        assert section in report, section
    assert (tmp_path / "bench_uncontended.png").stat().st_size > 0
    assert (tmp_path / "bench_contended.png").stat().st_size > 0
