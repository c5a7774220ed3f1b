"""The database backend behind a real PgBouncer in transaction pooling mode.

The fixture starts Debian's ``pgbouncer`` (``scripts/bootstrap`` installs
it) on a free loopback port in front of the PostgreSQL on 127.0.0.1:5432,
with its configuration in a temporary directory, and stops exactly that
process. The ``pgbouncer`` alias of ``tests/settings.py`` points at it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import threading
import time
from unittest import mock

import pytest
from django.db import connections
from django.test import override_settings

from django_distlock import lock, locks, semaphore

from .contract import DatabaseContract
from .servers import free_port, unavailable, wait_listening
from .test_database_backend import db_locks

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.django_db(
        transaction=True, databases=["default", "postgres", "pgbouncer"]
    ),
]


def pgbouncer_binary() -> str | None:
    return shutil.which("pgbouncer") or (
        "/usr/sbin/pgbouncer" if os.access("/usr/sbin/pgbouncer", os.X_OK) else None
    )


class PgBouncer:
    """One ``pgbouncer`` process on a free loopback port (transaction pooling)."""

    def __init__(self, upstream_host: str, upstream_port: int):
        binary = pgbouncer_binary()
        if binary is None:
            unavailable("pgbouncer is not installed (scripts/bootstrap installs it)")
        self.binary = binary
        self.port = free_port()
        self.upstream = (upstream_host, upstream_port)
        self.dir = tempfile.mkdtemp(prefix="distlock-pgbouncer-")
        self.proc: subprocess.Popen | None = None

    def start(self) -> PgBouncer:
        host, port = self.upstream
        ini = os.path.join(self.dir, "pgbouncer.ini")
        users = os.path.join(self.dir, "userlist.txt")
        with open(users, "w") as f:
            f.write('"postgres" ""\n')
        with open(ini, "w") as f:
            f.write(
                "[databases]\n"
                f"* = host={host} port={port}\n"
                "[pgbouncer]\n"
                "listen_addr = 127.0.0.1\n"
                f"listen_port = {self.port}\n"
                "unix_socket_dir =\n"
                "auth_type = trust\n"
                f"auth_file = {users}\n"
                "pool_mode = transaction\n"
                "default_pool_size = 4\n"
                "max_client_conn = 500\n"
                "ignore_startup_parameters = extra_float_digits,options\n"
                f"logfile = {os.path.join(self.dir, 'pgbouncer.log')}\n"
            )
        command = [self.binary, ini]
        if os.geteuid() == 0:
            # PgBouncer refuses to run as root: drop to the postgres user.
            shutil.chown(self.dir, user="postgres")
            for path in (ini, users):
                shutil.chown(path, user="postgres")
            command = [self.binary, "-u", "postgres", ini]
        self.proc = subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        try:
            wait_listening(self.proc, self.port, "pgbouncer")
        except RuntimeError:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="module")
def pgbouncer(postgres_available):
    """A PgBouncer in front of the test PostgreSQL; the ``pgbouncer`` alias
    (and worker processes, through the environment) point at it."""
    postgres = connections["postgres"].settings_dict
    server = PgBouncer(postgres["HOST"] or "127.0.0.1", int(postgres["PORT"])).start()
    entry = connections["pgbouncer"].settings_dict
    saved = entry["PORT"], os.environ.get("DISTLOCK_PGBOUNCER_PORT")
    entry["PORT"] = os.environ["DISTLOCK_PGBOUNCER_PORT"] = str(server.port)
    yield server
    entry["PORT"] = saved[0]
    if saved[1] is None:
        os.environ.pop("DISTLOCK_PGBOUNCER_PORT", None)
    else:
        os.environ["DISTLOCK_PGBOUNCER_PORT"] = saved[1]
    server.stop()


class TestPgBouncerContract(DatabaseContract):
    """The whole contract, every statement through the pooler."""

    @pytest.fixture
    def locks_setting(self, pgbouncer):
        assert (
            connections["pgbouncer"].settings_dict["NAME"]
            == (connections["postgres"].settings_dict["NAME"])
        )
        return db_locks("pgbouncer")


class TestPgBouncerNotifyContract(DatabaseContract):
    """The contract with ``WAIT = "notify"`` through the pooler: LISTEN needs
    a session of its own, so waiters poll instead (and say so)."""

    @pytest.fixture
    def locks_setting(self, pgbouncer):
        setting = db_locks("pgbouncer")
        setting["default"]["OPTIONS"]["WAIT"] = "notify"
        return setting


def churn(name: str, rounds: int) -> None:
    """Acquire and release ``name`` ``rounds`` times from several threads."""
    errors: list[BaseException] = []

    def worker(i: int) -> None:
        try:
            for _ in range(rounds):
                with lock(f"{name}:{i % 3}", timeout=30):
                    pass
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def test_prepared_statements_fall_back_without_the_pooler_setting(pgbouncer, caplog):
    """Forgetting DISABLE_SERVER_SIDE_CURSORS behind the pooler: statements
    prepared on one server connection are missing on the next. The backend
    notices, stops preparing, says so, and every lock still works."""
    entry = connections["pgbouncer"].settings_dict
    with mock.patch.dict(entry, {"DISABLE_SERVER_SIDE_CURSORS": False}):
        with override_settings(LOCKS=db_locks("pgbouncer")):
            try:
                churn("prepared", 40)
            finally:
                locks.reset()
    assert "DISABLE_SERVER_SIDE_CURSORS = True" in caplog.text


def test_the_pooler_is_recognised_before_any_statement_is_prepared(pgbouncer, caplog):
    """PgBouncer answers the connection with a process id of its own making:
    the backend sees that it is not the server session's, and leaves out
    what belongs to a server session. psycopg's names for prepared
    statements (``_pg3_<n>``) could stand for other clients' statements on
    the next server session; a LISTEN stays with a session that serves
    other clients."""
    entry = connections["pgbouncer"].settings_dict
    with mock.patch.dict(entry, {"DISABLE_SERVER_SIDE_CURSORS": False}):
        with override_settings(LOCKS=db_locks("pgbouncer")):
            try:
                with lock("recognised") as held:
                    assert held.fencing_token
                backend = locks["default"]
                # As with the setting: no prepared statements, no LISTEN,
                # and no session setting left on a server connection that
                # serves other clients' transactions too.
                assert not backend._prepared and not backend.hands_over
                cursor = backend._connection().cursor()
                cursor.execute("SHOW idle_in_transaction_session_timeout")
                assert cursor.fetchone()[0] == "0"
            finally:
                locks.reset()
    assert "a pooler answers for the server" in caplog.text
    assert "vanish" not in caplog.text  # noticed up front, not by an error
    assert "DISABLE_SERVER_SIDE_CURSORS = True" in caplog.text


def test_a_permit_waiter_is_served_behind_a_pooler_found_on_its_own(pgbouncer):
    """Without the setting, a permit waiter behind the pooler polls once the
    backend has found the pooler: it gets the permit a release frees."""
    entry = connections["pgbouncer"].settings_dict
    got = threading.Event()
    with mock.patch.dict(entry, {"DISABLE_SERVER_SIDE_CURSORS": False}):
        with override_settings(LOCKS=db_locks("pgbouncer")):
            try:
                holder = semaphore("permit-behind", 1)
                assert holder.acquire(timeout=0)
                assert not locks["default"].hands_over

                def waiter() -> None:
                    with semaphore("permit-behind", 1, timeout=20):
                        got.set()

                thread = threading.Thread(target=waiter)
                thread.start()
                time.sleep(0.3)
                assert not got.is_set()
                holder.release()
                thread.join(30)
                assert got.is_set()
            finally:
                locks.reset()


def notify_locks(database: str) -> dict:
    setting = db_locks(database)
    setting["default"]["OPTIONS"]["WAIT"] = "notify"
    return setting


def release_noticed_after(name: str) -> float:
    """Hold ``name``, let a thread wait for it, release; return the seconds
    the waiter took to get it after the release."""
    holder = lock(name)
    assert holder.acquire()
    got: list[float] = []

    def waiter() -> None:
        with lock(name, timeout=20):
            got.append(time.monotonic())

    thread = threading.Thread(target=waiter)
    thread.start()
    time.sleep(0.3)  # the waiter is asleep by now
    released = time.monotonic()
    holder.release()
    thread.join(30)
    return got[0] - released


def test_notify_waiters_poll_behind_the_pooler(pgbouncer):
    """LISTEN does not survive a transaction pooler: the backend polls there,
    and manage.py check says so (distlock.W005)."""
    from django_distlock.checks import check_locks_setting

    with override_settings(LOCKS=notify_locks("pgbouncer")):
        try:
            backend = locks["default"]
            assert backend.wait_notify and not backend.listens
            assert not backend.hands_over
            (message,) = check_locks_setting()
            assert message.id == "distlock.W005" and message.hint
            # Woken by polling, not after the notify wait's 1 s safety net.
            assert release_noticed_after("pooled-notify") < 0.5
        finally:
            locks.reset()
    with override_settings(LOCKS=notify_locks("postgres")):
        try:
            assert locks["default"].listens  # directly connected: LISTEN works
            assert check_locks_setting() == []
        finally:
            locks.reset()
