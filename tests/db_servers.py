"""A database server of a test's own, to kill, pause, restart or cut off.

The suite's PostgreSQL (127.0.0.1:5432) and MariaDB (3306) are shared by
every test, so they are never faulted. A subclass of :class:`OwnServer`
(:class:`tests.pg_server.PostgresServer`,
:class:`tests.mariadb_server.MariaDBServer`) starts another one from
Debian's binaries, its data in a temporary directory, on a free loopback
port, and points one alias of ``tests/settings.py`` at it (worker
processes too, through the environment), with the test database and its
tables; it kills, pauses and restarts exactly that server.
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import subprocess
import tempfile
import time

from django.db import connections

from .crash_workers import migrate
from .procs import run_in_processes
from .servers import free_port, wait_listening

#: Servers started by this process and not stopped: killed when it exits, if
#: a test that failed (or a killed run) left them running.
_RUNNING: list[OwnServer] = []


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


class OwnServer:
    """One database server on a free loopback port, its data in a temporary
    directory.

    :meth:`start` the first time also points :attr:`alias` (and worker
    processes, through :attr:`port_variable`) at it and creates the tables;
    :meth:`stop` points them back. A subclass makes the data directory in
    its ``__init__`` and says how to start the server (:meth:`command`), when
    it answers (:meth:`_wait_ready`) and how to create a database.
    """

    #: The alias of tests/settings.py pointed at this server.
    alias = ""
    #: The environment variable that gives worker processes its port.
    port_variable = ""
    #: The program, in error messages.
    program = ""

    def __init__(self):
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix=f"distlock-{self.program}-")
        #: subprocess keywords to run the server as another user.
        self.user: dict = {}
        self.proc: subprocess.Popen | None = None
        self.saved: tuple | None = None
        self.paused: list[int] = []

    def command(self) -> list[str]:
        raise NotImplementedError

    def _wait_ready(self) -> None:
        raise NotImplementedError

    def create_database(self, name: str) -> None:
        raise NotImplementedError

    def start(self) -> OwnServer:
        """Start it (again, after :meth:`kill`: on the same port and data)."""
        with open(os.path.join(self.dir, "server.log"), "ab") as log:
            self.proc = subprocess.Popen(
                self.command(), stdout=log, stderr=log, **self.user
            )
        if self not in _RUNNING:
            _RUNNING.append(self)
        wait_listening(self.proc, self.port, self.program)
        self._wait_ready()
        if self.saved is None:
            try:
                self._attach()
            except BaseException:
                self.stop()
                raise
        return self

    def _attach(self) -> None:
        entry = connections[self.alias].settings_dict
        self.saved = entry["PORT"], os.environ.get(self.port_variable)
        entry["PORT"] = os.environ[self.port_variable] = str(self.port)
        self.create_database(entry["NAME"])
        run_in_processes(migrate, [(self.alias,)])

    def _wait(self, connect, errors) -> None:
        """Wait until ``connect()`` stops raising ``errors`` (30 s at most)."""
        deadline = time.monotonic() + 30
        while True:
            try:
                connect().close()
                return
            except errors:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise RuntimeError(
                        f"{self.program} did not come up: {self.log()}"
                    ) from None
                time.sleep(0.05)

    def log(self) -> str:
        with open(os.path.join(self.dir, "server.log"), errors="replace") as f:
            return f.read()[-2000:]

    def processes(self) -> list[int]:
        """The server's processes, the one started first."""
        return [self.proc.pid]

    def _signal(self, signum: int, pids: list[int]) -> None:
        for pid in pids:
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        """SIGKILL every process of the server: no shutdown, no flush."""
        pids = self.processes()
        self._signal(signal.SIGKILL, pids)
        self.proc.wait()
        self.paused = []
        # The test's own connection died with it: the next use reconnects.
        connections[self.alias].close()
        # A child still attached to the shared memory would stop the restart.
        deadline = time.monotonic() + 10
        while any(_running(pid) for pid in pids[1:]):
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"{self.program} processes {pids[1:]} outlived SIGKILL"
                )
            time.sleep(0.01)

    def pause(self) -> None:
        """SIGSTOP every process of the server."""
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
            connections[self.alias].settings_dict["PORT"] = self.saved[0]
            if self.saved[1] is None:
                os.environ.pop(self.port_variable, None)
            else:
                os.environ[self.port_variable] = self.saved[1]
        shutil.rmtree(self.dir, ignore_errors=True)
