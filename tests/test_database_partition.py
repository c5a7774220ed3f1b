"""The database backend when its server, or one of its clients, is cut off.

The server (one of the test's own, :mod:`tests.db_servers`: PostgreSQL or
MariaDB) stays up, but iptables drops every packet to and from its loopback
port: what a network partition, or a host that froze, looks like to a
client. A call on a connection opened before must fail with
``LockBackendError`` within seconds (the lock connections' libpq timeouts,
and the MariaDB driver's read timeout), not hang while TCP retransmits for
a quarter of an hour.

The other side: a client that goes quiet in the middle of a transaction
(frozen, or cut off) must not keep the name's row locked for everyone
else. MariaDB's shared and permit acquisitions, and a renewal of several
leases anywhere, take a few round trips in one transaction, and the server
ends a lock connection's session once it has sat idle in one for a few
seconds.
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import threading
import time
from contextlib import contextmanager

import pytest
from django.core.management import call_command
from django.test import override_settings

from django_distlock import lock, locks
from django_distlock.backends.database.deadlines import STATEMENT_DEADLINE
from django_distlock.backends.database.sessions import IDLE_TRANSACTION_TIMEOUT
from django_distlock.exceptions import LockBackendError

from .crash_workers import across_partition, take_within
from .mariadb_server import MariaDBServer
from .pg_server import PostgresServer
from .procs import run_in_processes
from .servers import unavailable
from .test_database_backend import _db_param, db_locks


def iptables() -> str:
    path = shutil.which("iptables") or "/usr/sbin/iptables"
    if not os.access(path, os.X_OK):
        unavailable("iptables is not installed (scripts/bootstrap installs it)")
    return path


@contextmanager
def cut_off(port: int):
    """Drop every loopback packet to and from ``port``, and nothing else.

    A server of a test's own listens below the ephemeral range
    (``servers.free_port``), so no client socket of another connection has
    ``port`` for its own end.
    """
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


SERVERS = [
    pytest.param(PostgresServer, marks=pytest.mark.postgres, id="postgres"),
    pytest.param(MariaDBServer, marks=pytest.mark.mysql, id="mariadb"),
]


@pytest.fixture(params=SERVERS)
def server(request):
    iptables()
    server = request.param().start()
    yield server
    server.stop()


@contextmanager
def stopped(server):
    """SIGSTOP every process of ``server``: it hangs, but its machine still
    acknowledges every packet, so TCP sees nothing wrong."""
    server.pause()
    try:
        yield
    finally:
        server.resume()


@pytest.mark.parametrize("call", ["release", "acquire"])
@pytest.mark.parametrize("fault", ["cut off", "stopped"])
def test_a_call_fails_quickly_on_a_server_cut_off_or_stopped(
    server, fault, call, tmp_path
):
    ready, go = tmp_path / "ready", tmp_path / "go"
    results = []

    def worker():
        job = ("partition", str(ready), str(go), call)
        results.extend(run_in_processes(across_partition, [job], timeout=60))

    with override_settings(LOCKS=db_locks(server.alias)):
        thread = threading.Thread(target=worker)
        thread.start()
        deadline = time.monotonic() + 30
        while not ready.exists():
            assert thread.is_alive() and time.monotonic() < deadline, "never held"
            time.sleep(0.01)
        with cut_off(server.port) if fault == "cut off" else stopped(server):
            go.touch()
            thread.join(60)
    assert results, "the worker did not answer"
    [(raised, seconds)] = results
    assert raised == "LockBackendError", raised
    print(f"{fault}: the {call} failed after {seconds:.2f} s")
    # PostgreSQL: libpq's timeouts, then one reconnection attempt, which
    # gives up after connect_timeout (cut off), or the backend's deadline on
    # a call (stopped). MariaDB: the driver's read timeout, then one
    # reconnection attempt (stopped: the server's greeting never comes, and
    # the read timeout runs again).
    assert seconds < 2 * STATEMENT_DEADLINE + 3, (
        f"the {call} took {seconds:.1f} s to fail"
    )


@pytest.fixture
def own_postgres(django_db_blocker):
    """A PostgreSQL server of the test's own, the LOCKS setting on it, and
    the test process let in (its database is outside pytest-django's)."""
    server = PostgresServer().start()
    try:
        with (
            django_db_blocker.unblock(),
            override_settings(LOCKS=db_locks(server.alias)),
        ):
            try:
                yield server
            finally:
                locks.reset()
    finally:
        server.stop()


@pytest.mark.postgres
def test_a_listing_on_a_stopped_server_says_so_and_exits_1(monkeypatch, own_postgres):
    """``locks list`` never says "no locks" for a server that stopped
    answering; it says which backend it could not read, once the listing's
    deadline (shortened here) has passed."""
    from django_distlock.backends.database import backend, shares

    for module in (backend, shares):
        monkeypatch.setattr(module, "LISTING_DEADLINE", 1.0)
    held = lock("partition:listed while stopped", ttl=60, auto_renew=False)
    held.acquire()  # the connection is open before the server stops
    out, err = io.StringIO(), io.StringIO()
    with stopped(own_postgres):
        started = time.monotonic()
        with pytest.raises(SystemExit) as exit_info:
            call_command("locks", "list", stdout=out, stderr=err)
        seconds = time.monotonic() - started
    held.release()
    assert exit_info.value.code == 1
    assert "No locks" not in out.getvalue()
    assert "Backend 'default' could not be read: " in err.getvalue()
    assert "no answer within 1 s (" in err.getvalue()
    assert seconds < 1.0 + 3, f"the listing took {seconds:.1f} s to fail"


@pytest.mark.postgres
def test_an_acquisition_cut_by_its_deadline_leaves_no_lease_behind(own_postgres):
    """The stopped server still holds the acquisition's statement, and runs
    it when it goes on: a grant that nobody holds. The acquisition was in
    doubt, and the backend cancels that grant once the server answers, even
    after a stop longer than the grant's TTL."""
    name = "partition:acquired while stopped"
    ttl = 3.0
    with lock(name, auto_renew=False):
        pass  # the name's row exists, the connection is open
    attempt = lock(name, ttl=ttl, timeout=0, auto_renew=False)
    with stopped(own_postgres):
        asked = time.monotonic()
        with pytest.raises(LockBackendError, match="no answer within"):
            attempt.acquire()
        # Stopped well past the grant's TTL from the cut, after which a
        # cancel that did not wait for the server process to go would have
        # given up (it tries every 2 s: connect_timeout).
        resume_at = asked + STATEMENT_DEADLINE + ttl + 4
        time.sleep(max(0.0, resume_at - time.monotonic()))
    started = time.monotonic()
    with lock(name, ttl=10, timeout=30, auto_renew=False):
        seconds = time.monotonic() - started
    # Not the late grant's TTL, which runs from when the server went on.
    assert seconds < ttl / 2, f"the name was taken {seconds:.1f} s later"


@pytest.mark.parametrize(
    "alias",
    [
        _db_param("postgres", pytest.mark.postgres),
        _db_param("mysql", pytest.mark.mysql),
    ],
)
def test_a_client_quiet_in_a_transaction_frees_the_name_within_seconds(alias):
    name = f"partition:quiet in a transaction:{alias}"
    with override_settings(LOCKS=db_locks(alias)):
        with lock(name, auto_renew=False):
            pass  # the name's row exists
        # What a transaction of a lock connection holds when its client
        # freezes or is cut off between two of its statements (a shared or
        # permit acquisition on MariaDB, a renewal of several leases): row
        # locks.
        quiet = locks["default"]._connection()
        cursor = quiet.cursor()
        try:
            cursor.execute("BEGIN")
            cursor.execute(
                "SELECT token FROM django_distlock_lockrecord WHERE name = %s "
                "FOR UPDATE",
                [name],
            )
            cursor.fetchall()
            [seconds] = run_in_processes(take_within, [(name, 30)], timeout=90)
        finally:
            quiet.reset()
            locks.reset()
    # The server ended the quiet session after IDLE_TRANSACTION_TIMEOUT.
    # Without it the taker waited on the row lock: on MariaDB for
    # innodb_lock_wait_timeout (50 s), twice; on PostgreSQL, past its own
    # timeout, until the quiet transaction ended.
    assert seconds < IDLE_TRANSACTION_TIMEOUT + 5, (
        f"the name was taken {seconds:.1f} s later"
    )
