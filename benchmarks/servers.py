"""Start and stop the benchmark's own servers (loopback only).

Every redis-server started here is stopped by the code that started it, and
the PostgreSQL database is created and dropped by name: nothing else on the
machine is touched.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time


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


class RedisServer:
    """One ``redis-server`` on a free loopback port, without persistence.

    ``wrapper`` is a command line the server runs under (``valgrind ...``):
    a graceful stop (SIGTERM) lets the wrapper write its report.
    """

    def __init__(self, wrapper: list[str] | None = None) -> None:
        if shutil.which("redis-server") is None:
            raise RuntimeError("redis-server is not on PATH")
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="distlock-bench-redis-")
        self.proc: subprocess.Popen | None = None
        self.wrapper = wrapper or []

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        self.proc = subprocess.Popen(
            [
                *self.wrapper,
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                self.dir,
                "--logfile",
                os.path.join(self.dir, "redis.log"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + (60 if self.wrapper else 10)
        while not port_open("127.0.0.1", self.port, 0.2):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"redis-server on port {self.port} did not start")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60 if self.wrapper else 5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)

    def client(self, **kwargs):
        import redis

        return redis.Redis.from_url(self.url, **kwargs)

    def version(self) -> str:
        return self.client().info("server")["redis_version"]


PG = {
    "host": os.environ.get("DISTLOCK_PG_HOST", "127.0.0.1"),
    "port": int(os.environ.get("DISTLOCK_PG_PORT", "5432")),
    "user": os.environ.get("DISTLOCK_PG_USER", "postgres"),
    "dbname": os.environ.get("DISTLOCK_PG_DB", "test"),
}


class PostgresDatabase:
    """A database of the benchmark's own on the PostgreSQL server."""

    def __init__(self, name: str) -> None:
        self.name = name

    @staticmethod
    def available() -> bool:
        try:
            import psycopg  # noqa: F401
        except ImportError:
            return False
        return port_open(PG["host"], PG["port"])

    def _admin(self):
        import psycopg

        return psycopg.connect(autocommit=True, connect_timeout=5, **PG)

    def create(self) -> PostgresDatabase:
        with self._admin() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{self.name}"')
        return self

    def drop(self) -> None:
        with self._admin() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')

    def connect(self):
        import psycopg

        return psycopg.connect(autocommit=True, **{**PG, "dbname": self.name})

    def version(self) -> str:
        with self._admin() as conn:
            return conn.execute("SHOW server_version").fetchone()[0]
