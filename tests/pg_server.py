"""A PostgreSQL server of a test's own, to kill, pause and restart.

The suite's PostgreSQL on 127.0.0.1:5432 is shared by every test, so it is
never faulted. :class:`PostgresServer` starts another one (Debian's
binaries, a cluster in a temporary directory, a free loopback port) and
points the ``crashable`` alias of ``tests/settings.py`` at it, with the test
database and its tables; it kills, pauses and restarts exactly that server.
Its WAL writer waits 10 s between flushes, so that a commit that did not
wait for the flush is still unflushed when the server is killed.
"""

from __future__ import annotations

import atexit
import glob
import os
import shutil
import signal
import subprocess
import tempfile
import time

from django.db import connections

from .crash_workers import migrate
from .procs import run_in_processes
from .servers import free_port, unavailable, wait_listening

ALIAS = "crashable"
PORT_VARIABLE = "DISTLOCK_CRASHABLE_PORT"


def postgres_bindir() -> str | None:
    """The newest Debian PostgreSQL's programs (initdb, postgres), or None."""
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"),
        key=lambda path: int(path.split("/")[4]),
    )
    return os.path.dirname(found[-1]) if found else None


#: Servers started by this process and not stopped: killed when it exits, if
#: a test that failed (or a killed run) left them running.
_RUNNING: list[PostgresServer] = []


@atexit.register
def _kill_left_running() -> None:
    for server in list(_RUNNING):
        server.stop()


def _stat(pid: int | str) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command's name (state,
    parent pid, ...), or None if there is no such process."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            # pid (comm) state ppid ...: comm may hold spaces and parentheses.
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _running(pid: int) -> bool:
    """Whether ``pid`` is a process that has not exited (a zombie has)."""
    fields = _stat(pid)
    return fields is not None and fields[0] != "Z"


class PostgresServer:
    """One PostgreSQL server on a free loopback port, its cluster in a
    temporary directory, run as the ``postgres`` user when started by root.

    :meth:`start` the first time also points the ``crashable`` alias (and
    worker processes, through the environment) at it and creates the
    tables; :meth:`stop` points the alias back.
    """

    def __init__(self):
        self.bindir = postgres_bindir()
        if self.bindir is None:
            unavailable("PostgreSQL's initdb is not installed (postgresql package)")
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="distlock-pgserver-")
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
        self.saved: tuple | None = None
        self.paused: list[int] = []

    def start(self) -> PostgresServer:
        """Start it (again, after :meth:`kill`: on the same port and data)."""
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
            self.proc = subprocess.Popen(command, stdout=log, stderr=log, **self.user)
        if self not in _RUNNING:
            _RUNNING.append(self)
        wait_listening(self.proc, self.port, "postgres")
        self._wait_ready()
        if self.saved is None:
            try:
                self._attach()
            except BaseException:
                self.stop()
                raise
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

    def _attach(self) -> None:
        import psycopg

        entry = connections[ALIAS].settings_dict
        self.saved = entry["PORT"], os.environ.get(PORT_VARIABLE)
        entry["PORT"] = os.environ[PORT_VARIABLE] = str(self.port)
        with psycopg.connect(self.dsn("postgres"), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{entry["NAME"]}"')
        run_in_processes(migrate, [(ALIAS,)])

    def dsn(self, database: str) -> str:
        return f"host=127.0.0.1 port={self.port} user=postgres dbname={database}"

    def log(self) -> str:
        with open(os.path.join(self.dir, "server.log"), errors="replace") as f:
            return f.read()[-2000:]

    def processes(self) -> list[int]:
        """The postmaster and its children (backends, WAL writer, ...).

        Each child is a process group of its own (PostgreSQL calls
        ``setsid()`` in every child), so a fault signals each of them.
        """
        children = []
        for entry in os.listdir("/proc"):
            fields = _stat(entry) if entry.isdigit() else None
            if fields is not None and fields[1] == str(self.proc.pid):
                children.append(int(entry))
        return [self.proc.pid, *children]

    def _signal(self, signum: int, pids: list[int]) -> None:
        for pid in pids:
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        """SIGKILL the postmaster and every child: no shutdown, no flush."""
        pids = self.processes()
        self._signal(signal.SIGKILL, pids)
        self.proc.wait()
        self.paused = []
        # The test's own connection died with it: the next use reconnects.
        connections[ALIAS].close()
        # A child still attached to the shared memory would stop the restart.
        deadline = time.monotonic() + 10
        while any(_running(pid) for pid in pids[1:]):
            if time.monotonic() > deadline:
                raise RuntimeError(f"postgres processes {pids[1:]} outlived SIGKILL")
            time.sleep(0.01)

    def pause(self) -> None:
        """SIGSTOP the postmaster and every child (the stopped postmaster
        starts no other)."""
        self.paused = self.processes()
        self._signal(signal.SIGSTOP, self.paused)

    def resume(self) -> None:
        self._signal(signal.SIGCONT, self.paused)
        self.paused = []

    def stop(self) -> None:
        if self in _RUNNING:
            _RUNNING.remove(self)
        if self.proc is not None and self.proc.poll() is None:
            self.kill()
        if self.saved is not None:
            connections[ALIAS].settings_dict["PORT"] = self.saved[0]
            if self.saved[1] is None:
                os.environ.pop(PORT_VARIABLE, None)
            else:
                os.environ[PORT_VARIABLE] = self.saved[1]
        shutil.rmtree(self.dir, ignore_errors=True)
