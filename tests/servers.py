"""Start, pause, kill and restart real servers for the tests (loopback only).

Every process started here is stopped by the code that started it; nothing
else on the machine is touched.
"""

from __future__ import annotations

import atexit
import itertools
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator

import pytest

IN_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}


def unavailable(reason: str):
    """Skip locally, fail under CI: a needed server must be there in CI."""
    if IN_CI:
        pytest.fail(f"{reason} (CI=true: a missing server is a failure)", pytrace=False)
    pytest.skip(reason)


def _worker_ports() -> Iterator[int] | None:
    """The ports of this pytest-xdist worker (``gw0`` to ``gw9``), or None.

    Each worker draws from a block of 1,000 ports of its own, below the
    kernel's ephemeral range (where clients' sockets and ``bind(0)`` land), in
    turn from a place set by its process id: two workers never pick the same
    port, and a killed server's port is not handed out again while it waits
    to be restarted on it. Blocks of 10000-19999; a Redis Cluster node's bus
    port (+10000) stays below the ephemeral range too.
    """
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not (worker.startswith("gw") and worker[2:].isdigit()):
        return None
    index = int(worker[2:])
    if index >= 10:
        return None
    block = range(10000 + 1000 * index, 11000 + 1000 * index)
    offset = os.getpid() % len(block)
    return itertools.cycle([*block[offset:], *block[:offset]])


_WORKER_PORTS = _worker_ports()


def _ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (Linux; else 32768)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


_EPHEMERAL_LOW = _ephemeral_low()


def bindable(port: int) -> bool:
    """Return whether a socket can bind ``port`` on 127.0.0.1 right now."""
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port(*, bus: bool = False) -> int:
    """Return a TCP port on 127.0.0.1 that is free right now.

    With ``bus``, the port 10000 above it (a Redis Cluster node's bus) is
    free too.
    """
    if _WORKER_PORTS is not None:
        candidates, where = _WORKER_PORTS, "in this worker's block"
    else:
        # Outside a worker (a matrix cell, a script): at random between the
        # workers' blocks and the ephemeral range, where a client socket of
        # any process on the machine could take the port before the server
        # binds it.
        top = min(_EPHEMERAL_LOW, 32768) - (10000 if bus else 0)
        candidates = (random.randrange(20000, top) for _ in itertools.count())
        where = "below the ephemeral range"
    for port in itertools.islice(candidates, 1000):
        if bindable(port) and (not bus or bindable(port + 10000)):
            return port
    raise RuntimeError(f"no free port left {where}")


def port_open(host: str, port: int, timeout: float = 1.0) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def wait_listening(proc: subprocess.Popen, port: int, what: str) -> None:
    """Wait (10 s at most) until ``proc`` listens on ``port`` of 127.0.0.1.

    Raise RuntimeError naming ``what`` (and what it wrote on stderr, if that
    was piped) when it exits or the time runs out first.
    """
    deadline = time.monotonic() + 10
    while not port_open("127.0.0.1", port, 0.2):
        if proc.poll() is not None or time.monotonic() > deadline:
            err = proc.stderr.read().decode() if proc.stderr else ""
            raise RuntimeError(f"{what} on port {port} did not start {err}".strip())
        time.sleep(0.02)


class ServerExited(RuntimeError):
    """A server process ended while a test waited for it to answer."""


def on_new_ports(start, redraw, tries: int):
    """Return ``start()``; if the server exits (:class:`ServerExited`: a port
    that was free when drawn can be taken before the server binds it),
    ``redraw()`` its ports and try again, ``tries`` times in all."""
    for attempt in range(1, tries + 1):
        try:
            return start()
        except ServerExited:
            if attempt == tries:
                raise
            redraw()
    raise AssertionError("unreachable")


#: redis-servers started by this process, as (its pid, the process): a test
#: that fails before it stops them (a start that raises in a list of them)
#: leaves none running once the test process exits.
_STARTED: list[tuple[int, subprocess.Popen]] = []


@atexit.register
def _kill_left_running() -> None:
    for owner, proc in _STARTED:
        # Not a forked child's: the servers are its parent's.
        if owner == os.getpid() and proc.poll() is None:
            proc.kill()
            proc.wait()


class RedisServer:
    """One ``redis-server`` process on a free loopback port, with no persistence."""

    def __init__(self, port: int | None = None, *args: str):
        if shutil.which("redis-server") is None:
            unavailable("redis-server is not on PATH")
        self.port = port or free_port()
        # A port drawn here may be drawn again if another process has it.
        self.drawn = port is None
        self.args = args
        self.dir = tempfile.mkdtemp(prefix="distlock-redis-")
        self.proc: subprocess.Popen | None = None
        self.paused = False

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        """Start it (again, after :meth:`kill`: on the same port).

        The server answering on the port must be this one: a port free when
        drawn can be taken by another process's server before this one binds
        it, and this one then exits while the other answers.
        """
        tries = 3 if self.drawn and self.proc is None else 1
        return on_new_ports(self._start, self._redraw, tries)

    def _redraw(self) -> None:
        self.port = free_port()

    def _answers(self) -> bool:
        """Whether the server on the port is this process (not another's)."""
        import redis

        assert self.proc is not None
        if self.proc.poll() is not None:
            return False
        with redis.Redis("127.0.0.1", self.port, socket_timeout=5) as client:
            return int(client.info("server")["process_id"]) == self.proc.pid

    def _start(self) -> RedisServer:
        self.proc = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                # A replica's first sync starts at once (Redis 7 waits 5 s
                # for other replicas to share a diskless transfer).
                "--repl-diskless-sync-delay",
                "0",
                "--dir",
                self.dir,
                "--logfile",
                os.path.join(self.dir, "redis.log"),
                *self.args,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        _STARTED[:] = [(o, p) for o, p in _STARTED if p.poll() is None]
        _STARTED.append((os.getpid(), self.proc))
        wait_listening(self.proc, self.port, "redis-server")
        if not self._answers():
            self.kill()
            raise ServerExited(f"another process's server answers on port {self.port}")
        return self

    def kill(self) -> None:
        """SIGKILL the server (its data is gone: no persistence)."""
        if self.proc and self.proc.poll() is None:
            if self.paused:
                self.resume()
            self.proc.kill()
            self.proc.wait()

    def stop(self) -> None:
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)

    def restart(self) -> None:
        """Kill and start again on the same port, empty."""
        self.kill()
        self.start()

    def pause(self) -> None:
        """SIGSTOP: the server is alive but answers nothing."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)
        self.paused = False

    def client(self):
        import redis

        return redis.Redis.from_url(self.url)
