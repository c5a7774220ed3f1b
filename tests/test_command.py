"""``manage.py locks list|clear`` over real backends."""

from __future__ import annotations

import io
import json
import os
import re
import time
from datetime import datetime, timezone

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import override_settings

from django_distlock import LockLost, lock
from django_distlock.backends.base import Holder

from .conftest import redis_locks
from .procs import start_process
from .servers import RedisServer
from .surface import (
    down_locks,
    fill_redis,
    hold_lock,
    hold_until_lost,
    is_listed,
    wait_until,
)


def run(*args, stdin_answer=None, monkeypatch=None):
    out, err = io.StringIO(), io.StringIO()
    call_command("locks", *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def listed_json(*args):
    out, _ = run("list", "--format", "json", *args)
    return json.loads(out)


# -- list -------------------------------------------------------------------------


def test_list_shows_holders_of_another_process(cross_process_kind):
    proc = start_process(hold_lock, "report:daily", 30)
    try:
        wait_until(lambda: is_listed("report:daily"), what="the holder")
        rows = listed_json()
        (row,) = [r for r in rows if r["name"] == "report:daily"]
        assert set(row) >= {
            "backend",
            "name",
            "holder",
            "acquired_at",
            "expires_at",
            "fencing_token",
        }
        assert row["backend"] == "default"
        assert row["holder"]["pid"] == proc.pid
        assert row["holder"]["thread"] == "MainThread"
        assert isinstance(row["fencing_token"], int)
        assert row["acquired_at"] and row["expires_at"]
        assert "token" not in row
        table, _ = run("list")
        assert "report:daily" in table
        assert str(proc.pid) in table
        assert "BACKEND" in table.splitlines()[0]
    finally:
        proc.kill()
        proc.join()


def test_list_empty_and_json_empty(backend_kind):
    assert listed_json() == []
    out, _ = run("list")
    assert "No locks are held." in out


def test_prefix_is_literal(backend_kind):
    names = ["a*", "a*b", "ab", "a?c", "axc", "[x]y", "xy", "a\\b", "a\nb"]
    handles = [lock(n, timeout=0, ttl=10) for n in names]
    for h in handles:
        assert h.acquire()
    try:
        assert sorted(r["name"] for r in listed_json("--prefix", "a*")) == ["a*", "a*b"]
        assert [r["name"] for r in listed_json("--prefix", "a?")] == ["a?c"]
        assert [r["name"] for r in listed_json("--prefix", "[x]")] == ["[x]y"]
        assert [r["name"] for r in listed_json("--prefix", "a\\")] == ["a\\b"]
        assert len(listed_json("--prefix", "")) == len(names)
        table, _ = run("list", "--prefix", "a\n")
        assert "a\\nb" in table  # control characters are escaped in the table
    finally:
        for h in handles:
            h.release()


def test_table_quotes_an_empty_name_and_edge_spaces(backend_kind):
    names = ["", " ", " q", "q ", "in side"]
    handles = [lock(n, timeout=0, ttl=10) for n in names]
    for h in handles:
        assert h.acquire()
    try:
        table, _ = run("list")
        assert sorted(r["name"] for r in listed_json()) == sorted(names)
    finally:
        for h in handles:
            h.release()
    for shown in ['""', '" "', '" q"', '"q "', "in side"]:
        assert re.search(rf"(^|  ){re.escape(shown)}  ", table, re.M), (shown, table)
    assert '"in side"' not in table


def run_failing(*args):
    """Run the command; return (stdout, stderr, exit status)."""
    out, err = io.StringIO(), io.StringIO()
    try:
        call_command("locks", *args, stdout=out, stderr=err)
    except SystemExit as e:
        return out.getvalue(), err.getvalue(), e.code
    except CommandError as e:
        return out.getvalue(), err.getvalue() + f"CommandError: {e}\n", e.returncode
    return out.getvalue(), err.getvalue(), 0


def test_a_backend_down_is_never_reported_as_empty(redis_url):
    doomed = RedisServer().start()
    down = {
        **redis_locks(doomed.url)["default"],
        "OPTIONS": {"SOCKET_CONNECT_TIMEOUT": 0.5, "SOCKET_TIMEOUT": 0.5},
    }
    setting = {**redis_locks(redis_url), "down": down}
    try:
        with override_settings(LOCKS=setting), lock("still:listed", timeout=0):
            gone = lock("gone:with-it", using="down", timeout=0, auto_renew=False)
            assert gone.acquire()
            out, err, status = run_failing("list", "--format", "json")
            assert status == 0 and err == ""
            assert {r["backend"] for r in json.loads(out)} == {"default", "down"}
            doomed.stop()

            # JSON: the locks read on stdout, one stderr line per alias, exit 1.
            out, err, status = run_failing("list", "--format", "json")
            assert status == 1
            assert [r["name"] for r in json.loads(out)] == ["still:listed"]
            (line,) = err.splitlines()
            assert line.startswith("Backend 'down' could not be read: ")

            out, err, status = run_failing("list")
            assert status == 1
            assert "still:listed" in out and "No locks" not in out
            assert out.splitlines()[-1] == (
                "1 lock(s) held on backend 'default'; backend 'down' could not be read."
            )
            out, err, status = run_failing("list", "--prefix", "nothing:")
            assert status == 1
            assert out == (
                "No locks are held on backend 'default'; "
                "backend 'down' could not be read.\n"
            )
            out, err, status = run_failing("list", "--using", "down")
            assert status == 1 and out == ""
            assert "'down'" in err

            out, err, status = run_failing("clear", "--prefix", "gone:", "--noinput")
            assert status == 1
            assert (
                out == "Cleared 0 locks: none of them is held on backend 'default'.\n"
            )
            assert "Could not reach backend(s) 'down'" in err
            out, err, status = run_failing(
                "clear", "--all", "--using", "down", "--noinput"
            )
            assert status == 1 and out == ""
            assert "Could not reach backend(s) 'down'" in err
            assert "none of them" not in out + err
    finally:
        doomed.stop()


def test_using_selects_one_alias(redis_url):
    other = {
        "BACKEND": "django_distlock.backends.locmem.LocMemLockBackend",
        "LOCATION": "command-using",
    }
    with override_settings(LOCKS={**redis_locks(redis_url), "mem": other}):
        with lock("on:redis", timeout=0), lock("on:mem", using="mem", timeout=0):
            assert {r["name"] for r in listed_json()} == {"on:redis", "on:mem"}
            assert [r["name"] for r in listed_json("--using", "mem")] == ["on:mem"]
            assert [r["backend"] for r in listed_json("--using", "default")] == [
                "default"
            ]
            with pytest.raises(CommandError, match="Unknown LOCKS alias"):
                run("list", "--using", "nope")


def test_json_layout_one_object_per_line(backend_kind):
    names = ["j:1", "j:\u00e9", 'j:"quoted"', "j:\n", "j:\ud800"]
    handles = [lock(n, timeout=0) for n in names]
    for h in handles:
        assert h.acquire()
    try:
        out, _ = run("list", "--format", "json", "--prefix", "j:")
        lines = out.split("\n")
        assert lines[0] == "[" and lines[-2:] == ["]", ""]
        rows = lines[1:-2]
        assert len(rows) == len(names)
        assert all(r.startswith("  {") for r in rows)
        assert all(r.endswith("},") for r in rows[:-1]) and rows[-1].endswith("}")
        # Exactly json.dumps of each row (ASCII, default separators).
        for r in rows:
            assert r.strip().rstrip(",") == json.dumps(json.loads(r.rstrip(",")))
        assert sorted(r["name"] for r in json.loads(out)) == sorted(names)
    finally:
        for h in handles:
            h.release()


def test_table_layout(backend_kind):
    names = ["t:b", "t:a", "t:" + "long" * 20, "t:tab\there"]
    handles = [lock(n, timeout=0, ttl=30) for n in names]
    for h in handles:
        assert h.acquire()
    try:
        out, _ = run("list", "--prefix", "t:")
    finally:
        for h in handles:
            h.release()
    head, *rows, total = out.rstrip("\n").split("\n")
    assert total == "4 lock(s) held."
    assert head.split() == ["BACKEND", "NAME", "KIND", "HOLDER", "ACQUIRED", "AT"] + [
        "EXPIRES",
        "AT",
        "FENCE",
    ]
    starts = [head.index(c) for c in ("NAME", "KIND", "HOLDER", "ACQUIRED", "EXPIRES")]
    for row in rows:
        assert row == row.rstrip()
        assert all(row[i - 2 : i] == "  " and row[i] != " " for i in starts)
    shown = [row[starts[0] : starts[1]].rstrip() for row in rows]
    assert shown == sorted(shown)
    assert "t:tab\\there" in shown
    assert ("t:" + "long" * 20)[:59] + "\u2026" in shown
    assert {row[starts[1] : starts[2]].rstrip() for row in rows} == {"exclusive"}
    acquired = rows[0][starts[3] : starts[4]].rstrip()
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00", acquired)
    expires = rows[0][starts[4] :]
    assert re.match(r"\S+\+00:00 \(in (2\d|30)\.\ds\)  ", expires), expires


def test_list_runs_the_locks_checks_only(redis_url):
    from django.core.management.base import SystemCheckError

    broken = {"default": {**redis_locks(redis_url)["default"], "TTL": 0}}
    with override_settings(LOCKS=broken):
        with pytest.raises(SystemCheckError, match="distlock.E005"):
            call_command("locks", "list", skip_checks=False, stdout=io.StringIO())
    with override_settings(LOCKS=redis_locks(redis_url), ROOT_URLCONF="nowhere"):
        # An unrelated problem (the URL checks would fail) does not stop it.
        out = io.StringIO()
        call_command("locks", "list", skip_checks=False, stdout=out)
        assert "No locks are held." in out.getvalue()


class TestHolder:
    """Holder: cheap to build from epoch milliseconds, the same to read."""

    def make(self, acquired_ms=1_795_313_042_922, expires_ms=1_795_313_072_000):
        return Holder.from_ms(
            "default", "n\u00e9", "tok", "h", 42, "T", acquired_ms, expires_ms, 7
        )

    def test_from_ms_reads_like_datetimes(self):
        utc = timezone.utc
        h = self.make()
        assert h.acquired_at == datetime.fromtimestamp(1_795_313_042.922, utc)
        assert h.expires_at == datetime.fromtimestamp(1_795_313_072, utc)
        assert h.expires_ts == 1_795_313_072.0
        same = Holder(
            "default",
            "n\u00e9",
            "tok",
            host="h",
            pid=42,
            thread="T",
            acquired_at=h.acquired_at,
            expires_at=h.expires_at,
            fencing_token=7,
        )
        assert same == h and hash(same) == hash(h)
        assert same != self.make(expires_ms=None)
        assert repr(same) == repr(h)
        assert self.make(None, None).acquired_at is None

    @pytest.mark.parametrize(
        "acquired_ms",
        [0, 999, 1000, 1_795_313_042_000, 1_795_313_042_001, 253_402_300_000_123],
    )
    def test_formats_exactly_as_datetime(self, acquired_ms):
        h = self.make(acquired_ms, acquired_ms + 30_500)
        for timespec in ("auto", "seconds", "milliseconds", "microseconds"):
            assert h.isoformat(timespec) == (
                h.acquired_at.isoformat(timespec=timespec),
                h.expires_at.isoformat(timespec=timespec),
            )
        assert h.as_json() == json.dumps(h.as_dict())
        assert self.make(None, None).as_json() == json.dumps(
            self.make(None, None).as_dict()
        )

    def test_immutable(self):
        h = self.make()
        with pytest.raises(AttributeError):
            h.name = "other"
        with pytest.raises(AttributeError):
            h.extra = 1


# -- clear ----------------------------------------------------------------------


def test_cleared_holder_exit_raises_lock_lost(backend_kind):
    with pytest.raises(LockLost):
        with lock("job:1", ttl=5, timeout=0) as held:
            out, _ = run("clear", "job:1", "--noinput")
            assert "Cleared 1 lock(s)." in out
            assert not held.locked()


def test_cleared_holder_in_another_process_finds_out(cross_process_kind, tmp_path):
    result = tmp_path / "outcome"
    proc = start_process(hold_until_lost, "job:remote", str(result))
    try:
        wait_until(lambda: is_listed("job:remote"), what="the holder")
        out, _ = run("clear", "job:remote", "--noinput")
        assert "Cleared 1 lock(s)." in out
        wait_until(result.exists, what="the holder to leave its block")
        assert result.read_text() == "LockLost"
    finally:
        proc.kill()
        proc.join()


def test_clear_names_only_those(backend_kind):
    handles = {n: lock(n, timeout=0) for n in ["n:1", "n:2", "n:3", "n:10"]}
    for h in handles.values():
        assert h.acquire()
    out, _ = run("clear", "n:1", "n:10", "n:missing", "--noinput")
    assert "Cleared 2 lock(s)." in out
    assert sorted(r["name"] for r in listed_json()) == ["n:2", "n:3"]
    for name, h in handles.items():
        if name in ("n:1", "n:10"):
            with pytest.raises(LockLost):
                h.release()
        else:
            h.release()


def test_clear_prefix_is_literal(backend_kind):
    keep = [lock(n, timeout=0) for n in ["p-x", "pa", "p?"]]
    gone = [lock(n, timeout=0) for n in ["p*", "p*1"]]
    for h in keep + gone:
        assert h.acquire()
    out, _ = run("clear", "--prefix", "p*", "--noinput")
    assert "Cleared 2 lock(s)." in out
    assert sorted(r["name"] for r in listed_json()) == ["p-x", "p?", "pa"]
    for h in keep:
        h.release()
    for h in gone:
        with pytest.raises(LockLost):
            h.release()


def test_clear_leaves_a_lock_taken_again_meanwhile(backend_kind, monkeypatch):
    first = lock("re:taken", timeout=0)
    assert first.acquire()
    second = lock("re:taken", timeout=0)

    def answer(prompt):
        # Between listing and clearing: the holder leaves, another takes it.
        assert "re:taken" in prompt
        first.release()
        assert second.acquire()
        return "yes"

    monkeypatch.setattr("builtins.input", answer)
    out, _ = run("clear", "re:taken")
    assert "Cleared 0 lock(s)" in out
    assert "taken again" in out
    assert second.locked()
    second.release()


def test_clear_never_resets_fencing(backend_kind):
    with pytest.raises(LockLost), lock("fence:me", timeout=0) as held:
        before = held.fencing_token
        run("clear", "--all", "--noinput")
    with lock("fence:me", timeout=0) as again:
        assert again.fencing_token > before


def test_confirmation(backend_kind, monkeypatch):
    monkeypatch.setattr("builtins.input", lambda prompt: "no")
    with lock("ask:me", timeout=0) as held:
        with pytest.raises(CommandError, match="Nothing cleared"):
            run("clear", "--all")
        assert held.locked()

    def eof(prompt):
        raise EOFError

    monkeypatch.setattr("builtins.input", eof)
    with lock("ask:me", timeout=0) as held:
        with pytest.raises(CommandError, match="--noinput"):
            run("clear", "ask:me")
        assert held.locked()


def test_stale_never_touches_a_live_lease(backend_kind):
    with lock("live:one", timeout=0, ttl=5) as held:
        out, _ = run("clear", "--stale", "--noinput")
        assert "stale lock(s)" in out
        assert held.locked()


def test_user_mistakes_are_command_errors(backend_kind):
    for args in [
        ("clear", "--noinput"),
        ("clear", "x", "--all", "--noinput"),
        ("clear", "--prefix", "a", "--stale", "--noinput"),
        ("clear", "--all", "--using", "nope", "--noinput"),
    ]:
        with pytest.raises(CommandError):
            run(*args)
    with pytest.raises(CommandError):
        run("list", "--format", "xml")
    with pytest.raises(CommandError):
        run()


def test_clear_all_stays_inside_key_prefix(redis_server, redis_url):
    client = redis_server.client()
    client.set("distlock", "bare")
    client.set("distlockx:{abc}", "near miss")
    client.set("unrelated", "keep")
    other = {**redis_locks(redis_url)["default"], "KEY_PREFIX": "other"}
    setting = {**redis_locks(redis_url), "other": other}
    with override_settings(LOCKS=setting):
        mine = [lock("mine", timeout=0), lock("mine:2", timeout=0)]
        theirs = lock("theirs", using="other", timeout=0)
        for h in [*mine, theirs]:
            assert h.acquire()
        before = set(client.keys("*"))
        out, _ = run("clear", "--all", "--using", "default", "--noinput")
        assert "Cleared 2 lock(s)." in out
        assert theirs.locked()
        after = set(client.keys("*"))
        assert {b"distlock", b"distlockx:{abc}", b"unrelated"} <= after
        assert before - after
        assert all(k.startswith(b"distlock:") for k in before - after)
        for h in mine:
            with pytest.raises(LockLost):
                h.release()
        theirs.release()


def test_clear_on_unreachable_backend_fails_cleanly():
    with override_settings(LOCKS=down_locks()):
        with pytest.raises(CommandError, match="Could not reach"):
            run("clear", "--all", "--noinput")


# -- scale ------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.redis
def test_list_100k_holders_on_redis(redis_server, redis_url):
    count = int(os.environ.get("DISTLOCK_SCALE", "100000"))
    fill_redis(redis_url, "bulk:", count)
    with override_settings(LOCKS=redis_locks(redis_url)):
        started = time.perf_counter()
        out, _ = run("list", "--format", "json")
        json_time = time.perf_counter() - started
        assert len(json.loads(out)) == count
        started = time.perf_counter()
        out, _ = run("list")
        table_time = time.perf_counter() - started
        assert f"{count} lock(s) held." in out
        started = time.perf_counter()
        out, _ = run("list", "--prefix", "bulk:9999")
        prefix_time = time.perf_counter() - started
        started = time.perf_counter()
        out, _ = run("clear", "--prefix", "bulk:1", "--noinput")
        clear_time = time.perf_counter() - started
        cleared = sum(1 for i in range(count) if str(i).startswith("1"))
        assert f"Cleared {cleared} lock(s)." in out
        print(
            f"\nlocks list with {count} holders: json {json_time:.2f} s, "
            f"table {table_time:.2f} s, --prefix {prefix_time:.2f} s; "
            f"clear --prefix of {cleared}: {clear_time:.2f} s"
        )
        # Liveness only (shared 2-core machine): minutes would mean KEYS-like
        # blocking or a round trip per key.
        assert json_time < 120
        assert redis_server.client().dbsize() == count - cleared
