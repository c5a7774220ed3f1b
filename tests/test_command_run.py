"""``manage.py locks run``: flock(1) for management commands, and LockedCommand.

The cron-like tests start several real ``manage.py locks run`` processes at
once against the database backend (on the run's default test database, a
SQLite file by default, and on PostgreSQL) and a real redis-server: exactly
one runs the command, the others find it busy.
"""

from __future__ import annotations

import io
import os
import socket
import threading
import time

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import override_settings

from django_distlock import lock, locks
from django_distlock.management.run import (
    EX_TEMPFAIL,
    EX_UNAVAILABLE,
    LockedCommand,
    run_locked,
)
from django_distlock.signals import lock_acquired

from .conftest import redis_locks
from .manage_py import ManagePy
from .surface import down_locks, wait_until

HOST = socket.gethostname()


def run(*args):
    out, err = io.StringIO(), io.StringIO()
    call_command("locks", "run", *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


class HeldElsewhere:
    """Hold ``name`` from another thread until closed (a different owner)."""

    def __init__(self, name: str, **options):
        self.handle = lock(name, timeout=0, **options)
        self.taken = threading.Event()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._hold, name="other-owner")
        self.thread.start()
        assert self.taken.wait(10)

    def _hold(self):
        with self.handle:
            self.taken.set()
            self.stop.wait(60)

    def close(self):
        self.stop.set()
        self.thread.join()


# -- in-process ---------------------------------------------------------------


def test_runs_the_command_holding_the_lock(distlock_locmem):
    out, err = run("job", "--", "distlock_job", "--say", "hi", "--check-held", "job")
    assert out.strip() == "hi"
    assert err == ""
    assert lock("job", timeout=0).acquire()  # released afterwards


def test_exit_status_is_the_commands(distlock_locmem):
    with pytest.raises(CommandError) as raised:
        run("job", "--", "distlock_job", "--error", "3")
    assert raised.value.returncode == 3
    with pytest.raises(SystemExit) as exited:
        run("job", "--", "distlock_job", "--exit", "5")
    assert exited.value.code == 5
    assert lock("job", timeout=0).acquire()  # released after each failure


def test_busy_exits_75_naming_the_holder(distlock_locmem, tmp_path):
    record = tmp_path / "ran"
    other = HeldElsewhere("job")
    try:
        with pytest.raises(CommandError) as raised:
            run("job", "--", "distlock_job", "--record", str(record))
        assert raised.value.returncode == EX_TEMPFAIL == 75
        message = str(raised.value)
        assert "'job' is busy" in message
        assert f"{HOST}:{os.getpid()}/other-owner" in message
        assert "expires in" in message

        out, err = run("job", "--skip-if-locked", "--", "distlock_job")
        assert out == ""
        assert "busy" in err and "Skipped" in err
        assert not record.exists()
    finally:
        other.close()


def test_timeout_waits_for_the_holder(distlock_locmem):
    other = HeldElsewhere("job")
    threading.Timer(0.3, other.close).start()
    started = time.monotonic()
    out, _ = run("job", "--timeout", "10", "--", "distlock_job", "--say", "ran")
    assert out.strip() == "ran"
    assert 0.2 < time.monotonic() - started < 8


def test_options_before_and_after_name(distlock_locmem):
    ttls = []

    def seen(sender, lease, **kwargs):
        ttls.append(lease.ttl)

    lock_acquired.connect(seen)
    try:
        run("--ttl", "7", "job", "--", "distlock_job")
        run("job", "--ttl", "9", "--timeout", "1", "--", "distlock_job")
        # COMMAND's own options are COMMAND's, even when run's share the name.
        run("job", "--ttl", "4", "--", "distlock_job", "--sleep", "0")
    finally:
        lock_acquired.disconnect(seen)
    assert ttls == [7.0, 9.0, 4.0]


def test_usage_errors(distlock_locmem):
    with pytest.raises(CommandError, match="Unknown command: 'no_such_command'"):
        run("job", "--", "no_such_command")
    with pytest.raises(CommandError, match="Put '--'"):
        run("job", "--ttl", "3", "distlock_job")
    with pytest.raises(CommandError, match="No COMMAND"):
        run("job", "--")
    with pytest.raises(CommandError, match="Unknown LOCKS alias 'nope'"):
        run("job", "--using", "nope", "--", "distlock_job")
    with pytest.raises(CommandError):
        run("job", "--ttl", "0", "--", "distlock_job")
    # Without "--", COMMAND follows NAME directly.
    out, _ = run("job", "distlock_job", "--say", "plain")
    assert out.strip() == "plain"


def test_backend_unreachable_exits_69():
    with override_settings(LOCKS=down_locks()):
        with pytest.raises(CommandError) as raised:
            run("job", "--", "distlock_job")
    assert raised.value.returncode == EX_UNAVAILABLE == 69
    assert "unreachable" in str(raised.value)


def test_lease_lost_while_running_is_an_error(distlock_locmem):
    def take_it_away():
        wait_until(lambda: any(locks["default"].holders("job")), what="the holder")
        (holder,) = locks["default"].holders("job")
        locks["default"].force_release("job", holder.token)

    thief = threading.Thread(target=take_it_away)
    thief.start()
    with pytest.raises(CommandError, match="lost while the command ran") as raised:
        run("job", "--ttl", "0.3", "--", "distlock_job", "--sleep", "0.8")
    thief.join()
    assert raised.value.returncode == 1


def test_run_locked_returns_the_result(distlock_locmem):
    assert run_locked("fn", lambda: 42) == 42
    other = HeldElsewhere("fn")
    try:
        assert (
            run_locked("fn", lambda: 42, skip_if_locked=True, stderr=io.StringIO())
            is None
        )
    finally:
        other.close()


class SkippingCommand(LockedCommand):
    lock_skip_if_locked = True

    def handle(self, *args, **options):
        self.stdout.write("skipping command ran")


def test_locked_command_class(distlock_locmem):
    out = io.StringIO()
    call_command("distlock_locked_job", stdout=out)
    assert out.getvalue().strip() == "locked job ran"

    other = HeldElsewhere("locked-job")
    try:
        with pytest.raises(CommandError) as raised:
            call_command("distlock_locked_job", stdout=io.StringIO())
        assert raised.value.returncode == 75
        assert "other-owner" in str(raised.value)
    finally:
        other.close()

    command = SkippingCommand()
    assert command.get_lock_name() == "manage.py:test_command_run"
    other = HeldElsewhere("manage.py:test_command_run")
    try:
        out, err = io.StringIO(), io.StringIO()
        call_command(command, stdout=out, stderr=err)
        assert out.getvalue() == ""
        assert "Skipped" in err.getvalue()
    finally:
        other.close()
    out = io.StringIO()
    call_command(command, stdout=out)
    assert out.getvalue().strip() == "skipping command ran"


class PerTenantCommand(LockedCommand):
    def add_arguments(self, parser):
        parser.add_argument("tenant")

    def get_lock_name(self, *args, **options):
        return f"import:{options['tenant']}"

    def handle(self, *args, tenant, **options):
        self.stdout.write(f"imported {tenant}")


def test_locked_command_named_after_its_options(distlock_locmem):
    other = HeldElsewhere("import:acme")
    try:
        with pytest.raises(CommandError) as raised:
            call_command(PerTenantCommand(), "acme")
        assert raised.value.returncode == 75
        out = io.StringIO()
        call_command(PerTenantCommand(), "globex", stdout=out)
        assert out.getvalue().strip() == "imported globex"
    finally:
        other.close()


# -- real processes -----------------------------------------------------------


def database_locks(alias: str) -> dict:
    return {
        "default": {
            "BACKEND": "django_distlock.backends.database.DatabaseLockBackend",
            "OPTIONS": {"DATABASE": alias},
        }
    }


@pytest.fixture(
    params=[
        # The test run's default database: a SQLite file unless
        # DISTLOCK_TEST_DB picks PostgreSQL or MariaDB.
        pytest.param("database", marks=pytest.mark.django_db(transaction=True)),
        pytest.param(
            "postgres",
            marks=[
                pytest.mark.postgres,
                pytest.mark.django_db(
                    transaction=True, databases=["default", "postgres"]
                ),
            ],
        ),
        pytest.param("redis", marks=pytest.mark.redis),
    ]
)
def process_locks(request):
    """LOCKS for the cross-process tests, one backend per parameter."""
    if request.param == "redis":
        setting = redis_locks(request.getfixturevalue("redis_url"))
    elif request.param == "postgres":
        request.getfixturevalue("postgres_available")
        setting = database_locks("postgres")
    else:
        setting = database_locks("default")
    with override_settings(LOCKS=setting):
        yield setting


def test_cron_started_on_many_hosts_runs_once(process_locks, tmp_path):
    """Four `locks run` started at once: one runs the job, three exit 75; the
    runner's lease (ttl 1 s) is renewed while the job outlasts it."""
    manage = ManagePy(tmp_path)
    record, go = tmp_path / "ran", tmp_path / "go"
    argv = ["locks", "run", "cron:nightly", "--ttl", "1", "--", "distlock_job"]
    job = ["--record", str(record), "--until", str(go)]
    procs = [manage.start(*argv, *job) for _ in range(4)]
    try:
        # The job runs until `go` exists: the three that lost exit while the
        # winner still runs, so none of them can run after it.
        wait_until(
            lambda: sum(p.poll() is not None for p in procs) >= 3,
            timeout=90,
            what="three processes to find the lock busy",
        )
        losers = [p for p in procs if p.poll() is not None]
        (winner,) = [p for p in procs if p.poll() is None]
        wait_until(record.exists, timeout=30, what="the job to start")
        # Past its 1 s ttl, only renewal keeps the lease.
        time.sleep(1.5)
        late = manage.run(*argv[:3], "--skip-if-locked", "--", "distlock_job")
        assert late.returncode == 0, late.stderr
        assert "busy" in late.stderr and "Skipped" in late.stderr
        go.touch()
        out, err = winner.communicate(timeout=60)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.communicate()
    assert winner.returncode == 0, err
    assert record.read_text().split() == [str(winner.pid)]
    for p in losers:
        _, err = p.communicate()
        assert p.returncode == EX_TEMPFAIL, err
        assert "CommandError: Lock 'cron:nightly' is busy" in err
        assert f"{HOST}:{winner.pid}/MainThread" in err
    assert f"{HOST}:{winner.pid}/MainThread" in late.stderr
    assert lock("cron:nightly", timeout=0).acquire()  # released at the end


@pytest.mark.redis
def test_exit_statuses_of_a_real_manage_py(redis_url, tmp_path):
    manage = ManagePy(tmp_path, redis_locks(redis_url))
    done = manage.run("locks", "run", "j", "--", "distlock_job", "--say", "out")
    assert (done.returncode, done.stdout.strip()) == (0, "out")
    done = manage.run("locks", "run", "j", "--", "distlock_job", "--error", "3")
    assert done.returncode == 3
    assert "CommandError: the job failed" in done.stderr
    done = manage.run("locks", "run", "j", "--", "distlock_job", "--exit", "5")
    assert done.returncode == 5

    with override_settings(LOCKS=redis_locks(redis_url)), lock("j", timeout=0):
        busy = manage.run("locks", "run", "j", "--", "distlock_job")
        assert busy.returncode == 75
        assert f"held by {HOST}:{os.getpid()}/MainThread" in busy.stderr
        skipped = manage.run(
            "locks", "run", "j", "--skip-if-locked", "--", "distlock_job"
        )
        assert skipped.returncode == 0
        own = manage.run("distlock_locked_job")
        assert own.returncode == 0, own.stderr
        with lock("locked-job", timeout=0):
            own = manage.run("distlock_locked_job")
        assert own.returncode == 75
        assert f"held by {HOST}:{os.getpid()}/MainThread" in own.stderr


def test_unreachable_backend_exits_69_from_manage_py(tmp_path):
    manage = ManagePy(tmp_path, down_locks())
    done = manage.run("locks", "run", "j", "--", "distlock_job")
    assert done.returncode == 69, done.stderr
    assert "unreachable" in done.stderr
