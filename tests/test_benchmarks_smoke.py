"""The benchmark suite's quick mode runs end to end (smoke test, no speed asserted)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.kinds import BEFORE_COMMIT

from .servers import IN_CI, unavailable

ROOT = Path(__file__).resolve().parent.parent

# Not marked slow: CI runs it with the rest of the suite (about a minute).
pytestmark = pytest.mark.redis


def _has_commit(commit: str) -> bool:
    """Return True if this clone holds ``commit`` (a shallow one may not)."""
    found = subprocess.run(
        ["git", "-C", str(ROOT), "cat-file", "-e", f"{commit}^{{commit}}"],
        capture_output=True,
    )
    return found.returncode == 0


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
    # The async cycle with many tasks on one loop, beside the floor's.
    assert "tasks on one loop, × the async raw floor the same way" in report
    for section in (
        "## Uncontended",
        "## Four processes",
        "held locks on one Redis",
        "## Shared locks and semaphores",
        "### Targets (issue 22)",
        "8 processes, 1 ms critical section",
    ):
        assert section in report, section
    # The kinds scenario: the limit-3 semaphore never granted a fourth
    # permit; the old package ran beside the new one when the clone has it.
    backends = ["Redis", "PostgreSQL"] if IN_CI else ["Redis"]
    for backend in backends:
        assert f"| {backend} | semaphore(limit=3) |" in report, backend
        assert f"{backend}, 8 processes: no grant over the limit | 0 / 0 |" in report
        if _has_commit(BEFORE_COMMIT):
            assert f"| {backend} | exclusive lock(), before issue 22 |" in report
    for plot in ("uncontended", "contended", "kinds"):
        assert (tmp_path / f"bench_{plot}.png").stat().st_size > 0, plot
