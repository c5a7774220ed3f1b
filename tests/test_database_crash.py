"""The database backend across a crash of its server: PostgreSQL, MariaDB.

A grant is durable: once a holder has been told it holds a lease, a server
crash (SIGKILL of the postmaster and every child, no shutdown) cannot lose
it. Nobody is granted the name again before that lease runs out, and the
name's next fencing token after the restart is larger than every one given
out before. That is an exclusive lease, a shared one (the next exclusive
holder waits for it), a semaphore's permit, and a permit a release handed
over to the waiter first in line (migration 0010: that release did not
wait for the WAL flush, and the next holder after a crash got the handed
token again, before the handed lease ran out).

The fixture starts a server of its own (:mod:`tests.db_servers`; a
PostgreSQL whose WAL writer waits 10 s between flushes, so that a commit
that did not wait for the flush is still unflushed when the server is
killed), and kills and restarts exactly that server. Only PostgreSQL hands
permits over in the release.
"""

from __future__ import annotations

import pytest
from django.test import override_settings

from .crash_workers import grant, take_again
from .mariadb_server import MariaDBServer
from .pg_server import PostgresServer
from .procs import run_in_processes
from .test_database_backend import db_locks

SERVERS = {"postgres": PostgresServer, "mariadb": MariaDBServer}
HOWS = ["exclusive", "shared", "permit"]
CASES = [
    pytest.param(server, how, marks=mark, id=f"{server}-{how}")
    for server, mark, hows in [
        ("postgres", pytest.mark.postgres, [*HOWS, "handed permit"]),
        ("mariadb", pytest.mark.mysql, HOWS),
    ]
    for how in hows
]


@pytest.fixture(scope="module")
def servers():
    """The servers of the module's own, started on first use."""
    started = {}
    yield started
    for server in started.values():
        server.stop()


@pytest.mark.parametrize("server, how", CASES)
def test_a_grant_outlives_a_server_crash(servers, server, how):
    if server not in servers:
        servers[server] = SERVERS[server]().start()
    crashable = servers[server]
    name = f"crash:{how}"
    with override_settings(LOCKS=db_locks(crashable.alias)):
        [(before, lease_end)] = run_in_processes(grant, [(name, how)])
        crashable.kill()
        crashable.start()
        [(after, granted_at)] = run_in_processes(take_again, [(name, how)])
    assert granted_at >= lease_end, (
        f"granted again {lease_end - granted_at:.2f} s before the lease before "
        "the crash could have run out: the grant was lost"
    )
    assert after > before, (
        f"the token {before} given out before the crash was given out again "
        f"({after}): the grant was lost"
    )
