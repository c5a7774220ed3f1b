"""A PostgreSQL server of a test's own (see :mod:`tests.db_servers`).

:class:`PostgresServer` runs Debian's ``initdb`` and ``postgres`` and points
the ``crashable`` alias at the server. Its WAL writer waits 10 s between
flushes, so that a commit that did not wait for the flush is still
unflushed when the server is killed.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess

from .db_servers import OwnServer, _stat
from .routers import OWN_SERVERS
from .servers import unavailable

ALIAS = "crashable"
PORT_VARIABLE = OWN_SERVERS[ALIAS]


def postgres_bindir() -> str | None:
    """The newest Debian PostgreSQL's programs (initdb, postgres), or None."""
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"),
        key=lambda path: int(path.split("/")[4]),
    )
    return os.path.dirname(found[-1]) if found else None


class PostgresServer(OwnServer):
    """One PostgreSQL server, run as the ``postgres`` user when started by
    root, for the ``crashable`` alias."""

    alias = ALIAS
    port_variable = PORT_VARIABLE
    program = "postgres"

    def __init__(self):
        self.bindir = postgres_bindir()
        if self.bindir is None:
            unavailable("PostgreSQL's initdb is not installed (postgresql package)")
        super().__init__()
        self.data = os.path.join(self.dir, "data")
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

    def command(self) -> list[str]:
        settings = {
            "listen_addresses": "127.0.0.1",
            "unix_socket_directories": self.dir,
            "wal_writer_delay": "10s",
            "wal_writer_flush_after": "1GB",
        }
        command = [f"{self.bindir}/postgres", "-D", self.data, "-p", str(self.port)]
        for key, value in settings.items():
            command += ["-c", f"{key}={value}"]
        return command

    def _wait_ready(self) -> None:
        """Wait until it accepts sessions (it listens during recovery)."""
        import psycopg

        self._wait(
            lambda: psycopg.connect(self.dsn("postgres"), connect_timeout=2),
            psycopg.OperationalError,
        )

    def create_database(self, name: str) -> None:
        import psycopg

        with psycopg.connect(self.dsn("postgres"), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')

    def dsn(self, database: str) -> str:
        return f"host=127.0.0.1 port={self.port} user=postgres dbname={database}"

    def processes(self) -> list[int]:
        """The postmaster and its children (backends, WAL writer, ...).

        Each child is a process group of its own (PostgreSQL calls
        ``setsid()`` in every child), so a fault signals each of them (the
        stopped postmaster starts no other).
        """
        children = []
        for entry in os.listdir("/proc"):
            fields = _stat(entry) if entry.isdigit() else None
            if fields is not None and fields[1] == str(self.proc.pid):
                children.append(int(entry))
        return [self.proc.pid, *children]
