"""The SQL of the backend, once per database vendor."""

from __future__ import annotations

import math
from typing import Any

__all__ = [
    "DIALECTS",
    "FLOOR",
    "PERMITS_MARK",
    "SHARED_MARK",
    "SHARES",
    "SHARES_INDEX",
    "TABLE",
    "Dialect",
]

#: The lock table (``django_distlock.models.LockRecord``; its migrations
#: create it). Named here so that the backend needs no model.
TABLE = "django_distlock_lockrecord"
#: The table of shared holders, permits and queued waiters
#: (``django_distlock.models.LockShare``).
SHARES = "django_distlock_lockshare"
#: The index of ``SHARES`` on ``digest`` (``LockShare.Meta.indexes``).
SHARES_INDEX = "distlock_share_digest"
#: ``digest`` of the fence-floor row: the highest fence of any deleted row.
FLOOR = ""
#: The ``token`` of a lock row while shared holders have it, and of a
#: semaphore's row while permits are out: never a lease's token (32 hex
#: digits), so an exclusive acquisition sees the row taken, until
#: ``expires_at``, the latest expiry among those holders.
SHARED_MARK = "(shared)"
PERMITS_MARK = "(permits)"
#: The first column of a permit waiter's waiting statement on MariaDB,
#: by which a release finds it in the process list.
DOZE = "distlock_doze"
#: A number larger than any row id.
_NO_ID = 2**63 - 1


class Dialect:
    """The SQL of one database vendor, with ``%s`` placeholders."""

    vendor = ""
    #: UPDATE ... RETURNING is available (else MySQL's LAST_INSERT_ID(expr)).
    returning = True
    begin = "BEGIN"
    for_update = " FOR UPDATE"
    for_share = " FOR SHARE"
    #: The database clock, as an SQL expression.
    now = ""
    #: The database clock plus one ttl parameter.
    later = ""
    #: Seconds from the database clock to ``expires_at``.
    remaining = ""
    insert_ignore = "INSERT INTO"
    on_conflict = " ON CONFLICT (digest) DO NOTHING"
    #: Shared leases and permits are taken and given back by one call of a
    #: server-side function (migration 0004), not statement by statement.
    share_functions = False
    #: A further condition on a queued place: its waiter is still there.
    waiter_alive = ""
    #: An exclusive or shared attempt reads the row before it writes (see
    #: SQLiteDialect).
    looks_first = False

    def ttl_param(self, seconds: float) -> Any:
        """Return ``seconds`` as the parameter of :attr:`later`."""
        return float(seconds)

    def epoch(self, column: str) -> str:
        """Return SQL for ``column`` (a UTC time) as seconds since 1970."""
        return f"EXTRACT(EPOCH FROM {column})::float8"

    def prepare(self, sql: str) -> str:
        """Return ``sql`` in the driver's placeholder style."""
        return sql

    def by_digest(self, shares: str) -> str:
        """Return ``shares`` as the table of a statement that locks one
        name's rows (a WHERE on ``digest``)."""
        return shares

    def delete_by_digest(self, shares: str) -> str:
        """Return the head of a DELETE of one name's rows of ``shares``."""
        return f"DELETE FROM {shares}"

    def build(self, table: str, shares: str = SHARES) -> dict[str, str]:
        """Return every statement of the backend, for ``table`` and ``shares``.

        Both names come quoted.
        """
        now, later = self.now, self.later
        fence = "fence + 1" if self.returning else "LAST_INSERT_ID(fence + 1)"
        returning = " RETURNING fence" if self.returning else ""
        sql = {
            "acquire": (
                f"UPDATE {table} SET token = %s, fence = {fence}, host = %s, "
                f"pid = %s, thread = %s, acquired_at = {now}, "
                f"expires_at = {later} WHERE digest = %s AND "
                f"(token IS NULL OR token = %s OR expires_at <= {now}){returning}"
            ),
            "probe": (
                f"SELECT token IS NULL OR expires_at <= {now}, {self.remaining}, "
                f"token = '{SHARED_MARK}' FROM {table} WHERE digest = %s"
            ),
            # As "probe", and free to the attempt whose token holds it.
            "probe_for": (
                f"SELECT token IS NULL OR token = %s OR expires_at <= {now}, "
                f"{self.remaining}, token = '{SHARED_MARK}' FROM {table} "
                "WHERE digest = %s"
            ),
            "ensure_floor": (
                f"{self.insert_ignore} {table} "
                "(digest, namespace, name, fence, host, thread) "
                f"VALUES ('', '', '', 0, '', ''){self.on_conflict}"
            ),
            "floor_shared": f"SELECT fence FROM {table} WHERE digest = ''"
            + self.for_share,
            "floor_locked": f"SELECT fence FROM {table} WHERE digest = ''"
            + self.for_update,
            "create": (
                f"INSERT INTO {table} (digest, namespace, name, token, fence, host, "
                "pid, thread, acquired_at, expires_at) VALUES "
                f"(%s, %s, %s, %s, %s, %s, %s, %s, {now}, {later})"
                + (self.on_conflict if self.returning else "")
            ),
            "extend": (
                f"UPDATE {table} SET expires_at = {later} WHERE digest = %s "
                f"AND token = %s AND expires_at > {now}"
            ),
            "release": (
                f"UPDATE {table} SET token = NULL WHERE digest = %s AND token = %s "
                f"AND expires_at > {now}"
            ),
            "drop": f"UPDATE {table} SET token = NULL WHERE digest = %s AND token = %s",
            "is_held": (
                f"SELECT 1 FROM {table} WHERE digest = %s AND token = %s "
                f"AND expires_at > {now}"
            ),
            # Times as epoch seconds: parsing 100,000 timestamps costs more
            # than the query. The prefix test narrows; Python decides.
            "holders": (
                f"SELECT name, token, host, pid, thread, {self.epoch('acquired_at')}, "
                f"{self.epoch('expires_at')}, fence FROM {table} WHERE "
                "namespace = %s AND digest <> '' AND token IS NOT NULL AND "
                f"token NOT IN ('{SHARED_MARK}', '{PERMITS_MARK}') AND "
                f"expires_at > {now} AND substr(name, 1, %s) = %s"
            ),
            # Third column: an expired lease (a mark's holders are counted
            # with their own rows).
            "stale": (
                f"SELECT id, fence, token IS NOT NULL AND token NOT IN "
                f"('{SHARED_MARK}', '{PERMITS_MARK}') FROM {table} WHERE "
                "namespace = %s AND digest <> '' AND "
                f"(token IS NULL OR expires_at <= {now}){self.for_update}"
            ),
            "raise_floor": (
                f"UPDATE {table} SET fence = %s WHERE digest = '' AND fence < %s"
            ),
            "delete": f"DELETE FROM {table} WHERE id IN ",
        }
        sql.update(self.share_sql(table, shares))
        self.extend_sql(sql)
        return {key: self.prepare(value) for key, value in sql.items()}

    def share_sql(self, table: str, shares: str) -> dict[str, str]:
        """Return the statements of shared locks and semaphores.

        A lock row (``table``) is locked FOR UPDATE before its holder rows
        (``shares``) change, always in that order.
        """
        now, later, remaining = self.now, self.later, self.remaining
        live = f"expires_at > {now}"
        holding = "kind IN ('shared', 'permit')"
        # Free rows (PostgreSQL keeps them for reuse) go with the places.
        waiting = "kind IN ('writer', 'queued', 'free')"
        # Statements that lock a name's rows reach them by its digest.
        locking, delete = self.by_digest(shares), self.delete_by_digest(shares)
        in_namespace = (
            f"(digest IN (SELECT digest FROM {table} WHERE namespace = %s) OR "
            f"digest NOT IN (SELECT digest FROM {table}))"
        )
        return {
            "row_locked": (
                f"SELECT token, token IS NOT NULL AND {live}, {remaining}, fence "
                f"FROM {table} WHERE digest = %s{self.for_update}"
            ),
            # A permit's release where it wakes waiters (MariaDB, SQLite)
            # locks the name's row and learns whether anyone waits: only
            # then does it look for waiters to wake.
            "row_locked_waiting": (
                f"SELECT (SELECT count(*) FROM {shares} WHERE digest = %s AND "
                f"kind = 'queued' AND {live}), fence FROM {table} WHERE digest = %s"
                f"{self.for_update}"
            ),
            "create_free": (
                f"{self.insert_ignore} {table} "
                "(digest, namespace, name, fence, host, thread) "
                f"VALUES (%s, %s, %s, %s, '', ''){self.on_conflict}"
            ),
            "shares_purge": f"{delete} WHERE digest = %s AND NOT {live}",
            "writers_waiting": (
                f"SELECT {remaining} FROM {shares} WHERE digest = %s "
                f"AND kind = 'writer' AND {live}"
            ),
            # ``channel``: where a queued permit waiter is woken (MariaDB) or
            # handed its permit (SQLite), which lasts ``ttl`` seconds.
            "share_insert": (
                f"INSERT INTO {shares} (digest, kind, permits, token, fence, host, "
                "pid, thread, channel, ttl, acquired_at, expires_at) VALUES "
                f"(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, {now}, {later})"
            ),
            # expires_at first: MySQL's SET sees the values set before it.
            "mark": (
                f"UPDATE {table} SET expires_at = CASE WHEN token = %s AND "
                f"expires_at > {later} THEN expires_at ELSE {later} END, "
                "token = %s, fence = %s WHERE digest = %s"
            ),
            "share_extend": (
                f"UPDATE {locking} SET expires_at = {later} WHERE token = %s "
                f"AND digest = %s AND kind = %s AND {live}"
            ),
            "mark_extend": (
                f"UPDATE {table} SET expires_at = {later} WHERE digest = %s "
                f"AND token = %s AND expires_at < {later}"
            ),
            "share_live": (
                f"SELECT {live}, kind FROM {locking} WHERE token = %s "
                f"AND digest = %s{self.for_update}"
            ),
            "share_delete": f"{delete} WHERE digest = %s AND token = %s",
            "share_refresh": (
                f"UPDATE {locking} SET expires_at = {later}, "
                "channel = COALESCE(%s, channel) WHERE digest = %s AND token = %s"
            ),
            # The row stays marked while a holder of ``kind`` lives, until
            # the latest expiry among them; else it is free.
            "unmark": (
                f"UPDATE {table} SET token = CASE WHEN EXISTS (SELECT 1 FROM "
                f"{shares} WHERE digest = %s AND kind = %s AND {live}) THEN token "
                "ELSE NULL END, expires_at = COALESCE((SELECT max(expires_at) "
                f"FROM {shares} WHERE digest = %s AND kind = %s AND {live}), "
                "expires_at) WHERE digest = %s AND token = %s"
            ),
            "share_is_held": (
                f"SELECT 1 FROM {shares} WHERE token = %s AND digest = %s "
                f"AND kind = %s AND {live}"
            ),
            "permit_limits": (
                f"SELECT permits FROM {shares} WHERE digest = %s "
                f"AND kind = 'permit' AND {live} AND permits <> %s"
            ),
            "permit_count": (
                f"SELECT count(*), min({remaining}) FROM {shares} "
                f"WHERE digest = %s AND kind = 'permit' AND {live}"
            ),
            # Waiters ahead of ``token`` (all of them if it has no row yet).
            "queue_ahead": (
                f"SELECT count(*) FROM {shares} WHERE digest = %s AND "
                f"kind = 'queued' AND {live}{self.waiter_alive} "
                "AND id < COALESCE((SELECT id FROM "
                f"{shares} WHERE digest = %s AND token = %s AND kind = 'queued'), "
                f"{_NO_ID})"
            ),
            "share_holders": (
                f"SELECT r.name, s.token, s.host, s.pid, s.thread, "
                f"{self.epoch('s.acquired_at')}, {self.epoch('s.expires_at')}, "
                f"s.fence, s.kind, s.permits FROM {shares} s JOIN {table} r ON "
                "r.digest = s.digest WHERE r.namespace = %s AND "
                f"s.kind IN ('shared', 'permit') AND s.expires_at > {now} AND "
                "substr(r.name, 1, %s) = %s"
            ),
            "stale_holders": (
                f"DELETE FROM {shares} WHERE NOT {live} AND {holding} "
                f"AND {in_namespace}"
            ),
            "stale_waiters": (
                f"DELETE FROM {shares} WHERE NOT {live} AND {waiting} "
                f"AND {in_namespace}"
            ),
        }

    def extend_sql(self, sql: dict[str, str]) -> None:
        """Add or change vendor-specific statements in ``sql``."""


class PostgresDialect(Dialect):
    """PostgreSQL: ``clock_timestamp()``, UPDATE ... RETURNING."""

    vendor = "postgresql"
    share_functions = True
    now = "clock_timestamp()"
    later = "clock_timestamp() + make_interval(secs => %s)"
    remaining = "EXTRACT(EPOCH FROM (expires_at - clock_timestamp()))"

    def extend_sql(self, sql: dict[str, str]) -> None:
        # A release need not wait for the WAL flush: if a server crash loses
        # it, the lock stays taken until its lease expires, and the next
        # acquisition's flush makes it durable anyway. set_config(..., true)
        # turns synchronous_commit off for this statement's own transaction.
        sql["release"] += (
            " AND set_config('synchronous_commit', 'off', true) IS NOT NULL"
        )
        # WAIT = "notify": the notification goes out when the release commits.
        sql["release_notify"] = (
            f"WITH r AS ({sql['release']} RETURNING 1) "
            "SELECT count(*), pg_notify(%s, '') IS NULL FROM r"
        )
        sql["notify"] = "SELECT pg_notify(%s, '') IS NULL"
        sql["share_acquire"] = (
            "SELECT o_fence, o_wait, o_limit FROM distlock_share_acquire("
            "%s::text, %s::text, %s::text, %s::text, %s::integer, %s::text, "
            "%s::text, %s::integer, %s::text, %s::float8, %s::float8, %s::float8, "
            "%s::text)"
        )
        sql["share_release"] = (
            "SELECT o_found, o_live FROM "
            "distlock_share_release(%s::text, %s::text, %s::text)"
        )


class MySQLDialect(Dialect):
    """MySQL and MariaDB: ``UTC_TIMESTAMP(6)``, fence via ``LAST_INSERT_ID``."""

    vendor = "mysql"
    returning = False
    begin = "START TRANSACTION"
    for_share = " LOCK IN SHARE MODE"
    now = "UTC_TIMESTAMP(6)"
    later = "UTC_TIMESTAMP(6) + INTERVAL %s MICROSECOND"
    remaining = "TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_at) / 1e6"
    insert_ignore = "INSERT IGNORE INTO"
    on_conflict = ""
    # A place whose bell (see extend_sql) is free holds nobody up.
    waiter_alive = " AND (channel IS NULL OR IS_USED_LOCK(channel) IS NOT NULL)"

    def ttl_param(self, seconds: float) -> Any:
        return int(math.ceil(seconds * 1_000_000))

    def by_digest(self, shares: str) -> str:
        # Never a table scan, which the optimizer picks when one name has most
        # of the table's rows: a locking scan waits on every row another
        # transaction has locked, other names' too, and two releases of two
        # names, each waiting on the other's row, are a deadlock.
        return f"{shares} FORCE INDEX ({SHARES_INDEX})"

    def delete_by_digest(self, shares: str) -> str:
        # The multi-table form: a single-table DELETE takes no index hint.
        return f"DELETE s FROM {shares} s FORCE INDEX ({SHARES_INDEX})"

    def epoch(self, column: str) -> str:
        # Not UNIX_TIMESTAMP(): it reads the value in the session's time zone.
        return f"TIMESTAMPDIFF(MICROSECOND, '1970-01-01', {column}) / 1e6"

    def extend_sql(self, sql: dict[str, str]) -> None:
        # Permit waiters on MariaDB wait in a statement that a release cuts
        # short (KILL QUERY ID): GET_LOCK, with a timeout, on their
        # process's gate, which another connection holds. A waiter's place
        # names its connection's bell, a user lock the connection holds:
        # IS_USED_LOCK gives the waiter's session, or NULL once it has gone,
        # and a place whose bell is free holds nobody up.
        shares, live = SHARES, f"expires_at > {self.now}"
        ahead = sql["queue_ahead"]
        held = (
            f"SELECT count(*) FROM {shares} WHERE digest = %s "
            f"AND kind = 'permit' AND {live}"
        )
        # Wait unless a permit is free for the waiter: a release committed
        # before this statement began is seen here, and one committed after
        # finds the statement running, so no wake-up is lost.
        sql["permit_doze"] = (
            f"SELECT '{DOZE}', IF(({held}) + ({ahead}) < %s, 0, GET_LOCK(%s, %s))"
        )
        # The waiting statements of the first waiters in line, as many as
        # there are free permits.
        sql["permit_wake"] = (
            "SELECT p.QUERY_ID FROM information_schema.PROCESSLIST p JOIN ("
            "SELECT IS_USED_LOCK(channel) AS conn, ROW_NUMBER() OVER "
            f"(ORDER BY id) AS n FROM {shares} WHERE digest = %s AND "
            f"kind = 'queued' AND {live} AND IS_USED_LOCK(channel) IS NOT NULL"
            ") w ON p.ID = w.conn WHERE p.INFO LIKE 'SELECT ''"
            f"{DOZE}''%%' AND w.n <= (SELECT COALESCE(max(permits), 0) FROM "
            f"{shares} WHERE digest = %s AND kind = 'queued') - ({held})"
        )


class SQLiteDialect(Dialect):
    """SQLite: no row locks; writers are serialized by the database file."""

    vendor = "sqlite"
    # The whole file is the lock: BEGIN IMMEDIATE takes the write lock up front.
    begin = "BEGIN IMMEDIATE"
    # Even an UPDATE that matches no row takes the file's write lock while it
    # runs, and a transaction that has read and then writes gets SQLITE_BUSY
    # at once, without the busy timeout, if another connection holds that
    # lock ("database is locked"): the holder's own transaction, while
    # waiters try the lock it holds. So an attempt reads the row first and
    # writes only if the row is free.
    looks_first = True
    for_update = ""
    for_share = ""
    now = "strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')"
    later = "strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', %s)"
    remaining = "(julianday(expires_at) - julianday('now')) * 86400.0"

    def ttl_param(self, seconds: float) -> Any:
        return f"+{seconds:.6f} seconds"

    def epoch(self, column: str) -> str:
        return f"(julianday({column}) - 2440587.5) * 86400.0"

    def prepare(self, sql: str) -> str:
        return sql.replace("%s", "?").replace("%%", "%")

    def ring_bells(self, function: str) -> None:
        """Pass over the places whose bell nobody has bound any more: their
        waiters have gone (SQL ``function``, which each connection of the
        backend is given; see bells.py)."""
        self.waiter_alive = f" AND (channel IS NULL OR {function}(channel))"

    def extend_sql(self, sql: dict[str, str]) -> None:
        # A permit's release hands the free permits to the waiters first in
        # line (see bells.py): it reads the queue, grants, and passes over
        # (deletes) the places of waiters that have gone.
        shares, now, later = SHARES, self.now, self.later
        live = f"expires_at > {now}"
        sql["permit_queue"] = (
            f"SELECT id, token, ttl, channel, permits FROM {shares} WHERE "
            f"digest = %s AND kind = 'queued' AND {live} ORDER BY id"
        )
        sql["place_grant"] = (
            f"UPDATE {shares} SET kind = 'permit', fence = %s, "
            f"acquired_at = {now}, expires_at = {later} WHERE id = %s"
        )
        sql["place_drop"] = f"DELETE FROM {shares} WHERE id = %s"
        # A waiter's attempt finds the permit a release handed it meanwhile.
        sql["place_granted"] = (
            f"SELECT fence FROM {shares} WHERE digest = %s AND token = %s "
            f"AND kind = 'permit' AND {live}"
        )


DIALECTS: dict[str, type[Dialect]] = {
    d.vendor: d for d in (PostgresDialect, MySQLDialect, SQLiteDialect)
}
