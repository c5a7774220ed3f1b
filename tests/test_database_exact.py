"""The database backend compares prefixes and names exactly, on every database.

MariaDB/MySQL's default collations compare text case- and accent-insensitively
and ignore trailing spaces (PAD SPACE); the lock table's text columns must not.
Two aliases whose ``KEY_PREFIX`` differ only that way share one table here, and
each must lock, list and clear its own locks only. Names that differ only that
way must be different locks, listed apart.
"""

from __future__ import annotations

import io
import json
import time
import uuid

import pytest
from django.core.management import call_command
from django.db import connections
from django.test import override_settings
from django.urls import reverse

from django_distlock import lock, locks
from django_distlock.models import LockRecord

from .test_database_backend import ALL_DATABASES, db_locks

#: Pairs of strings that are different, but equal to MariaDB's default
#: ``utf8mb4_general_ci`` collation.
PAIRS = [
    pytest.param("AB", "ab", id="case"),
    pytest.param("\u00e9t\u00e9", "e\u0301te\u0301", id="nfc-nfd"),
    pytest.param("\u00e9t\u00e9", "ete", id="accent"),
    pytest.param("pad", "pad ", id="trailing-space"),
]


@pytest.fixture
def database(request):
    """The DATABASES alias under test (the aliases are set by each test)."""
    alias = request.param
    if alias == "default":
        from .test_database_backend import _sqlite_default

        _sqlite_default()
    else:
        request.getfixturevalue(f"{alias}_available")
    yield alias
    locks.reset()


def _two_aliases(database: str, one: str, other: str) -> dict:
    entry = db_locks(database, TTL=30)["default"]
    return {
        "one": {**entry, "KEY_PREFIX": one},
        "other": {**entry, "KEY_PREFIX": other},
    }


def _command(*args: str) -> str:
    out = io.StringIO()
    call_command("locks", *args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


def _stored(database: str, alias: str, name: str) -> LockRecord | None:
    digest = locks[alias]._digest(name)
    return LockRecord.objects.using(database).filter(digest=digest).first()


@pytest.mark.parametrize("database", ALL_DATABASES, indirect=True)
@pytest.mark.parametrize(("a", "b"), PAIRS)
class TestExactStrings:
    def test_prefixes_differing_only_so_stay_apart(self, database, a, b):
        tag = uuid.uuid4().hex[:8]
        one, other = f"{tag}:{a}", f"{tag}:{b}"
        with override_settings(LOCKS=_two_aliases(database, one, other)):
            name = "job"
            mine = lock(name, using="one", timeout=0, auto_renew=False)
            theirs = lock(name, using="other", timeout=0, auto_renew=False)
            assert mine.acquire() and theirs.acquire()
            try:
                for alias, held in (("one", mine), ("other", theirs)):
                    listed = list(locks[alias].holders())
                    assert [(h.name, h.token) for h in listed] == [
                        (name, held.lease.token)
                    ]
                    assert [h.name for h in locks[alias].holders("jo")] == [name]

                # Through the command: list, then clear --all, per alias.
                rows = json.loads(
                    _command("list", "--using", "one", "--format", "json")
                )
                assert [(r["backend"], r["name"]) for r in rows] == [("one", name)]
                out = _command("clear", "--all", "--using", "one", "--noinput")
                assert "Cleared 1 lock" in out
                assert not mine.locked() and theirs.locked()
                rows = json.loads(
                    _command("list", "--using", "other", "--format", "json")
                )
                assert [(r["backend"], r["name"]) for r in rows] == [("other", name)]
            finally:
                theirs.release()

    def test_admin_lists_each_lock_once(self, database, a, b, admin_client):
        tag = uuid.uuid4().hex[:8]
        one, other = f"{tag}:{a}", f"{tag}:{b}"
        with override_settings(LOCKS=_two_aliases(database, one, other)):
            with lock("job", using="one"), lock("job", using="other"):
                response = admin_client.get(
                    reverse("admin:django_distlock_lock_changelist")
                )
                assert response.status_code == 200
                rows = response.context["rows"]
                assert sorted((r.backend, r.name) for r in rows) == [
                    ("one", "job"),
                    ("other", "job"),
                ]

    def test_clear_stale_keeps_to_its_prefix(self, database, a, b):
        tag = uuid.uuid4().hex[:8]
        one, other = f"{tag}:{a}", f"{tag}:{b}"
        with override_settings(LOCKS=_two_aliases(database, one, other)):
            expired = lock("gone", using="other", ttl=0.2, auto_renew=False)
            assert expired.acquire()
            time.sleep(0.5)
            out = _command("clear", "--stale", "--using", "one", "--noinput")
            assert out.startswith("Cleared 0 stale lock(s)")
            assert _stored(database, "other", "gone") is not None
            assert locks["one"].clear_stale() == 0
            assert _stored(database, "other", "gone") is not None
            assert locks["other"].clear_stale() == 1
            assert _stored(database, "other", "gone") is None

    def test_names_differing_only_so_are_apart(self, database, a, b):
        tag = uuid.uuid4().hex[:8]
        with override_settings(LOCKS=_two_aliases(database, tag, tag + "-")):
            backend = locks["one"]
            first = lock(f"n:{a}", using="one", timeout=0, auto_renew=False)
            second = lock(f"n:{b}", using="one", timeout=0, auto_renew=False)
            assert first.acquire() and second.acquire()
            try:
                both = {f"n:{a}", f"n:{b}"}
                assert {h.name for h in backend.holders()} == both
                for prefix in both:  # "n:pad" is a prefix of "n:pad " too
                    listed = {h.name for h in backend.holders(prefix)}
                    assert listed == {n for n in both if n.startswith(prefix)}
                rows = json.loads(
                    _command(
                        "list",
                        "--using",
                        "one",
                        "--prefix",
                        f"n:{b}",
                        "--format",
                        "json",
                    )
                )
                assert [r["name"] for r in rows] == [f"n:{b}"]
                out = _command("clear", f"n:{a}", "--using", "one", "--noinput")
                assert "Cleared 1 lock" in out
                assert not first.locked() and second.locked()
            finally:
                second.release()


def _collations(table: str) -> dict[str, str]:
    with connections["mysql"].cursor() as cursor:
        cursor.execute(
            "SELECT COLUMN_NAME, COLLATION_NAME FROM information_schema.COLUMNS "
            "WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = %s "
            "AND COLLATION_NAME IS NOT NULL",
            [table],
        )
        return dict(cursor.fetchall())


@pytest.mark.mysql
@pytest.mark.django_db(transaction=True, databases=["default", "mysql"])
def test_migration_converts_an_existing_table(mysql_available):
    # A table created by 0001 under the server's case-insensitive default,
    # with a lock in it, as an upgraded project has it.
    table = LockRecord._meta.db_table
    call_command("migrate", "django_distlock", "0001", database="mysql", verbosity=0)
    with connections["mysql"].cursor() as cursor:
        cursor.execute(
            f"ALTER TABLE {table} CONVERT TO CHARACTER SET utf8mb4 "
            "COLLATE utf8mb4_general_ci"
        )
    assert set(_collations(table).values()) == {"utf8mb4_general_ci"}
    tag = uuid.uuid4().hex[:8]
    with override_settings(LOCKS=_two_aliases("mysql", f"{tag}AB", f"{tag}ab")):
        held = lock("kept", using="one", timeout=0, auto_renew=False)
        assert held.acquire()
        assert [h.name for h in locks["other"].holders()] == ["kept"]  # the bug
        call_command("migrate", "django_distlock", database="mysql", verbosity=0)
        collations = _collations(table)
        assert collations["name"] == collations["namespace"]
        assert collations["name"] in {"utf8mb4_nopad_bin", "utf8mb4_0900_bin"}
        assert list(locks["other"].holders()) == []
        assert held.locked()
        held.release()
    locks.reset()
