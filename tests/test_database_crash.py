"""The database backend across a crash of its PostgreSQL server.

A grant is durable: once a holder has been told it holds a lease, a server
crash (SIGKILL of the postmaster and every child, no shutdown) cannot lose
it. Nobody is granted the name again before that lease runs out, and the
name's next fencing token after the restart is larger than every one given
out before. That is an exclusive lease, a shared one (the next exclusive
holder waits for it), a semaphore's permit, and a permit a release handed
over to the waiter first in line (migration 0010: that release did not
wait for the WAL flush, and the next holder after a crash got the handed
token again, before the handed lease ran out).

The fixture starts a PostgreSQL server of its own (:mod:`tests.pg_server`,
whose WAL writer waits 10 s between flushes: a commit that did not wait
for the flush is still unflushed when the server is killed), and kills and
restarts exactly that server.
"""

from __future__ import annotations

import pytest
from django.test import override_settings

from .crash_workers import grant, take_again
from .pg_server import PostgresServer
from .procs import run_in_processes
from .test_database_backend import db_locks

pytestmark = pytest.mark.postgres


@pytest.fixture(scope="module")
def crashable(postgres_available):
    """A PostgreSQL server of the test's own; the ``crashable`` alias points
    at it."""
    server = PostgresServer().start()
    yield server
    server.stop()


@pytest.mark.parametrize("how", ["exclusive", "shared", "permit", "handed permit"])
def test_a_grant_outlives_a_server_crash(crashable, how):
    name = f"crash:{how}"
    with override_settings(LOCKS=db_locks("crashable")):
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
