"""Start, pause, kill and restart real servers for the tests (loopback only).

Every process started here is stopped by the code that started it; nothing
else on the machine is touched.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time

import pytest

IN_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}


def unavailable(reason: str):
    """Skip locally, fail under CI: a needed server must be there in CI."""
    if IN_CI:
        pytest.fail(f"{reason} (CI=true: a missing server is a failure)", pytrace=False)
    pytest.skip(reason)


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that is free right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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


class RedisServer:
    """One ``redis-server`` process on a free loopback port, with no persistence."""

    def __init__(self, port: int | None = None, *args: str):
        if shutil.which("redis-server") is None:
            unavailable("redis-server is not on PATH")
        self.port = port or free_port()
        self.args = args
        self.dir = tempfile.mkdtemp(prefix="distlock-redis-")
        self.proc: subprocess.Popen | None = None
        self.paused = False

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
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
        wait_listening(self.proc, self.port, "redis-server")
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
