"""Database backend: one row per lock name in the app's own table.

Every lock is a row of :class:`~django_distlock.models.LockRecord`, keyed by
a SHA-256 digest of ``(KEY_PREFIX, name)``. Each thread of a process talks
to the database through a connection of its own, opened with Django's own
machinery from the ``DATABASES`` entry but never shared with the ORM, so an
acquisition never runs inside, commits or rolls back the caller's
transaction.

The hot path is one raw SQL statement per operation, in autocommit:

- acquire: ``UPDATE ... SET token, fence = fence + 1, expires_at = now + ttl
  WHERE digest = ... AND (token IS NULL OR expires_at <= now)``, returning the
  new fence (``RETURNING`` on PostgreSQL and SQLite, ``LAST_INSERT_ID(expr)``
  on MySQL/MariaDB). The UPDATE takes the same row lock a ``SELECT ... FOR
  UPDATE`` would, for one statement instead of a four-statement transaction.
  A miss is followed by a probe that tells "busy for N more seconds" from
  "no row yet"; the row is then created in a short transaction (a unique
  digest and ``ON CONFLICT DO NOTHING`` settle the race between creators).
- release, extend, force release: owner-checked conditional UPDATEs.

On PostgreSQL the statements are prepared once per connection, and a release
does not wait for the WAL flush (losing one in a crash only delays the lock's
expiry).

Expiry is compared with the database's clock (``clock_timestamp()``,
``UTC_TIMESTAMP(6)``, SQLite's ``'now'``), never the app server's, so clock
skew between app servers does not matter. Waiting is polling with jittered
exponential backoff (capped by ``OPTIONS["MAX_BACKOFF"]``, 50 ms) that also
wakes up when the holder's lease runs out; on PostgreSQL,
``OPTIONS["WAIT"] = "notify"`` makes waiters sleep on LISTEN until a
release's NOTIFY instead. The polling loop is written once, as a generator of
steps (an attempt, a sleep) that a synchronous and an asyncio executor drive,
as in :mod:`.steps`, so ``acquire`` and ``aacquire`` cannot drift apart.

See ``docs/backends/database.md`` for the guarantees per database.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import os
import random
import re
import secrets
import sqlite3
import threading
import time
import weakref
from collections.abc import Callable, Generator, Iterable, Iterator
from datetime import datetime, timezone
from typing import Any

from asgiref.sync import sync_to_async

from ..exceptions import LockBackendError
from .base import BaseLockBackend, Holder, Lease, holder_identity

__all__ = ["DatabaseLockBackend", "decode_name", "encode_name", "record_digest"]

release_log = logging.getLogger("django_distlock.release")

#: ``digest`` of the fence-floor row: the highest fence of any deleted row.
FLOOR = ""
#: First and longest sleep between two polls of a busy lock, seconds.
MIN_BACKOFF = 0.001
DEFAULT_MAX_BACKOFF = 0.05
#: Rows deleted per statement by :meth:`DatabaseLockBackend.clear_stale`.
DELETE_CHUNK = 500
#: Longest wait for a notification before trying again anyway, seconds: it
#: bounds the delay after a release by a process that does not notify.
NOTIFY_SAFETY_WAIT = 1.0
#: MySQL/MariaDB errors worth one retry: lock wait timeout, deadlock.
MYSQL_RETRY_CODES = {1205, 1213}

#: The polling loop as a generator of ``(kind, argument)`` steps, driven by
#: :meth:`DatabaseLockBackend._run` or :meth:`DatabaseLockBackend._arun`.
Steps = Generator[tuple[str, Any], Any, Any]

_ESCAPE = re.compile("[\\\\\x00\ud800-\udfff]")
_UNESCAPE = re.compile(r"\\(\\|0|u[0-9a-f]{4})")


def encode_name(name: str) -> str:
    """Return ``name`` as storable text: ``\\``, NUL, lone surrogates escaped.

    PostgreSQL text cannot hold NUL and no driver sends lone surrogates; the
    escaping is per character, so ``encode_name`` keeps prefixes.
    """

    def escape(match: re.Match) -> str:
        ch = match.group()
        if ch == "\\":
            return "\\\\"
        if ch == "\x00":
            return "\\0"
        return f"\\u{ord(ch):04x}"

    return _ESCAPE.sub(escape, name)


def decode_name(stored: str) -> str:
    """Inverse of :func:`encode_name`."""
    if "\\" not in stored:
        return stored

    def unescape(match: re.Match) -> str:
        code = match.group(1)
        if code == "\\":
            return "\\"
        if code == "0":
            return "\x00"
        return chr(int(code[1:], 16))

    return _UNESCAPE.sub(unescape, stored)


def record_digest(namespace: str, name: str) -> str:
    """Return the row key of ``name`` under ``namespace`` (64 hex digits).

    Hex, not base64: MySQL's default collations compare case-insensitively.
    """
    raw = f"{len(namespace)}:{namespace}:{name}".encode("utf-8", "surrogatepass")
    return hashlib.sha256(raw).hexdigest()


# -- SQL per database ------------------------------------------------------


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

    def ttl_param(self, seconds: float) -> Any:
        """Return ``seconds`` as the parameter of :attr:`later`."""
        return float(seconds)

    def epoch(self, column: str) -> str:
        """Return SQL for ``column`` (a UTC time) as seconds since 1970."""
        return f"EXTRACT(EPOCH FROM {column})::float8"

    def prepare(self, sql: str) -> str:
        """Return ``sql`` in the driver's placeholder style."""
        return sql

    def build(self, table: str) -> dict[str, str]:
        """Return every statement of the backend, for ``table`` (quoted)."""
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
                f"SELECT token IS NULL OR expires_at <= {now}, {self.remaining} "
                f"FROM {table} WHERE digest = %s"
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
                f"expires_at > {now} AND substr(name, 1, %s) = %s"
            ),
            "stale": (
                f"SELECT id, fence, token IS NOT NULL FROM {table} WHERE "
                "namespace = %s AND digest <> '' AND "
                f"(token IS NULL OR expires_at <= {now}){self.for_update}"
            ),
            "raise_floor": (
                f"UPDATE {table} SET fence = %s WHERE digest = '' AND fence < %s"
            ),
            "delete": f"DELETE FROM {table} WHERE id IN ",
        }
        self.extend_sql(sql)
        return {key: self.prepare(value) for key, value in sql.items()}

    def extend_sql(self, sql: dict[str, str]) -> None:
        """Add or change vendor-specific statements in ``sql``."""


class PostgresDialect(Dialect):
    """PostgreSQL: ``clock_timestamp()``, UPDATE ... RETURNING."""

    vendor = "postgresql"
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

    def ttl_param(self, seconds: float) -> Any:
        return int(math.ceil(seconds * 1_000_000))

    def epoch(self, column: str) -> str:
        # Not UNIX_TIMESTAMP(): it reads the value in the session's time zone.
        return f"TIMESTAMPDIFF(MICROSECOND, '1970-01-01', {column}) / 1e6"


class SQLiteDialect(Dialect):
    """SQLite: no row locks; writers are serialized by the database file."""

    vendor = "sqlite"
    # The whole file is the lock: BEGIN IMMEDIATE takes the write lock up front.
    begin = "BEGIN IMMEDIATE"
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


DIALECTS: dict[str, type[Dialect]] = {
    d.vendor: d for d in (PostgresDialect, MySQLDialect, SQLiteDialect)
}


# -- connections -----------------------------------------------------------


def _close_raw(wrapper: Any, pid: int) -> None:
    # Never close a connection inherited through fork: it is the parent's.
    if os.getpid() != pid or wrapper.connection is None:
        return
    try:
        wrapper.connection.close()
    except Exception:  # noqa: BLE001 - closing a broken connection
        pass
    wrapper.connection = None


class _Connection:
    """One thread's private connection to the lock database."""

    def __init__(self, wrapper: Any, prepared: bool = False):
        self.wrapper = wrapper
        self.pid = os.getpid()
        self.prepared = prepared
        self._cursor: Any = None
        self.errors = (wrapper.Database.Error, _django_db_error())
        self.finalizer = weakref.finalize(self, _close_raw, wrapper, self.pid)

    def cursor(self) -> Any:
        """Return the driver's own cursor (no Django wrapping on the hot path)."""
        if self._cursor is None or self.wrapper.connection is None:
            self.wrapper.ensure_connection()
            if self.prepared:
                import psycopg

                # Server-side binding, whatever Django's cursor_factory is;
                # Django sets prepare_threshold=None, which would ignore
                # prepare=True.
                raw = self.wrapper.connection
                raw.prepare_threshold = 5
                self._cursor = psycopg.Cursor(raw)
            else:
                self._cursor = self.wrapper.connection.cursor()
        return self._cursor

    def reset(self) -> None:
        """Drop the connection; the next :meth:`cursor` reconnects."""
        self._cursor = None
        _close_raw(self.wrapper, self.pid)

    def usable(self) -> bool:
        """Return True if the connection is still alive."""
        if self.wrapper.connection is None:
            return False
        try:
            return self.wrapper.is_usable()
        except Exception:  # noqa: BLE001 - any failure means unusable
            return False


class _SharedConnection(_Connection):
    """The thread's own Django connection, for an in-memory SQLite database.

    Another connection would open another, empty database (or, in
    shared-cache mode, fail on SQLite's table locks), and an in-memory
    database is private to one process anyway. Statements then run in the
    caller's transaction when there is one (savepoints instead of BEGIN),
    which is what test suites on in-memory SQLite need.
    """

    def __init__(self, alias: str):
        from django.db import connections

        self.alias = alias
        self.wrapper = connections[alias]
        self.pid = os.getpid()
        self._cursor = None
        self.errors = (self.wrapper.Database.Error, _django_db_error())
        self.finalizer = weakref.finalize(self, lambda: None)

    def cursor(self) -> Any:
        from django.db import connections

        wrapper = connections[self.alias]
        wrapper.ensure_connection()
        return wrapper.connection.cursor()

    def reset(self) -> None:
        """Leave Django's connection to Django."""


def _can_prepare(wrapper: Any) -> bool:
    """Return True if statements on ``wrapper``'s database may be prepared.

    PostgreSQL with psycopg 3, unless ``DISABLE_SERVER_SIDE_CURSORS`` says a
    transaction pooler (PgBouncer) sits in between: prepared statements do
    not survive it.
    """
    if wrapper.vendor != "postgresql" or wrapper.settings_dict.get(
        "DISABLE_SERVER_SIDE_CURSORS"
    ):
        return False
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return False
    return getattr(wrapper.Database, "__name__", "") == "psycopg"


def _channel(digest: str) -> str:
    """Return the LISTEN/NOTIFY channel of a lock (hex: a safe identifier)."""
    return "distlock_" + digest[:40]


def _django_db_error() -> type[Exception]:
    from django.db import Error

    return Error


class _Handoff:
    """A worker thread's result, for its awaiting task or, if it left, ``undo``.

    Cancelling a task that awaits ``sync_to_async`` does not stop the thread:
    what an acquisition obtains after its task was cancelled must be given
    back. Exactly one side undoes it: the thread, if the task left before the
    result was ready, or the task, if the result was ready but never reached
    it.
    """

    def __init__(self, undo: Callable[[Any], None]):
        self._lock = threading.Lock()
        self._undo = undo
        self.abandoned = False
        self._delivered = False
        self._result: Any = None

    def run(self, func: Callable[..., Any], *args: Any) -> Any:
        """Return ``func(*args)``, undone at once if the task has left."""
        result = func(*args)
        with self._lock:
            if not self.abandoned:
                self._delivered = True
                self._result = result
                return result
        self._undo(result)
        return result

    def abandon(self) -> None:
        """Mark the task gone; undo a result that was ready, in a thread."""
        with self._lock:
            self.abandoned = True
            delivered, result = self._delivered, self._result
        if delivered:
            threading.Thread(
                target=self._undo, args=(result,), name="distlock-undo"
            ).start()

    async def arun(self, func: Callable[..., Any], *args: Any) -> Any:
        """Await :meth:`run` in a worker thread; abandon it if cancelled."""
        try:
            return await sync_to_async(self.run, thread_sensitive=False)(func, *args)
        except asyncio.CancelledError:
            self.abandon()
            raise


_backends: weakref.WeakSet = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for backend in list(_backends):
        backend._forget_connections()


os.register_at_fork(after_in_child=_after_fork_in_child)


# -- the backend -----------------------------------------------------------


class DatabaseLockBackend(BaseLockBackend):
    """Locks as rows of a table in one of the project's databases.

    ``OPTIONS["DATABASE"]`` names the ``DATABASES`` alias (default
    ``"default"``); PostgreSQL, MySQL/MariaDB and SQLite (3.35+) are
    supported. ``OPTIONS["MAX_BACKOFF"]`` caps the sleep between two polls
    of a busy lock (seconds, default 0.05). On PostgreSQL,
    ``OPTIONS["WAIT"] = "notify"`` makes waiters sleep until a release's
    ``NOTIFY`` (or the holder's expiry) instead of polling; every process
    using the table should then set it. ``KEY_PREFIX`` separates the locks
    of aliases that share one table.
    """

    OPTION_KEYS = {"DATABASE", "MAX_BACKOFF", "WAIT"}

    def __init__(self, alias: str, params: dict[str, Any]):
        super().__init__(alias, params)
        self.database = str(self.options.get("DATABASE", "default"))
        self.max_backoff = float(self.options.get("MAX_BACKOFF", DEFAULT_MAX_BACKOFF))
        self.wait_notify = self.options.get("WAIT", "poll") == "notify"
        self._local = threading.local()
        self._connections: weakref.WeakSet = weakref.WeakSet()
        self._setup_lock = threading.Lock()
        self._sql: dict[str, str] | None = None
        self._in_memory = False
        self._prepared = False
        self._dialect: Dialect | None = None
        _backends.add(self)

    @classmethod
    def check(cls, alias: str, params: dict[str, Any]) -> list:
        """Return system check messages for this backend's LOCKS entry."""
        from django.conf import settings
        from django.core.checks import Error, Warning
        from django.db import connections

        where = f"LOCKS[{alias!r}]['OPTIONS']"
        options = params.get("OPTIONS") or {}
        errors: list = []
        unknown = sorted(set(options) - cls.OPTION_KEYS)
        if unknown:
            errors.append(
                Error(
                    f"{where} has unknown keys: {unknown}.",
                    hint=f"{cls.__name__} accepts {sorted(cls.OPTION_KEYS)}.",
                    obj="settings.LOCKS",
                    id="distlock.E009",
                )
            )
        backoff = options.get("MAX_BACKOFF", DEFAULT_MAX_BACKOFF)
        if (
            isinstance(backoff, bool)
            or not isinstance(backoff, (int, float))
            or (not backoff > 0)
        ):
            errors.append(
                Error(
                    f"{where}['MAX_BACKOFF'] must be a positive number of seconds.",
                    hint="The default, 0.05, makes a waiter notice a release "
                    "within about 50 ms.",
                    obj="settings.LOCKS",
                    id="distlock.E009",
                )
            )
        wait = options.get("WAIT", "poll")
        if wait not in ("poll", "notify"):
            errors.append(
                Error(
                    f"{where}['WAIT'] must be 'poll' or 'notify', not {wait!r}.",
                    hint="'notify' (PostgreSQL only) wakes waiters with "
                    "LISTEN/NOTIFY instead of polling.",
                    obj="settings.LOCKS",
                    id="distlock.E009",
                )
            )
        database = options.get("DATABASE", "default")
        if not isinstance(database, str) or database not in settings.DATABASES:
            errors.append(
                Error(
                    f"{where}['DATABASE'] is {database!r}, which is not in "
                    "settings.DATABASES.",
                    hint="Name a DATABASES alias (default 'default') whose "
                    "database has the django_distlock migrations applied.",
                    obj="settings.LOCKS",
                    id="distlock.E012",
                )
            )
            return errors
        vendor = connections[database].vendor
        if wait == "notify" and vendor != "postgresql":
            errors.append(
                Error(
                    f"{where}['WAIT'] is 'notify' on {database!r}, a {vendor} "
                    "database.",
                    hint="LISTEN/NOTIFY exists on PostgreSQL only; leave WAIT "
                    "out to poll.",
                    obj="settings.LOCKS",
                    id="distlock.E009",
                )
            )
        if vendor not in DIALECTS:
            errors.append(
                Error(
                    f"{where}['DATABASE'] is {database!r}, a {vendor} database, "
                    "which the database lock backend does not support.",
                    hint="Use PostgreSQL, MySQL/MariaDB or SQLite, or another "
                    "lock backend.",
                    obj="settings.LOCKS",
                    id="distlock.E014",
                )
            )
        elif vendor == "sqlite":
            if sqlite3.sqlite_version_info < (3, 35):
                errors.append(
                    Error(
                        f"{where}['DATABASE'] is {database!r}, on SQLite "
                        f"{sqlite3.sqlite_version}; the lock backend needs 3.35+.",
                        hint="It uses UPDATE ... RETURNING; upgrade SQLite.",
                        obj="settings.LOCKS",
                        id="distlock.E014",
                    )
                )
            if settings.DATABASES[database].get("ATOMIC_REQUESTS"):
                errors.append(
                    Warning(
                        f"LOCKS[{alias!r}] keeps its locks in SQLite database "
                        f"{database!r}, which has ATOMIC_REQUESTS = True.",
                        hint="SQLite has one writer at a time: a lock taken or "
                        "released inside a request's write transaction waits for "
                        "that transaction. Keep the locks in a separate SQLite "
                        "file (another DATABASES alias) or use another backend.",
                        obj="settings.LOCKS",
                        id="distlock.W003",
                    )
                )
        return errors

    # -- connections ------------------------------------------------------

    @property
    def dialect(self) -> Dialect:
        """The SQL dialect of the lock database."""
        if self._dialect is None:
            self._setup()
        return self._dialect  # type: ignore[return-value]

    def _setup(self) -> None:
        from django.db import connections

        from ..models import LockRecord

        with self._setup_lock:
            if self._sql is not None:
                return
            wrapper = connections[self.database]
            try:
                dialect = DIALECTS[wrapper.vendor]()
            except KeyError:
                raise LockBackendError(
                    f"Database lock backend {self.alias!r}: {wrapper.vendor} "
                    "databases are not supported."
                ) from None
            table = wrapper.ops.quote_name(LockRecord._meta.db_table)
            self._integrity_error = wrapper.Database.IntegrityError
            self._in_memory = wrapper.vendor == "sqlite" and wrapper.is_in_memory_db()
            self._prepared = _can_prepare(wrapper)
            self._dialect = dialect
            self._sql = dialect.build(table)

    def _new_wrapper(self) -> Any:
        from django.db import connections
        from django.db.utils import load_backend

        # Shallow copies: OPTIONS may hold objects that cannot be deep-copied
        # (an SSL context, a pool's callables).
        settings_dict = dict(connections[self.database].settings_dict)
        settings_dict["ATOMIC_REQUESTS"] = False
        settings_dict["AUTOCOMMIT"] = True
        options = settings_dict["OPTIONS"] = dict(settings_dict.get("OPTIONS") or {})
        vendor = connections[self.database].vendor
        if vendor == "postgresql":
            # One plain connection per thread: no pool, the default READ
            # COMMITTED (single statements re-check rows they wait for).
            options.pop("pool", None)
            options.pop("isolation_level", None)
            options.setdefault("application_name", "django_distlock")
        elif vendor == "mysql":
            # No gap locks, so two creators of one row cannot deadlock.
            options["isolation_level"] = "read committed"
        backend = load_backend(settings_dict["ENGINE"])
        return backend.DatabaseWrapper(settings_dict, self.database)

    def _connection(self) -> _Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            if self._sql is None:
                self._setup()
            if self._in_memory:
                conn = _SharedConnection(self.database)
            else:
                conn = _Connection(self._new_wrapper(), self._prepared)
            self._local.conn = conn
            self._connections.add(conn)
        return conn

    def _forget_connections(self) -> None:
        # In a forked child: the parent's sockets are not ours to use or close.
        self._local = threading.local()
        self._connections = weakref.WeakSet()

    def close(self) -> None:
        """Close every thread's connection (they reconnect on next use)."""
        for conn in list(self._connections):
            conn.finalizer()
        self._forget_connections()

    def _call(self, what: str, func: Callable[..., Any], *args: Any) -> Any:
        """Run ``func(cursor, *args)``; map driver errors to LockBackendError.

        A connection found dead (a restarted server, a killed session) is
        reopened and the call tried once more; every statement here is safe
        to repeat, because a retried acquisition recognises its own token.
        """
        for attempt in (1, 2):
            conn = self._connection()
            try:
                return func(conn.cursor(), *args)
            except conn.errors as e:
                if attempt == 1 and self._worth_retrying(conn, e):
                    continue
                raise self._error(e, what) from e
        raise AssertionError("unreachable")  # pragma: no cover

    def _worth_retrying(self, conn: _Connection, exc: Exception) -> bool:
        code = exc.args[0] if exc.args else None
        if self.dialect.vendor == "mysql" and code in MYSQL_RETRY_CODES:
            return True
        if self.dialect.vendor == "sqlite":
            return False  # "database is locked" has already waited its timeout
        if conn.usable():
            return False
        conn.reset()
        return True

    def _error(self, exc: Exception, what: str) -> LockBackendError:
        message = str(exc).strip()
        hint = ""
        if "lockrecord" in message.lower():
            hint = " (has `manage.py migrate` been run on that database?)"
        elif "database is locked" in message:
            hint = (
                " (SQLite has one writer at a time: is this thread or another "
                "inside a write transaction on the same file?)"
            )
        return LockBackendError(
            f"Database lock backend {self.alias!r} failed to {what} on database "
            f"{self.database!r}: {message}{hint}"
        )

    def _execute(self, cursor: Any, key: str, params: tuple) -> None:
        """Run statement ``key``; prepared once per connection where possible."""
        if self._prepared:
            cursor.execute(self._sql[key], params, prepare=True)
        else:
            cursor.execute(self._sql[key], params)

    def _transaction(self, cursor: Any, body: Callable[[Any], Any]) -> Any:
        if self._in_memory and cursor.connection.in_transaction:
            # Only on the caller's own connection (in-memory SQLite).
            begin, commit = "SAVEPOINT distlock", "RELEASE SAVEPOINT distlock"
            rollback = "ROLLBACK TO SAVEPOINT distlock; RELEASE SAVEPOINT distlock"
        else:
            begin, commit, rollback = self.dialect.begin, "COMMIT", "ROLLBACK"
        cursor.execute(begin)
        try:
            result = body(cursor)
        except BaseException:
            try:
                for statement in rollback.split("; "):
                    cursor.execute(statement)
            except Exception:  # noqa: BLE001 - the connection may be gone
                pass
            raise
        cursor.execute(commit)
        return result

    # -- the algorithm, one attempt at a time -----------------------------

    def _digest(self, name: str) -> str:
        return record_digest(self.key_prefix, name)

    @staticmethod
    def _identity() -> tuple[str, int, str]:
        host, pid, thread = holder_identity()
        return host[:255], pid, thread[:255]

    def _attempt(
        self,
        cursor: Any,
        name: str,
        digest: str,
        token: str,
        ttl: float,
        identity: tuple[str, int, str],
    ) -> tuple[int | None, float]:
        """Try once. Return ``(fence, 0)`` or ``(None, seconds worth waiting)``."""
        dialect = self._dialect
        host, pid, thread = identity
        ttl_p = dialect.ttl_param(ttl)
        run = self._execute
        run(cursor, "acquire", (token, host, pid, thread, ttl_p, digest, token))
        if dialect.returning:
            # fetchall, not fetchone: SQLite commits when the statement ends.
            rows = cursor.fetchall()
            if rows:
                return int(rows[0][0]), 0.0
        elif cursor.rowcount:
            return int(cursor.lastrowid), 0.0
        run(cursor, "probe", (digest,))
        rows = cursor.fetchall()
        if not rows:
            fence = self._transaction(
                cursor,
                lambda cur: self._create(cur, name, digest, token, ttl_p, identity),
            )
            return fence, 0.0
        free, remaining = rows[0]
        if free:
            return None, 0.0  # released between the two statements: go again
        return None, max(0.0, float(remaining or 0.0))

    def _create(
        self,
        cursor: Any,
        name: str,
        digest: str,
        token: str,
        ttl_p: Any,
        identity: tuple[str, int, str],
    ) -> int | None:
        # Inside a transaction. The shared lock on the floor row keeps
        # clear_stale() from deleting rows (and raising the floor) meanwhile,
        # so a re-created row starts above every fence its name ever had.
        self._execute(cursor, "ensure_floor", ())
        self._execute(cursor, "floor_shared", ())
        floor = int(cursor.fetchall()[0][0])
        host, pid, thread = identity
        params = (
            digest,
            self.key_prefix,
            encode_name(name),
            token,
            floor + 1,
            host,
            pid,
            thread,
            ttl_p,
        )
        if self.dialect.vendor == "mysql":
            try:
                self._execute(cursor, "create", params)
            except self._integrity_error:
                return None  # another creator won; the caller polls
        else:
            self._execute(cursor, "create", params)
            if cursor.rowcount != 1:
                return None
        return floor + 1

    def _extend_once(self, cursor: Any, digest: str, token: str, ttl: float) -> bool:
        self._execute(cursor, "extend", (self._dialect.ttl_param(ttl), digest, token))
        return cursor.rowcount == 1

    def _release_once(self, cursor: Any, digest: str, token: str) -> bool:
        run = self._execute
        if self.wait_notify:
            run(cursor, "release_notify", (digest, token, _channel(digest)))
            released = cursor.fetchall()[0][0] == 1
        else:
            run(cursor, "release", (digest, token))
            released = cursor.rowcount == 1
        if released:
            return True
        # Expired (not yet taken over): clear it anyway, but report the loss.
        run(cursor, "drop", (digest, token))
        return False

    def _is_held_once(self, cursor: Any, digest: str, token: str) -> bool:
        self._execute(cursor, "is_held", (digest, token))
        return bool(cursor.fetchall())

    def _drop_once(self, cursor: Any, digest: str, token: str) -> bool:
        self._execute(cursor, "drop", (digest, token))
        dropped = cursor.rowcount == 1
        if dropped and self.wait_notify:
            self._execute(cursor, "notify", (_channel(digest),))
            cursor.fetchall()
        return dropped

    # -- waiting for a notification (PostgreSQL, WAIT = "notify") ---------

    def _listening(self, cursor: Any) -> set[str]:
        # The channels this thread's *current* connection listens to; a
        # reconnection starts from an empty set.
        raw = cursor.connection
        state = getattr(self._local, "listen", None)
        if state is None or state[0] is not raw:
            state = self._local.listen = (raw, set())
        return state[1]

    def _listen_and_attempt(self, cursor: Any, channel: str, *args: Any) -> Any:
        listening = self._listening(cursor)
        if channel not in listening:
            # LISTEN before the attempt: a release committed after the
            # attempt is then sure to be delivered (no lost wakeup).
            cursor.execute(f"LISTEN {channel}")
            listening.add(channel)
        return self._attempt(cursor, *args)

    def _wait_notified(self, cursor: Any, channel: str, timeout: float) -> None:
        if channel not in self._listening(cursor):
            return  # reconnected meanwhile: attempt (and LISTEN) again now
        for _ in cursor.connection.notifies(timeout=timeout, stop_after=1):
            break

    def _unlisten(self, cursor: Any, channel: str) -> None:
        listening = self._listening(cursor)
        if channel in listening:
            listening.discard(channel)
            cursor.execute(f"UNLISTEN {channel}")

    def _acquire_notified(
        self,
        name: str,
        ttl: float,
        timeout: float | None,
        identity: tuple[str, int, str],
        handoff: _Handoff | None = None,
    ) -> Lease | None:
        digest = self._digest(name)
        token = secrets.token_hex(16)
        channel = _channel(digest)
        deadline = math.inf if timeout is None else time.monotonic() + timeout
        args = (name, digest, token, ttl, identity)
        sent = time.monotonic()
        fence, hint = self._call("acquire", self._attempt, *args)
        if fence is None and timeout != 0:
            try:
                while fence is None and not (handoff and handoff.abandoned):
                    sent = time.monotonic()
                    fence, hint = self._call(
                        "acquire", self._listen_and_attempt, channel, *args
                    )
                    left = deadline - time.monotonic()
                    if fence is not None or left <= 0:
                        break
                    if hint:
                        wait = min(hint + 0.001, left, NOTIFY_SAFETY_WAIT)
                        self._call("wait", self._wait_notified, channel, wait)
            finally:
                try:
                    self._call("stop listening", self._unlisten, channel)
                except LockBackendError:
                    pass
        if fence is None:
            return None
        return Lease(self.alias, name, token, fence, ttl, sent + ttl, state=digest)

    # -- polling, written once for acquire() and aacquire() ---------------

    def _acquire_steps(
        self,
        name: str,
        ttl: float,
        timeout: float | None,
        identity: tuple[str, int, str],
    ) -> Steps:
        """Poll for ``name`` until acquired or ``timeout``; return the lease.

        Yield ``("attempt", args)``, to be answered with what
        ``_attempt(cursor, *args)`` returns, or ``("sleep", seconds)``; the
        executors :meth:`_run` and :meth:`_arun` carry them out.
        """
        digest = self._digest(name)
        token = secrets.token_hex(16)
        args = (name, digest, token, ttl, identity)
        deadline = math.inf if timeout is None else time.monotonic() + timeout
        delay = MIN_BACKOFF
        quick = 0
        while True:
            sent = time.monotonic()
            fence, hint = yield ("attempt", args)
            if fence is not None:
                return Lease(
                    self.alias, name, token, fence, ttl, sent + ttl, state=digest
                )
            if not hint and quick < 3:
                quick += 1  # the row was free or just created: go again now
                continue
            left = deadline - time.monotonic()
            if timeout == 0 or left <= 0:
                return None
            # Jittered exponential backoff, but wake when the lease can expire.
            wait = min(random.uniform(delay / 2, delay), hint + 0.001, left)
            yield ("sleep", max(0.0, wait))
            delay = min(delay * 2, self.max_backoff)

    def _run(self, steps: Steps) -> Any:
        """Carry out ``steps`` in this thread; return its result.

        The steps hold nothing to clean up: an error just propagates.
        """
        reply = None
        while True:
            try:
                kind, arg = steps.send(reply)
            except StopIteration as stop:
                return stop.value
            if kind == "attempt":
                reply = self._call("acquire", self._attempt, *arg)
            else:
                time.sleep(arg)
                reply = None

    async def _arun(self, steps: Steps) -> Any:
        """Carry out ``steps`` on the event loop, attempts in worker threads.

        An attempt whose task is cancelled while it runs releases what it
        obtains (see :class:`_Handoff`).
        """
        reply = None
        while True:
            try:
                kind, arg = steps.send(reply)
            except StopIteration as stop:
                return stop.value
            if kind == "attempt":
                reply = await self._aattempt(*arg)
            else:
                await asyncio.sleep(arg)
                reply = None

    async def _aattempt(
        self, name: str, digest: str, token: str, *args: Any
    ) -> tuple[int | None, float]:
        def undo(result: tuple[int | None, float]) -> None:
            if result[0] is not None:
                self._give_back(digest, token)

        return await _Handoff(undo).arun(
            self._call, "acquire", self._attempt, name, digest, token, *args
        )

    def _give_back(self, digest: str, token: str) -> None:
        """Release a lease that no handle knows about (its task was cancelled)."""
        try:
            self._call("release", self._drop_once, digest, token)
        except LockBackendError:
            release_log.warning(
                "A cancelled acquisition could not give its lease back; it "
                "expires with its TTL.",
                exc_info=True,
            )

    # -- the contract -----------------------------------------------------

    def acquire(self, name: str, ttl: float, timeout: float | None) -> Lease | None:
        identity = self._identity()
        if self.wait_notify:
            return self._acquire_notified(name, ttl, timeout, identity)
        return self._run(self._acquire_steps(name, ttl, timeout, identity))

    async def aacquire(
        self, name: str, ttl: float, timeout: float | None
    ) -> Lease | None:
        """Poll from the event loop; each attempt runs in a worker thread.

        With ``WAIT = "notify"`` the whole wait runs in one worker thread,
        whose connection listens for the release. Cancelling the task does
        not stop a statement in flight: whatever it obtains afterwards is
        released as soon as the thread has it, and a notify wait ends at its
        next wake-up.
        """
        identity = self._identity()  # the task's identity, not the worker's
        if self.wait_notify:

            def undo(lease: Lease | None) -> None:
                if lease is not None:
                    self._give_back(self._lease_digest(lease), lease.token)

            handoff = _Handoff(undo)
            return await handoff.arun(
                self._acquire_notified, name, ttl, timeout, identity, handoff
            )
        return await self._arun(self._acquire_steps(name, ttl, timeout, identity))

    def _lease_digest(self, lease: Lease) -> str:
        return lease.state if isinstance(lease.state, str) else self._digest(lease.name)

    def release(self, lease: Lease) -> bool:
        return self._call(
            "release", self._release_once, self._lease_digest(lease), lease.token
        )

    def extend(self, lease: Lease, ttl: float) -> bool:
        sent = time.monotonic()
        ok = self._call(
            "extend", self._extend_once, self._lease_digest(lease), lease.token, ttl
        )
        if ok:
            lease.deadline = sent + ttl
        return ok

    def is_held(self, lease: Lease) -> bool:
        return self._call(
            "check", self._is_held_once, self._lease_digest(lease), lease.token
        )

    def _renew_once(self, cursor: Any, leases: list[Lease]) -> list[bool]:
        def renew_all(cur: Any) -> list[bool]:
            extend = self._extend_once
            return [
                extend(cur, self._lease_digest(lease), lease.token, lease.ttl)
                for lease in leases
            ]

        return self._transaction(cursor, renew_all)

    def renew(self, leases: Iterable[Lease]) -> list[bool | None]:
        """Renew every lease in one transaction: one commit, however many."""
        leases = list(leases)
        if len(leases) < 2:
            return super().renew(leases)
        sent = time.monotonic()
        try:
            results = self._call("renew", self._renew_once, leases)
        except LockBackendError:
            return [None] * len(leases)
        for lease, ok in zip(leases, results):
            if ok:
                lease.deadline = sent + lease.ttl
        return list(results)

    async def arelease(self, lease: Lease) -> bool:
        return await sync_to_async(self.release, thread_sensitive=False)(lease)

    async def aextend(self, lease: Lease, ttl: float) -> bool:
        return await sync_to_async(self.extend, thread_sensitive=False)(lease, ttl)

    async def ais_held(self, lease: Lease) -> bool:
        return await sync_to_async(self.is_held, thread_sensitive=False)(lease)

    async def arenew(self, leases: Iterable[Lease]) -> list[bool | None]:
        return await sync_to_async(self.renew, thread_sensitive=False)(list(leases))

    # -- listing and clearing ---------------------------------------------

    def _holder_rows(self, cursor: Any, prefix: str) -> list[tuple]:
        stored = encode_name(prefix)
        self._execute(cursor, "holders", (self.key_prefix, len(stored), stored))
        return list(cursor.fetchall())

    def holders(self, prefix: str = "") -> Iterator[Holder]:
        rows = self._call("list locks", self._holder_rows, prefix)
        when = datetime.fromtimestamp
        utc = timezone.utc
        for name, token, host, pid, thread, acquired, expires, fence in rows:
            name = decode_name(name)
            # Only a table left with a padding collation (MySQL before
            # 8.0.17, see migration 0002) can return more than the prefix.
            if not name.startswith(prefix):
                continue
            yield Holder(
                backend=self.alias,
                name=name,
                token=token,
                host=host,
                pid=pid,
                thread=thread,
                acquired_at=None if acquired is None else when(float(acquired), utc),
                expires_at=when(float(expires), utc),
                fencing_token=int(fence),
            )

    def force_release(self, name: str, token: str) -> bool:
        return self._call("force-release", self._drop_once, self._digest(name), token)

    def _drop_all(self, cursor: Any, pairs: list[tuple[str, str]]) -> list[bool]:
        drop = self._drop_once
        return self._transaction(
            cursor, lambda cur: [drop(cur, digest, token) for digest, token in pairs]
        )

    def force_release_many(self, items: Iterable[tuple[str, str]]) -> list[bool]:
        """Force-release each ``(name, token)``, a thousand per transaction."""
        pairs = [(self._digest(name), token) for name, token in items]
        results: list[bool] = []
        for i in range(0, len(pairs), 1000):
            chunk = pairs[i : i + 1000]
            results.extend(self._call("force-release", self._drop_all, chunk))
        return results

    def _clear_stale_once(self, cursor: Any) -> int:
        sql = self._sql
        self._execute(cursor, "ensure_floor", ())

        def clear(cur: Any) -> int:
            # Lock the floor, then the rows to delete: creators wait on the
            # floor, acquirers on their row, so nothing changes under us.
            self._execute(cur, "floor_locked", ())
            self._execute(cur, "stale", (self.key_prefix,))
            rows = cur.fetchall()
            if not rows:
                return 0
            top = max(int(fence) for _, fence, _ in rows)
            self._execute(cur, "raise_floor", (top, top))
            ids = [row[0] for row in rows]
            mark = "?" if self.dialect.vendor == "sqlite" else "%s"
            for i in range(0, len(ids), DELETE_CHUNK):
                chunk = ids[i : i + DELETE_CHUNK]
                cur.execute(
                    sql["delete"] + "(" + ", ".join([mark] * len(chunk)) + ")",
                    chunk,
                )
            return sum(1 for _, _, expired in rows if expired)

        return self._transaction(cursor, clear)

    def clear_stale(self) -> int:
        """Delete free and expired rows; return how many expired leases went.

        The highest fence among them is kept in the floor row first, so the
        fencing tokens of a name never go back when its row is re-created.
        """
        return self._call("clear stale locks", self._clear_stale_once)
