"""What each lock connection's session is given (PostgreSQL, MariaDB/MySQL).

The driver's timeouts, so that a call on a server cut off fails within
seconds, and a limit on the time a session may sit idle in a transaction,
so that a client that froze in the middle of one frees the rows it locked.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = [
    "IDLE_TRANSACTION_TIMEOUT",
    "LIBPQ_TIMEOUTS",
    "MYSQL_TIMEOUTS",
    "idle_transaction_limiter",
]

#: libpq's connection parameters for the lock connections (PostgreSQL): a
#: connection attempt gives up after ``connect_timeout`` seconds; sent data
#: not acknowledged within ``tcp_user_timeout`` ms closes the connection,
#: and so do keepalive probes unanswered once it has been idle that long
#: (a statement waiting for its reply included). A live server's machine
#: answers the probes, however long the statement takes.
LIBPQ_TIMEOUTS = {
    "connect_timeout": 2,
    "keepalives": 1,
    "keepalives_idle": 2,
    "keepalives_interval": 1,
    "keepalives_count": 2,
    "tcp_user_timeout": 3000,
}

#: The MySQL/MariaDB driver's parameters for the lock connections (PyMySQL
#: and mysqlclient take the same): a connection attempt, or a read or write
#: of a statement, gives up after so many seconds. The longest wait a lock
#: connection's statement makes in the server is a permit waiter's
#: ``GET_LOCK`` (a second at most) or a row lock held by a transaction of
#: another lock connection, which the server ends after
#: :data:`IDLE_TRANSACTION_TIMEOUT` when its client has gone quiet.
MYSQL_TIMEOUTS = {"connect_timeout": 2, "read_timeout": 6, "write_timeout": 6}
#: Seconds a lock connection may sit in a transaction without sending a
#: statement before the server ends its session, releasing its row locks
#: (PostgreSQL's ``idle_in_transaction_session_timeout``, MariaDB's
#: ``idle_transaction_timeout``). A shared or permit acquisition (MariaDB)
#: or a renewal of several leases takes a few round trips in one
#: transaction, and a client that froze or was cut off between two of them
#: would otherwise keep the names' rows locked, past their leases, until the
#: server noticed: never, for a frozen process, whose connection stays open.
IDLE_TRANSACTION_TIMEOUT = 3


def _set_session(raw: Any, sql: str, params: list) -> None:
    cursor = raw.cursor()
    try:
        cursor.execute(sql, params)
    finally:
        cursor.close()


def idle_transaction_limiter(vendor: str, pooled: bool) -> Callable[[Any], None] | None:
    """Return what ends a new lock connection's session when it sits idle
    in a transaction (:data:`IDLE_TRANSACTION_TIMEOUT`), or None.

    Not behind a transaction pooler, whose server sessions other clients'
    transactions use too, nor on MySQL, which has no such setting. (A
    PostgreSQL connection that a pooler nobody declared answers is not given
    it either: the connection looks first, see ``_Connection.cursor``.)
    """
    if vendor == "postgresql" and not pooled:
        return lambda raw: _set_session(
            raw,
            "SELECT set_config('idle_in_transaction_session_timeout', %s, false)",
            [f"{IDLE_TRANSACTION_TIMEOUT}s"],
        )
    if vendor == "mysql":

        def on_mariadb(raw: Any) -> None:
            if "mariadb" in raw.get_server_info().lower():
                _set_session(
                    raw,
                    "SET SESSION idle_transaction_timeout = %s",
                    [IDLE_TRANSACTION_TIMEOUT],
                )

        return on_mariadb
    return None
