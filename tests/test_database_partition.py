"""The database backend when its PostgreSQL server is cut off.

The server (one of the test's own, :mod:`tests.pg_server`) stays up, but
iptables drops every packet to and from its loopback port: what a network
partition, or a host that froze, looks like to a client. A call on a
connection opened before must fail with ``LockBackendError`` within
seconds (the lock connections' libpq timeouts), not hang while TCP
retransmits for a quarter of an hour.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
from contextlib import contextmanager

import pytest
from django.test import override_settings

from .crash_workers import across_partition
from .pg_server import PostgresServer
from .procs import run_in_processes
from .servers import unavailable
from .test_database_backend import db_locks

pytestmark = pytest.mark.postgres


def iptables() -> str:
    path = shutil.which("iptables") or "/usr/sbin/iptables"
    if not os.access(path, os.X_OK):
        unavailable("iptables is not installed (scripts/bootstrap installs it)")
    return path


@contextmanager
def cut_off(port: int):
    """Drop every loopback packet to and from ``port``, and nothing else."""
    binary = iptables()
    rules = [
        ["INPUT", "-i", "lo", "-p", "tcp", "--dport", str(port), "-j", "DROP"],
        ["INPUT", "-i", "lo", "-p", "tcp", "--sport", str(port), "-j", "DROP"],
    ]
    added = []
    try:
        for rule in rules:
            subprocess.run([binary, "-I", *rule], check=True)
            added.append(rule)
        yield
    finally:
        for rule in added:
            subprocess.run([binary, "-D", *rule], check=True)


@pytest.fixture
def pgserver(postgres_available):
    iptables()
    server = PostgresServer().start()
    yield server
    server.stop()


def test_a_call_fails_quickly_on_a_server_cut_off(pgserver, tmp_path):
    ready, go = tmp_path / "ready", tmp_path / "go"
    results = []

    def worker():
        job = ("partition", str(ready), str(go))
        results.extend(run_in_processes(across_partition, [job], timeout=60))

    with override_settings(LOCKS=db_locks("crashable")):
        thread = threading.Thread(target=worker)
        thread.start()
        deadline = time.monotonic() + 30
        while not ready.exists():
            assert thread.is_alive() and time.monotonic() < deadline, "never held"
            time.sleep(0.01)
        with cut_off(pgserver.port):
            go.touch()
            thread.join(60)
    assert results, "the worker did not answer"
    [(raised, seconds)] = results
    assert raised == "LockBackendError", raised
    assert seconds < 10, f"the release took {seconds:.1f} s to fail"
