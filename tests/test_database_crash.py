"""The database backend across a crash of its PostgreSQL server.

A grant is durable: once a holder has been told it holds a lease, a server
crash (SIGKILL of the postmaster and every backend, no shutdown) cannot
lose it, and the name's next fencing token after the restart is larger
than every one given out before. That is an acquisition, a semaphore's
permit, and a permit a release handed over to the waiter first in line
(migration 0010: that release did not wait for the WAL flush, and the next
holder after a crash got the handed token again).

The fixture starts a PostgreSQL server of its own (Debian's binaries, a
cluster in a temporary directory, a free loopback port), kills and
restarts exactly that server, and the ``crashable`` alias of
``tests/settings.py`` points at it. Its WAL writer waits 10 s between
flushes, so that a commit that did not wait for the flush is still
unflushed when the server is killed.
"""

from __future__ import annotations

import glob
import os
import shutil
import signal
import subprocess
import tempfile
import time

import pytest
from django.db import connections
from django.test import override_settings

from .crash_workers import grant, migrate, take_again
from .procs import run_in_processes
from .servers import free_port, unavailable, wait_listening
from .test_database_backend import db_locks

pytestmark = pytest.mark.postgres


def postgres_bindir() -> str | None:
    """The newest Debian PostgreSQL's programs (initdb, postgres), or None."""
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"),
        key=lambda path: int(path.split("/")[4]),
    )
    return os.path.dirname(found[-1]) if found else None


class PostgresServer:
    """One PostgreSQL server on a free loopback port, its cluster in a
    temporary directory, run as the ``postgres`` user when started by root."""

    def __init__(self):
        self.bindir = postgres_bindir()
        if self.bindir is None:
            unavailable("PostgreSQL's initdb is not installed (postgresql package)")
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="distlock-pgcrash-")
        self.data = os.path.join(self.dir, "data")
        self.user = {}
        if os.geteuid() == 0:  # initdb and postgres refuse to run as root
            shutil.chown(self.dir, user="postgres")
            self.user = {"user": "postgres", "group": "postgres", "extra_groups": []}
        subprocess.run(
            [f"{self.bindir}/initdb", "-D", self.data, "-U", "postgres"]
            + ["-A", "trust", "--no-sync"],
            check=True,
            stdout=subprocess.DEVNULL,
            **self.user,
        )
        self.proc: subprocess.Popen | None = None

    def start(self) -> PostgresServer:
        """Start it (again, after :meth:`crash`: on the same port and data)."""
        settings = {
            "listen_addresses": "127.0.0.1",
            "unix_socket_directories": self.dir,
            "wal_writer_delay": "10s",
            "wal_writer_flush_after": "1GB",
        }
        command = [f"{self.bindir}/postgres", "-D", self.data, "-p", str(self.port)]
        for key, value in settings.items():
            command += ["-c", f"{key}={value}"]
        with open(os.path.join(self.dir, "server.log"), "ab") as log:
            # Its own process group: a crash kills the server and every
            # backend at once, and nothing else.
            self.proc = subprocess.Popen(
                command, stdout=log, stderr=log, start_new_session=True, **self.user
            )
        wait_listening(self.proc, self.port, "postgres")
        self._wait_ready()
        return self

    def _wait_ready(self) -> None:
        """Wait until it accepts sessions (it listens during recovery)."""
        import psycopg

        deadline = time.monotonic() + 30
        while True:
            try:
                psycopg.connect(self.dsn("postgres"), connect_timeout=2).close()
                return
            except psycopg.OperationalError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise RuntimeError(
                        f"postgres did not come up: {self.log()}"
                    ) from None
                time.sleep(0.05)

    def dsn(self, database: str) -> str:
        return f"host=127.0.0.1 port={self.port} user=postgres dbname={database}"

    def log(self) -> str:
        with open(os.path.join(self.dir, "server.log"), errors="replace") as f:
            return f.read()[-2000:]

    def crash(self) -> None:
        """SIGKILL the postmaster and every backend: no shutdown, no flush."""
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.crash()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="module")
def crashable(postgres_available):
    """A PostgreSQL server of the test's own, with the tables; the
    ``crashable`` alias (and worker processes, through the environment)
    point at it."""
    import psycopg

    server = PostgresServer().start()
    entry = connections["crashable"].settings_dict
    saved = entry["PORT"], os.environ.get("DISTLOCK_CRASHABLE_PORT")
    entry["PORT"] = os.environ["DISTLOCK_CRASHABLE_PORT"] = str(server.port)
    try:
        with psycopg.connect(server.dsn("postgres"), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{entry["NAME"]}"')
        run_in_processes(migrate, [("crashable",)])
        yield server
    finally:
        entry["PORT"] = saved[0]
        if saved[1] is None:
            os.environ.pop("DISTLOCK_CRASHABLE_PORT", None)
        else:
            os.environ["DISTLOCK_CRASHABLE_PORT"] = saved[1]
        server.stop()


@pytest.mark.parametrize("how", ["exclusive", "permit", "handed permit"])
def test_a_grant_outlives_a_server_crash(crashable, how):
    name = f"crash:{how}"
    with override_settings(LOCKS=db_locks("crashable")):
        [before] = run_in_processes(grant, [(name, how)])
        crashable.crash()
        crashable.start()
        [after] = run_in_processes(take_again, [(name, how)])
    assert after > before, (
        f"the token {before} given out before the crash was given out again "
        f"({after}): the grant was lost"
    )
