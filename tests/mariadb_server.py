"""A MariaDB server of a test's own (see :mod:`tests.db_servers`).

:class:`MariaDBServer` runs Debian's ``mariadb-install-db`` and
``mariadbd`` (one process) and points the ``crashable_mysql`` alias at the
server.
"""

from __future__ import annotations

import os
import shutil
import subprocess

from .db_servers import OwnServer
from .routers import OWN_SERVERS
from .servers import unavailable

ALIAS = "crashable_mysql"
PORT_VARIABLE = OWN_SERVERS[ALIAS]


class MariaDBServer(OwnServer):
    """One MariaDB server whose root has no password, for the
    ``crashable_mysql`` alias."""

    alias = ALIAS
    port_variable = PORT_VARIABLE
    program = "mariadbd"

    def __init__(self):
        self.binary = shutil.which("mariadbd") or "/usr/sbin/mariadbd"
        install = shutil.which("mariadb-install-db")
        if install is None or not os.access(self.binary, os.X_OK):
            unavailable("MariaDB's server is not installed (mariadb-server package)")
        super().__init__()
        self.data = os.path.join(self.dir, "data")
        # A temporary directory of its own: servers bootstrapping at once in
        # one /tmp clash on their temporary tables' names.
        self.tmp = os.path.join(self.dir, "tmp")
        os.mkdir(self.tmp)
        done = subprocess.run(
            [install, "--no-defaults", f"--datadir={self.data}", "--user=root"]
            + [f"--tmpdir={self.tmp}"]
            + ["--auth-root-authentication-method=normal", "--skip-test-db"],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        if done.returncode:
            output = done.stdout.decode(errors="replace")[-2000:]
            raise RuntimeError(f"mariadb-install-db failed: {output}")

    def command(self) -> list[str]:
        return [
            self.binary,
            "--no-defaults",
            f"--datadir={self.data}",
            f"--tmpdir={self.tmp}",
            f"--port={self.port}",
            "--bind-address=127.0.0.1",
            f"--socket={self.dir}/mariadbd.sock",
            f"--pid-file={self.dir}/mariadbd.pid",
            "--user=root",
            "--innodb-buffer-pool-size=32M",
            "--skip-name-resolve",
        ]

    def _connect(self):
        import pymysql

        return pymysql.connect(
            host="127.0.0.1", port=self.port, user="root", connect_timeout=2
        )

    def _wait_ready(self) -> None:
        import pymysql

        self._wait(self._connect, pymysql.err.OperationalError)

    def create_database(self, name: str) -> None:
        conn = self._connect()
        try:
            with conn.cursor() as cursor:
                cursor.execute(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4")
        finally:
            conn.close()
