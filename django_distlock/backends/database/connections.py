"""The backend's own connections to the lock database, one per thread.

Each is opened with Django's machinery from the ``DATABASES`` entry (same
driver, options, ``connection_created`` signal) but never handed to the ORM,
so the backend's statements never run inside, commit or roll back the
caller's transaction. An in-memory SQLite database is the exception (see
:class:`_SharedConnection`).
"""

from __future__ import annotations

import logging
import os
import secrets
import threading
import weakref
from collections.abc import Callable
from typing import Any

from ...exceptions import LockBackendError
from . import bells
from .deadlines import DEADLINES, STATEMENT_DEADLINE
from .dialects import DIALECTS, SHARES, TABLE, Dialect
from .sessions import LIBPQ_TIMEOUTS, MYSQL_TIMEOUTS, idle_transaction_limiter

__all__ = [
    "ConnectionsMixin",
    "driver_without_notifies",
    "names_lock_tables",
    "transaction_pooled",
]

#: MySQL/MariaDB errors worth one retry: lock wait timeout, deadlock.
MYSQL_RETRY_CODES = {1205, 1213}
#: PostgreSQL errors of a prepared statement that is missing on, or already
#: exists on, the server connection: what a transaction pooler (PgBouncer)
#: that moves a session between server connections causes.
LOST_PREPARED_SQLSTATES = {"26000", "42P05"}
#: The same cause when the name exists there as another client's statement
#: with a different number of parameters: a protocol violation at Bind.
PROTOCOL_VIOLATION = "08P01"

#: How the backend finds a pooler in between (see _behind_a_pooler).
POOLER_ANSWERS = "a pooler answers for the server"
PREPARED_LOST = "prepared statements vanish between transactions"

logger = logging.getLogger("django_distlock.database")


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

    #: Whether its statements are prepared (PostgreSQL, psycopg 3).
    prepared = False
    #: The server process of its own session (PostgreSQL, no pooler in
    #: between), else None.
    session: int | None = None

    def __init__(
        self,
        wrapper: Any,
        prepared: bool = False,
        functions: tuple = (),
        on_connect: Callable[[Any], None] | None = None,
    ):
        self.wrapper = wrapper
        self.pid = os.getpid()
        self.prepared = prepared
        #: SQL functions each new SQLite connection is given:
        #: ``(name, number of arguments, callable)``.
        self.functions = functions
        #: Called with each new driver connection, before its first use.
        self.on_connect = on_connect
        self._cursor: Any = None
        self.errors = (wrapper.Database.Error, _django_db_error())
        self.finalizer = weakref.finalize(self, _close_raw, wrapper, self.pid)
        #: Held by the thread running a statement on it (see :meth:`close`).
        self.busy = threading.RLock()
        self.close_when_done = False

    def close(self) -> None:
        """Close it now, or as soon as the statement running on it ends.

        Another thread (the watchdog renewing, a waiter polling) may be in
        the middle of a statement: closing a driver connection under it is
        undefined behaviour (SQLite's module can crash the process), so that
        thread closes it when its call returns.
        """
        if self.busy.acquire(blocking=False):
            try:
                self.finalizer()
            finally:
                self.busy.release()
        else:
            self.close_when_done = True

    def cursor(self) -> Any:
        """Return the driver's own cursor (no Django wrapping on the hot path)."""
        if self._cursor is None or self.wrapper.connection is None:
            self.wrapper.ensure_connection()
            raw = self.wrapper.connection
            # What belongs to a server session (prepared statements, the
            # session's settings) is left out where a pooler answers: one
            # look, for both.
            own_session = True
            self.session = None
            if self.wrapper.vendor == "postgresql" and (
                self.prepared or self.on_connect is not None
            ):
                own_session = not _answered_by_a_pooler(raw)
                if own_session:
                    self.session = raw.info.backend_pid
            if not own_session:
                self.prepared = False
            if self.prepared:
                import psycopg

                # Server-side binding, whatever Django's cursor_factory is;
                # Django sets prepare_threshold=None, which would ignore
                # prepare=True.
                raw.prepare_threshold = 5
                cursor = psycopg.Cursor(raw)
            else:
                for name, arity, function in self.functions:
                    raw.create_function(name, arity, function)
                cursor = raw.cursor()
            # Before the cursor is kept: if this fails, the next call on
            # this connection runs it again.
            if self.on_connect is not None and own_session:
                self.on_connect(raw)
            self._cursor = cursor
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
        self.busy = threading.RLock()
        self.close_when_done = False

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
    if wrapper.vendor != "postgresql" or transaction_pooled(
        wrapper.vendor, wrapper.settings_dict
    ):
        return False
    return getattr(wrapper.Database, "__name__", "") == "psycopg"


def _answered_by_a_pooler(raw: Any) -> bool:
    """Return True if a pooler, not the server, answered PostgreSQL
    connection ``raw``.

    A server gives each connection the process id of its session (with the
    cancel key). A pooler that hands a client one server session after
    another has no such id to give, so it makes one up, and the session's
    own ``pg_backend_pid()`` differs from it. psycopg names its prepared
    statements by each connection's order of first use: behind such a
    pooler a name can stand, on the next session, for another client's
    statement, and one with as many parameters would run in place of ours.
    """
    cursor = raw.cursor()
    try:
        cursor.execute("SELECT pg_backend_pid()")
        (pid,) = cursor.fetchone()
    finally:
        cursor.close()
    return pid != raw.info.backend_pid  # psycopg 3 and psycopg2 alike


def driver_without_notifies(connection: Any) -> str | None:
    """Return the driver of PostgreSQL ``connection`` if it cannot wait for a
    notification with a timeout (psycopg2, psycopg before 3.2), else None."""
    from django.utils.version import get_version_tuple

    module = connection.Database
    if module.__name__ != "psycopg":
        return module.__name__
    if get_version_tuple(module.__version__) < (3, 2):
        return f"psycopg {module.__version__}"
    return None


def transaction_pooled(vendor: str, settings_dict: dict[str, Any]) -> bool:
    """Return True if the database is reached through a transaction pooler.

    Django's documented sign of one (PgBouncer with ``pool_mode =
    transaction``) is ``DISABLE_SERVER_SIDE_CURSORS = True``: consecutive
    transactions may then run on different server sessions, so nothing that
    belongs to a session (prepared statements, LISTEN) may be relied on.
    """
    return vendor == "postgresql" and bool(
        settings_dict.get("DISABLE_SERVER_SIDE_CURSORS")
    )


def names_lock_tables(message: str) -> bool:
    """Return True if a driver's error ``message`` names the backend's tables
    or functions: what a database that was not migrated answers."""
    message = message.lower()
    return any(t in message for t in ("lockrecord", "lockshare", "distlock_"))


def _django_db_error() -> type[Exception]:
    from django.db import Error

    return Error


_backends: weakref.WeakSet = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for backend in list(_backends):
        backend._forget_connections()
        if backend._bells is not None:
            backend._bells.forget()


os.register_at_fork(after_in_child=_after_fork_in_child)


class ConnectionsMixin:
    """The connection half of :class:`.backend.DatabaseLockBackend`.

    It expects ``alias`` and ``database`` on the instance and calls
    :meth:`_init_connections` from ``__init__``.
    """

    alias: str
    database: str
    dialect: Dialect  # a property of the backend

    def _init_connections(self) -> None:
        self._local = threading.local()
        self._connections: weakref.WeakSet = weakref.WeakSet()
        self._setup_lock = threading.Lock()
        self._sql: dict[str, str] | None = None
        self._in_memory = False
        #: Calls run under a deadline (PostgreSQL: see deadlines.py).
        self._watched = False
        self._prepared = False
        self._pooled = False
        self._handover = False
        #: Whether permit releases wake waiters (MariaDB, SQLite on Linux);
        #: None: not asked yet.
        self._rings: bool | None = False
        #: The threads' bells on SQLite (see bells.py).
        self._bells: bells.Bells | None = None
        self._functions: tuple = ()
        #: The connection holding this process's gate (MariaDB; see _gate).
        self._gatekeeper: _Connection | None = None
        self._gate_name = ""
        self._dialect: Dialect | None = None
        #: Driver errors after which an acquisition's outcome is unknown
        #: (the connection failed with the request out; see
        #: WaitingMixin._try_acquire).
        self._in_doubt_errors: tuple[type[Exception], ...] = ()
        _backends.add(self)

    def _setup(self) -> None:
        from django.db import connections

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
            table = wrapper.ops.quote_name(TABLE)
            self._integrity_error = wrapper.Database.IntegrityError
            if wrapper.vendor != "sqlite":  # in-process: no reply to lose
                from django.db import utils

                self._in_doubt_errors = (
                    wrapper.Database.OperationalError,
                    wrapper.Database.InterfaceError,
                    utils.OperationalError,  # raised by Django's connect()
                    utils.InterfaceError,
                )
            self._in_memory = wrapper.vendor == "sqlite" and wrapper.is_in_memory_db()
            self._watched = wrapper.vendor == "postgresql"
            self._prepared = _can_prepare(wrapper)
            self._pooled = transaction_pooled(wrapper.vendor, wrapper.settings_dict)
            self._handover = (
                dialect.share_functions
                and not self._pooled
                and driver_without_notifies(wrapper) is None
            )
            # MariaDB wakes permit waiters (_wakes() asks the server once),
            # and so does SQLite where its processes can ring each other's
            # bells (an in-memory database is polled by its one process).
            if dialect.vendor == "sqlite" and bells.AVAILABLE and not self._in_memory:
                self._bells = bells.Bells()
                self._functions = ((bells.SQL_FUNCTION, 1, bells.rings),)
                dialect.ring_bells(bells.SQL_FUNCTION)
            self._rings = None if dialect.vendor == "mysql" else self._bells is not None
            self._dialect = dialect
            self._sql = dialect.build(table, wrapper.ops.quote_name(SHARES))

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
            # A server cut off (a partition, a host that froze) fails a call
            # within seconds, where TCP would retransmit for about 15
            # minutes; DATABASES OPTIONS that set them win.
            for key, value in LIBPQ_TIMEOUTS.items():
                options.setdefault(key, value)
        elif vendor == "mysql":
            # No gap locks, so two creators of one row cannot deadlock.
            options["isolation_level"] = "read committed"
            # As for PostgreSQL: a server cut off fails a call within seconds.
            for key, value in MYSQL_TIMEOUTS.items():
                options.setdefault(key, value)
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
                wrapper = self._new_wrapper()
                conn = _Connection(
                    wrapper,
                    self._prepared,
                    self._functions,
                    idle_transaction_limiter(wrapper.vendor, self._pooled),
                )
            self._local.conn = conn
            self._connections.add(conn)
        return conn

    def _forget_connections(self) -> None:
        # In a forked child: the parent's sockets are not ours to use or close.
        self._local = threading.local()
        self._connections = weakref.WeakSet()
        self._gatekeeper = None

    def _gate(self) -> str:
        """Return the name of this process's gate, a user lock (MariaDB).

        A connection of its own holds it (``GET_LOCK``) and does nothing
        else; a permit waiter blocks on it with a timeout until a release
        interrupts the wait (``KILL QUERY ID``). A lock wait, unlike
        ``SLEEP()``, is interrupted without holding up other KILLs.
        """
        with self._setup_lock:
            if self._gatekeeper is None:
                keeper = _Connection(self._new_wrapper())
                name = "distlock_gate_" + secrets.token_hex(8)
                cursor = keeper.cursor()
                cursor.execute("SELECT GET_LOCK(%s, 0)", [name])
                cursor.fetchall()
                self._connections.add(keeper)
                self._gatekeeper, self._gate_name = keeper, name
            return self._gate_name

    def _gate_lost(self) -> None:
        """Forget the gate: a waiter obtained it, so its keeper has gone."""
        with self._setup_lock:
            keeper, self._gatekeeper = self._gatekeeper, None
        if keeper is not None:
            keeper.close()

    def _call(
        self,
        what: str,
        func: Callable[..., Any],
        *args: Any,
        deadline: float = STATEMENT_DEADLINE,
    ) -> Any:
        """Run ``func(cursor, *args)``; map driver errors to LockBackendError.

        A connection found dead (a restarted server, a killed session) is
        reopened and the call tried once more; every statement here is safe
        to repeat, because a retried acquisition recognises its own token.
        On PostgreSQL a call that has not returned after ``deadline``
        seconds loses its connection (see :mod:`.deadlines`) and fails.
        """
        self._local.cut_session = None
        for attempt in (1, 2):
            conn = self._connection()
            conn.busy.acquire()
            cut = False
            try:
                cursor = conn.cursor()
                if self._prepared and not conn.prepared:
                    self._behind_a_pooler(POOLER_ANSWERS)
                if not self._watched:
                    return func(cursor, *args)
                key = DEADLINES.start(cursor.connection.fileno(), deadline)
                try:
                    return func(cursor, *args)
                finally:
                    cut = DEADLINES.end(key)
            except conn.errors as e:
                if attempt == 1 and self._lost_prepared(e):
                    self._behind_a_pooler(PREPARED_LOST)
                    conn.reset()
                    continue
                if cut:
                    # The server took the call and went quiet while its
                    # machine kept the connection alive: a stopped or
                    # stalled server, which a new connection would wait for
                    # too. Its process may still run the call when it goes
                    # on (see WaitingMixin._cancel_in_doubt).
                    self._local.cut_session = conn.session
                    conn.reset()
                    raise self._error(e, what, deadline) from e
                if attempt == 1 and self._worth_retrying(conn, e):
                    continue
                raise self._error(e, what) from e
            finally:
                conn.busy.release()
                if conn.close_when_done:  # closed by another thread meanwhile
                    conn.close()
        raise AssertionError("unreachable")  # pragma: no cover

    @staticmethod
    def _lost_prepared(exc: Exception) -> bool:
        sqlstate = getattr(exc, "sqlstate", None)
        if sqlstate in LOST_PREPARED_SQLSTATES:
            return True
        return sqlstate == PROTOCOL_VIOLATION and "prepared statement" in str(exc)

    def _behind_a_pooler(self, why: str) -> None:
        """Leave out what belongs to a server session, as with
        ``DISABLE_SERVER_SIDE_CURSORS``: a pooler sits in between (``why``).

        Connections opened from now on prepare nothing, and waits that begin
        from now on poll instead of listening.
        """
        if self._prepared:
            self._prepared = False
            self._pooled = True
            self._handover = False
            logger.warning(
                "Database lock backend %r: %s on database %r, as behind a "
                "transaction pooler (PgBouncer with pool_mode = transaction); "
                "the backend stops preparing statements and waiters poll "
                "instead of listening. Set DISABLE_SERVER_SIDE_CURSORS = True "
                "on that DATABASES entry, as Django asks for such a pooler.",
                self.alias,
                why,
                self.database,
            )
        for other in list(self._connections):
            other.prepared = False

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

    def _error(
        self, exc: Exception, what: str, cut_after: float | None = None
    ) -> LockBackendError:
        message = str(exc).strip()
        if cut_after is not None:
            message = f"no answer within {cut_after:g} s ({message})"
        hint = ""
        if names_lock_tables(message):
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

    def _statement(self, cursor: Any, key: str, params: tuple) -> None:
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
