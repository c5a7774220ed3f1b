"""The database backend on SQLite, PostgreSQL and MariaDB/MySQL.

Every class runs against real servers: PostgreSQL on 127.0.0.1:5432 (alias
``postgres``), MariaDB on 127.0.0.1:3306 (alias ``mysql``) and the SQLite
file of the ``default`` alias (when ``DISTLOCK_TEST_DB`` is ``sqlite``). A
server that is not reachable skips locally and fails under ``CI=true``.
Tests are transactional: worker processes and the backend's own
connections only see committed rows.
"""

from __future__ import annotations

import threading
import time
import uuid
from datetime import datetime, timedelta, timezone
from unittest import mock

import pytest
from django.core.checks import run_checks
from django.db import connections, transaction
from django.test import override_settings

from django_distlock import LockLost, lock, locks
from django_distlock.backends.database import (
    DatabaseLockBackend,
    bells,
    decode_name,
    encode_name,
)
from django_distlock.backends.database.sessions import LIBPQ_TIMEOUTS, MYSQL_TIMEOUTS
from django_distlock.exceptions import LockBackendError
from django_distlock.models import LockRecord
from tests.testapp.models import Product

from . import workers
from .contract import DatabaseContract
from .procs import run_in_processes

BACKEND = "django_distlock.backends.database.DatabaseLockBackend"


def db_locks(database: str, **extra) -> dict:
    """A LOCKS setting whose default alias is the database backend on ``database``."""
    return {"default": {"BACKEND": BACKEND, "OPTIONS": {"DATABASE": database}, **extra}}


def _sqlite_default():
    if connections["default"].vendor != "sqlite":
        pytest.skip("the default database is not SQLite (DISTLOCK_TEST_DB)")


# -- the shared contract, once per database -----------------------------------


@pytest.mark.django_db(transaction=True)
class TestSQLiteContract(DatabaseContract):
    """The contract on SQLite: several processes share one database file."""

    @pytest.fixture
    def locks_setting(self):
        _sqlite_default()
        return db_locks("default")


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True, databases=["default", "postgres"])
class TestPostgresContract(DatabaseContract):
    """The contract on PostgreSQL."""

    @pytest.fixture
    def locks_setting(self, postgres_available):
        return db_locks("postgres")


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True, databases=["default", "postgres"])
class TestPostgresNotifyContract(DatabaseContract):
    """The contract on PostgreSQL with waiters woken by LISTEN/NOTIFY."""

    @pytest.fixture
    def locks_setting(self, postgres_available):
        setting = db_locks("postgres")
        setting["default"]["OPTIONS"]["WAIT"] = "notify"
        return setting


@pytest.mark.mysql
@pytest.mark.django_db(transaction=True, databases=["default", "mysql"])
class TestMySQLContract(DatabaseContract):
    """The contract on MariaDB/MySQL."""

    @pytest.fixture
    def locks_setting(self, mysql_available):
        return db_locks("mysql")


# -- backend-specific tests, parametrized over the three databases ------------


def _db_param(database: str, *marks):
    databases = ["default"] if database == "default" else ["default", database]
    return pytest.param(
        database,
        marks=[pytest.mark.django_db(transaction=True, databases=databases), *marks],
        id={"default": "sqlite"}.get(database, database),
    )


ALL_DATABASES = [
    _db_param("default"),
    _db_param("postgres", pytest.mark.postgres),
    _db_param("mysql", pytest.mark.mysql),
]


@pytest.fixture
def database(request):
    """The DATABASES alias under test, with LOCKS pointing the default at it."""
    alias = request.param
    if alias == "default":
        _sqlite_default()
    else:
        request.getfixturevalue(f"{alias}_available")
    with override_settings(LOCKS=db_locks(alias, TTL=5)):
        yield alias
    locks.reset()


@pytest.fixture
def name():
    return f"db:{uuid.uuid4().hex[:10]} [%_*?]"


def _backend() -> DatabaseLockBackend:
    backend = locks["default"]
    assert isinstance(backend, DatabaseLockBackend)
    return backend


def _record(database: str, name: str) -> LockRecord | None:
    return (
        LockRecord.objects.using(database)
        .filter(digest=_backend()._digest(name))
        .first()
    )


@pytest.mark.parametrize("database", ALL_DATABASES, indirect=True)
class TestRows:
    def test_row_keeps_fence_and_holder(self, database, name):
        with lock(name) as held:
            row = _record(database, name)
            assert row is not None
            assert row.token == held.lease.token
            assert row.fence == held.fencing_token
            assert row.pid is not None and row.host and row.thread
            assert row.expires_at > row.acquired_at
            fence = held.fencing_token
        row = _record(database, name)
        assert row.token is None
        assert row.fence == fence  # kept after release

    def test_racing_creators_one_winner(self, database, name):
        barrier = threading.Barrier(6)
        results: list = []

        def race():
            barrier.wait()
            try:
                held = lock(name, timeout=0, auto_renew=False)
                results.append(held.acquire())
            except Exception as e:  # noqa: BLE001 - reported below
                results.append(e)

        threads = [threading.Thread(target=race) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert sorted(results, key=str) == [False] * 5 + [True], results
        assert LockRecord.objects.using(database).filter(name__contains=name[:13])

    def test_clear_stale_deletes_rows_but_fences_go_on(self, database, name):
        tokens = []
        for _ in range(3):
            with lock(name) as held:
                tokens.append(held.fencing_token)
        expired = lock(name + "-expired", ttl=0.3, auto_renew=False)
        assert expired.acquire()
        expired_token = expired.fencing_token
        time.sleep(0.6)
        with lock(name + "-live", ttl=30):
            assert _backend().clear_stale() == 1
            assert _record(database, name) is None
            assert _record(database, name + "-expired") is None
            assert _record(database, name + "-live") is not None
        with lock(name) as again:
            assert again.fencing_token > tokens[-1]
        with lock(name + "-expired") as again:
            assert again.fencing_token > expired_token
        with pytest.raises(LockLost):
            expired.release()

    def test_caller_transaction_untouched(self, database, name):
        conn = connections[database]
        sku = uuid.uuid4().hex[:16]
        with pytest.raises(ZeroDivisionError):
            with transaction.atomic(using=database):
                if conn.vendor != "sqlite":
                    # SQLite has one writer: a write here would make the
                    # lock's own connection wait (see docs/backends/database.md).
                    Product.objects.using(database).create(sku=sku + "a")
                with lock(name) as held:
                    assert conn.in_atomic_block
                    token = held.fencing_token
                assert conn.in_atomic_block and not conn.needs_rollback
                Product.objects.using(database).create(sku=sku + "b")
                raise ZeroDivisionError
        # The caller's writes were rolled back, the lock's were committed.
        assert not Product.objects.using(database).filter(sku__startswith=sku)
        assert _record(database, name).fence == token
        with transaction.atomic(using=database):
            with lock(name):
                pass
            Product.objects.using(database).create(sku=sku + "c")
        assert Product.objects.using(database).filter(sku=sku + "c").exists()

    def test_expiry_uses_the_database_clock(self, database, name):
        # An app server whose clock is an hour off changes nothing.
        real = time.time
        with mock.patch("time.time", lambda: real() + 3600):
            held = lock(name, ttl=30, auto_renew=False)
            assert held.acquire()
            assert lock(name, timeout=0).acquire() is False
            assert held.locked()
        (holder,) = [h for h in _backend().holders() if h.name == name]
        now = datetime.now(timezone.utc)
        assert now + timedelta(seconds=25) < holder.expires_at
        assert holder.expires_at < now + timedelta(seconds=35)
        held.release()

    def test_names_of_any_kind(self, database):
        base = f"odd:{uuid.uuid4().hex[:8]}:"
        names = [
            base + "nul\x00byte",
            base + "surrogate\ud800x",
            base + "back\\slash\\0",
            base + "emoji 🔒 and ünïcode",
            base + "percent % under _ star * " + "x" * 200_000,
        ]
        held = [lock(n, timeout=0) for n in names]
        for h in held:
            assert h.acquire()
        try:
            listed = sorted(h.name for h in _backend().holders(base))
            assert listed == sorted(names)
            assert [h.name for h in _backend().holders(base + "percent %")] == [
                names[-1]
            ]
            assert list(_backend().holders(base + "percent _")) == []
            for n in names:
                assert lock(n, timeout=0).acquire() is False
        finally:
            for h in held:
                h.release()

    def test_key_prefix_separates_aliases(self, database, name):
        setting = {
            "default": db_locks(database)["default"],
            "other": {**db_locks(database)["default"], "KEY_PREFIX": "other"},
        }
        with override_settings(LOCKS=setting):
            with lock(name) as a, lock(name, using="other") as b:
                assert a.locked() and b.locked()
                assert [h.name for h in locks["other"].holders(name)] == [name]
                assert [h.backend for h in locks["default"].holders(name)] == [
                    "default"
                ]
        locks.reset()

    def test_renew_batches_and_reports_each_lease(self, database, name):
        backend = _backend()
        leases = [backend.acquire(f"{name}{i}", 2.0, 0) for i in range(3)]
        assert all(leases)
        assert backend.force_release(f"{name}1", leases[1].token)
        before = [lease.deadline for lease in leases]
        time.sleep(1.0)
        assert backend.renew(leases) == [True, False, True]
        assert leases[0].deadline > before[0] and leases[2].deadline > before[2]
        time.sleep(1.4)  # past the original expiry, within the renewed one
        assert backend.is_held(leases[0]) and backend.is_held(leases[2])
        for lease in leases[::2]:
            assert backend.release(lease)

    def test_force_release_many(self, database, name):
        backend = _backend()
        leases = [backend.acquire(f"{name}{i}", 30, 0) for i in range(3)]
        items = [(lease.name, lease.token) for lease in leases]
        items[1] = (items[1][0], "not-the-token")
        assert backend.force_release_many(items) == [True, False, True]
        assert backend.is_held(leases[1]) and not backend.is_held(leases[0])
        again = backend.acquire(f"{name}0", 30, 0)
        assert again.fencing_token > leases[0].fencing_token
        assert backend.force_release_many([]) == []

    def test_async_holder_identity_is_the_task(self, database, name):
        import asyncio

        from asgiref.sync import sync_to_async

        def threads():
            return [h.thread for h in _backend().holders(name)]

        async def scenario():
            async with lock(name):
                return await sync_to_async(threads)()

        (thread,) = asyncio.run(scenario())
        assert "/" in thread  # thread/task

    def test_counter_in_four_processes(self, database, name, tmp_path):
        counter = tmp_path / "counter"
        counter.write_text("0")
        results = run_in_processes(
            workers.counter_worker,
            [(name, str(counter), 20, 5.0) for _ in range(4)],
        )
        intervals = sorted(iv for r in results for iv in r)
        assert int(counter.read_text()) == 80
        assert len({pid for _, _, pid in intervals}) == 4
        assert all(b[0] >= a[1] for a, b in zip(intervals, intervals[1:]))


# -- zero configuration -------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_zero_configuration(settings, name):
    del settings.LOCKS
    backend = locks["default"]
    assert isinstance(backend, DatabaseLockBackend)
    assert backend.database == "default"
    with lock(name) as held:
        assert held.locked()
        assert lock(name, timeout=0).acquire() is False
    assert not [e for e in run_checks() if e.id.startswith("distlock.")]


@pytest.mark.django_db(transaction=True)
def test_sqlite_waiters_leave_the_holders_transaction_alone(name):
    # On SQLite a transaction that has read and then writes gets "database
    # is locked" at once, without the busy timeout, while another connection
    # holds the file's write lock, which even an UPDATE matching no row takes.
    # Waiters polling the held lock from other processes must not take it.
    _sqlite_default()
    options = {"DATABASE": "default", "MAX_BACKOFF": 0.002}
    with override_settings(LOCKS={"default": {"BACKEND": BACKEND, "OPTIONS": options}}):
        product = Product.objects.create(sku=uuid.uuid4().hex[:16])
        waiters: list = []
        with lock(name, auto_renew=False):
            runner = threading.Thread(
                target=lambda: waiters.extend(
                    run_in_processes(workers.try_acquire, [(name, 2.0)] * 3)
                )
            )
            runner.start()
            failures = 0
            end = time.monotonic() + 1.5
            while time.monotonic() < end:
                try:
                    with transaction.atomic():
                        stock = Product.objects.get(pk=product.pk).stock  # reads
                        Product.objects.filter(pk=product.pk).update(stock=stock + 1)
                except Exception as e:  # noqa: BLE001 - counted, then asserted
                    assert "database is locked" in str(e), e
                    failures += 1
            runner.join(30)
        assert waiters == [None, None, None]  # they waited all along
        assert failures == 0
        assert lock(name, timeout=0).acquire() is True
    locks.reset()


@pytest.mark.django_db
def test_in_memory_sqlite_runs_on_the_callers_connection(name):
    # Like a TestCase on Django's default in-memory test database: the test
    # runs inside a transaction that has already written.
    _sqlite_default()
    from django.db.backends.sqlite3.base import DatabaseWrapper

    sku = uuid.uuid4().hex[:16]
    with mock.patch.object(DatabaseWrapper, "is_in_memory_db", return_value=True):
        with override_settings(LOCKS=db_locks("default")):
            Product.objects.create(sku=sku)
            with lock(name, auto_renew=False) as held:  # creates the row
                assert held.locked()
                assert lock(name, timeout=0).acquire() is False
                first = held.fencing_token
            with lock(name, timeout=0) as again:
                assert again.fencing_token > first
            assert _record("default", name).token is None
            assert Product.objects.filter(sku=sku).exists()
    locks.reset()


# -- PostgreSQL: a killed connection ------------------------------------------


def _terminate(pid: int) -> None:
    with connections["postgres"].cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
        assert cursor.fetchone()[0] is True


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True, databases=["default", "postgres"])
class TestPostgresKilledConnection:
    @pytest.fixture(autouse=True)
    def _pg(self, postgres_available):
        with override_settings(LOCKS=db_locks("postgres")):
            yield
        locks.reset()

    def _lock_connection_pid(self) -> int:
        return _backend()._connection().wrapper.connection.info.backend_pid

    def test_holder_keeps_lease_and_lock_frees_after_ttl(self, name):
        # Long enough to outlast spawning a worker process on a busy machine.
        held = lock(name, ttl=6, auto_renew=False)
        assert held.acquire()
        mine = held.fencing_token
        _terminate(self._lock_connection_pid())
        # Nothing is lost: the row is committed, the next call reconnects.
        assert held.locked()
        held.extend(6)
        extended = time.monotonic()
        (other,) = run_in_processes(workers.try_acquire, [(name, 0.3)])
        assert other is None
        _terminate(self._lock_connection_pid())
        # No renewal now: once the ttl runs out another process takes over.
        (other,) = run_in_processes(workers.try_acquire, [(name, 30.0)])
        assert other is not None and other > mine
        assert time.monotonic() - extended >= 5.0
        with pytest.raises(LockLost):
            held.release()

    def test_release_after_kill(self, name):
        held = lock(name, ttl=30)
        assert held.acquire()
        _terminate(self._lock_connection_pid())
        held.release()
        assert lock(name, timeout=0).acquire()

    def test_forked_child_uses_its_own_connection(self, name):
        import os

        held = lock(name, auto_renew=False)
        assert held.acquire()
        parent_session = self._lock_connection_pid()
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child reports through the pipe
            try:
                child = lock(name + "-child", timeout=5, auto_renew=False)
                ok = child.acquire() and lock(name, timeout=0).acquire() is False
                os.write(write, f"{int(ok)} {self._lock_connection_pid()}".encode())
            finally:
                os._exit(0)
        os.waitpid(pid, 0)
        ok, child_session = os.read(read, 100).decode().split()
        assert ok == "1" and int(child_session) != parent_session
        # The child neither used nor closed the parent's connection.
        assert self._lock_connection_pid() == parent_session
        assert held.locked()
        held.release()

    def test_notify_waiter_sees_a_release_that_did_not_notify(self, name):
        setting = {
            "default": {**db_locks("postgres")["default"]},
            "poller": {**db_locks("postgres")["default"]},
        }
        setting["default"]["OPTIONS"] = {"DATABASE": "postgres", "WAIT": "notify"}
        with override_settings(LOCKS=setting):
            holder = lock(name, using="poller", ttl=30)
            assert holder.acquire()
            got = []
            waiter = threading.Thread(
                target=lambda: got.append(lock(name, timeout=30).acquire())
            )
            waiter.start()
            time.sleep(0.3)
            released = time.monotonic()
            holder.release()  # a polling backend: no NOTIFY
            waiter.join(30)
            assert got == [True]
            # The safety net wakes the waiter within about a second.
            assert time.monotonic() - released < 5
        locks.reset()

    def test_server_unreachable(self, name):
        unreachable = {**connections["postgres"].settings_dict, "PORT": "1"}
        with mock.patch.dict(connections["postgres"].settings_dict, unreachable):
            with override_settings(LOCKS=db_locks("postgres")):
                with pytest.raises(LockBackendError):
                    lock(name).acquire()
        locks.reset()


# -- checks ---------------------------------------------------------------------


def _ids(locks_setting: dict) -> list[str]:
    return [m.id for m in DatabaseLockBackend.check("default", locks_setting)]


def test_check_unknown_database():
    assert _ids({"OPTIONS": {"DATABASE": "nope"}}) == ["distlock.E012"]
    assert _ids({"OPTIONS": {"DATABASE": 3}}) == ["distlock.E012"]


def test_check_options():
    assert _ids({"OPTIONS": {"DATABASE": "default", "WAT": 1}}) == ["distlock.E009"]
    assert _ids({"OPTIONS": {"MAX_BACKOFF": 0}}) == ["distlock.E009"]
    assert _ids({"OPTIONS": {"WAIT": "sleep"}}) == ["distlock.E009"]
    assert _ids({"OPTIONS": {"DATABASE": "mysql", "WAIT": "notify"}}) == [
        "distlock.E009"
    ]
    pg = {"DATABASE": "postgres", "MAX_BACKOFF": 0.01, "WAIT": "notify"}
    assert _ids({"OPTIONS": pg}) == []


def test_check_notify_needs_psycopg_3_2(monkeypatch):
    # psycopg 3.1's notifies() takes no timeout: the wait would fail.
    import psycopg

    pg = {"DATABASE": "postgres", "WAIT": "notify"}
    monkeypatch.setattr(psycopg, "__version__", "3.1.19")
    (message,) = DatabaseLockBackend.check("default", {"OPTIONS": pg})
    assert message.id == "distlock.E009" and "psycopg 3.1.19" in message.msg
    assert "3.2" in message.hint
    assert _ids({"OPTIONS": {"DATABASE": "postgres"}}) == []  # polling needs no more
    monkeypatch.setattr(psycopg, "__version__", "3.2.1")
    assert _ids({"OPTIONS": pg}) == []


def test_permits_handed_over_on_postgresql_through_psycopg_3_2(monkeypatch):
    # Whatever WAIT says: a release hands a permit to the first waiter in
    # line only where that waiter can sleep on LISTEN with a timeout.
    import psycopg

    def hands_over(database: str) -> bool:
        return DatabaseLockBackend("x", {"OPTIONS": {"DATABASE": database}}).hands_over

    def wakes(database: str) -> bool:
        backend = DatabaseLockBackend("x", {"OPTIONS": {"DATABASE": database}})
        return backend.wakes_permit_waiters

    assert hands_over("postgres") and wakes("postgres")
    assert not hands_over("mysql")  # woken instead: see TestWakes
    if connections["default"].vendor == "sqlite" and bells.AVAILABLE:
        assert hands_over("default") and wakes("default")  # to the waiter's bell
    pg = connections["postgres"]
    with mock.patch.dict(pg.settings_dict, {"DISABLE_SERVER_SIDE_CURSORS": True}):
        assert not hands_over("postgres")  # LISTEN does not survive a pooler
    monkeypatch.setattr(psycopg, "__version__", "3.1.19")
    assert not hands_over("postgres")  # no timeout on notifies()


def test_statements_prepared_unless_a_pooler_is_declared():
    from django_distlock.backends.database import _can_prepare

    pg = connections["postgres"]
    assert _can_prepare(pg)
    with mock.patch.dict(pg.settings_dict, {"DISABLE_SERVER_SIDE_CURSORS": True}):
        assert not _can_prepare(pg)
    assert not _can_prepare(connections["mysql"])


@pytest.mark.parametrize(
    "alias, defaults, own",
    [
        ("postgres", LIBPQ_TIMEOUTS, {"connect_timeout": 30}),
        ("mysql", MYSQL_TIMEOUTS, {"read_timeout": 60}),
    ],
)
def test_lock_connections_time_out_unless_options_say(alias, defaults, own):
    """The lock connections' driver timeouts are defaults under the alias's
    OPTIONS: a key the user set wins (tests/test_database_partition.py
    shows what the defaults do)."""
    entry = connections[alias].settings_dict
    with override_settings(LOCKS=db_locks(alias)):
        try:
            options = locks["default"]._new_wrapper().settings_dict["OPTIONS"]
            assert options.items() >= defaults.items()
            mine = {**entry.get("OPTIONS", {}), **own}
            with mock.patch.dict(entry, {"OPTIONS": mine}):
                options = locks["default"]._new_wrapper().settings_dict["OPTIONS"]
            assert options.items() >= {**defaults, **own}.items()
        finally:
            locks.reset()


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True, databases=["default", "postgres"])
def test_a_direct_connection_prepares_its_statements(caplog):
    """Connected to the server itself (the process id it was given is its
    session's), the backend prepares its statements."""
    with override_settings(LOCKS=db_locks("postgres")):
        try:
            backend = locks["default"]
            with lock(f"direct:{uuid.uuid4().hex}"):
                pass
            raw = backend._connection().wrapper.connection
            count = raw.execute("SELECT count(*) FROM pg_prepared_statements")
            assert backend._prepared and count.fetchone()[0] > 0
            assert backend.hands_over
            idle = raw.execute("SHOW idle_in_transaction_session_timeout")
            assert idle.fetchone()[0] == "3s"  # the session is the server's
        finally:
            locks.reset()
    assert "pooler" not in caplog.text


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True, databases=["default", "postgres"])
def test_a_prepared_name_taken_by_another_statement_is_noticed(caplog):
    """Behind a transaction pooler, the name of a statement this connection
    prepared may stand, on the next server session, for another client's
    statement with a different number of parameters (a protocol violation
    at Bind). The backend stops preparing and the call still succeeds."""
    name = f"prepared:{uuid.uuid4().hex}"
    with override_settings(LOCKS=db_locks("postgres")):
        try:
            backend = locks["default"]
            with lock(name):
                pass
            raw = backend._connection().wrapper.connection
            names = [
                row[0]
                for row in raw.execute(
                    "SELECT name FROM pg_prepared_statements WHERE statement "
                    "LIKE 'UPDATE%token = $1%'"
                )
            ]
            assert names  # the acquisition's UPDATE, prepared
            # What another client left under that name on this server session.
            raw.execute(f'DEALLOCATE "{names[0]}"')
            raw.execute(
                f'PREPARE "{names[0]}" (text, text, text, text, text, text, text, '
                "text) AS SELECT 1"
            )
            with lock(name, timeout=0) as held:
                assert held.fencing_token
        finally:
            locks.reset()
    assert "DISABLE_SERVER_SIDE_CURSORS = True" in caplog.text


def test_check_sqlite_atomic_requests():
    from django.conf import settings

    _sqlite_default()
    with mock.patch.dict(settings.DATABASES["default"], {"ATOMIC_REQUESTS": True}):
        assert _ids({}) == ["distlock.W003"]


def test_system_check_reports_bad_database():
    with override_settings(LOCKS=db_locks("missing")):
        assert "distlock.E012" in [m.id for m in run_checks()]


# -- pure logic -----------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    ["plain", "", "\\", "\\0", "\x00", "a\ud800b\udfff", "\\u0041", "x\\\x00\\"],
)
def test_name_escaping_round_trips(name):
    stored = encode_name(name)
    assert "\x00" not in stored
    stored.encode("utf-8")  # storable by every driver
    assert decode_name(stored) == name


def test_name_escaping_keeps_prefixes():
    name = "a\\b\x00c\ud800d"
    for i in range(len(name) + 1):
        assert encode_name(name).startswith(encode_name(name[:i]))


def test_the_backend_names_the_models_table_without_importing_models():
    import ast
    from pathlib import Path

    from django_distlock.backends.database import dialects

    assert dialects.TABLE == LockRecord._meta.db_table
    # Imports point down: the backend never imports the models, the watchdog,
    # the admin or the package face.
    package = Path(dialects.__file__).parent
    for module in package.glob("*.py"):
        for node in ast.walk(ast.parse(module.read_text())):
            if isinstance(node, ast.ImportFrom):
                target = "." * node.level + (node.module or "")
                assert target.lstrip(".") not in {"models", "watchdog", "admin"}, (
                    module.name,
                    target,
                )
                assert node.level != 3 or node.module == "exceptions", (
                    module.name,
                    target,
                )


@pytest.mark.parametrize("database", ALL_DATABASES, indirect=True)
def test_close_while_another_thread_runs_a_statement(database, name):
    """``close()`` (settings changed, ``locks.reset()``) while the watchdog
    renews on its own connection: that connection is closed when its
    statement ends, never under it (SQLite's driver crashes the process)."""
    backend = _backend()
    lease = backend.acquire(name, 30, 0)
    assert lease is not None
    stop = threading.Event()
    errors: list[Exception] = []

    def renew() -> None:
        while not stop.is_set():
            try:
                backend.extend(lease, 30)
            except Exception as e:  # noqa: BLE001 - collected for the assert
                errors.append(e)

    renewer = threading.Thread(target=renew)
    renewer.start()
    try:
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            backend.close()
    finally:
        stop.set()
        renewer.join()
    assert errors == []
    assert backend.is_held(lease)
    assert backend.release(lease)
