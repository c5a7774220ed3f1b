"""PostgreSQL, uncontended cycle: django_distlock's database backend vs peers.

The floor is a raw ``pg_advisory_lock`` + ``pg_advisory_unlock`` on a psycopg
connection in autocommit mode (two round trips, no transaction, no lease).
"""

from __future__ import annotations

import zlib

from .common import token
from .core import alternate, cycles

FLOOR = "raw pg_advisory_lock + pg_advisory_unlock"
DISTLOCK = "django_distlock database backend"
PGLOCKS = "django-pglocks advisory_lock"
DB_MUTEX = "django-db-mutex"
ROW_LOCK = "raw BEGIN; SELECT ... FOR UPDATE; COMMIT"
ORM = "Django atomic() + select_for_update().get_or_create()"
DURABLE = "raw durable lease: UPDATE + UPDATE (2 commits)"

TARGETS = {DISTLOCK: (FLOOR, 3.0)}


def run(ctx) -> dict:
    from django.db import connection

    key = zlib.crc32(b"bench:d:floor")
    raw = ctx.pg.connect()
    raw.execute(
        "CREATE TABLE IF NOT EXISTS bench_rowlock (name text PRIMARY KEY, holder text)"
    )
    raw.execute("INSERT INTO bench_rowlock VALUES ('x') ON CONFLICT DO NOTHING")

    def floor():
        raw.execute("SELECT pg_advisory_lock(%s)", (key,)).fetchone()
        raw.execute("SELECT pg_advisory_unlock(%s)", (key,)).fetchone()

    def row_lock():
        with raw.transaction():
            raw.execute(
                "SELECT name FROM bench_rowlock WHERE name = 'x' FOR UPDATE"
            ).fetchone()

    def durable():
        # What a lease that survives a crash costs at the least: one durable
        # write to take it and one to give it back (each commit is flushed).
        tok = token()
        raw.execute(
            "UPDATE bench_rowlock SET holder = %s WHERE name = 'x' AND holder IS NULL",
            (tok,),
        )
        raw.execute(
            "UPDATE bench_rowlock SET holder = NULL WHERE name = 'x' AND holder = %s",
            (tok,),
        )

    def orm():
        # The pattern the ORM offers out of the box (on django-db-mutex's
        # table, any model would do): a row lock held for the transaction.
        from db_mutex.models import DBMutex
        from django.db import transaction

        with transaction.atomic():
            DBMutex.objects.select_for_update().get_or_create(lock_id="bench:d:orm")

    def pglocks():
        from django_pglocks import advisory_lock

        with advisory_lock("bench:d:pglocks"):
            pass

    def db_mutex():
        from db_mutex.db_mutex import db_mutex as mutex

        with mutex("bench:d:db-mutex"):
            pass

    runners = {
        FLOOR: cycles(floor),
        ROW_LOCK: cycles(row_lock),
        DURABLE: cycles(durable),
        ORM: cycles(orm),
        PGLOCKS: cycles(pglocks),
        DB_MUTEX: cycles(db_mutex),
    }
    if ctx.has_database_backend:
        from django_distlock import lock

        def distlock():
            with lock("bench:d:distlock", using="db", auto_renew=False):
                pass

        runners[DISTLOCK] = cycles(distlock)
    connection.ensure_connection()
    try:
        series = alternate(
            runners,
            rounds=ctx.size(full=12, quick=2),
            per_round=ctx.size(full=150, quick=20),
            warmup=ctx.size(full=50, quick=5),
            progress=ctx.progress,
        )
    finally:
        raw.close()
    return {"series": series, "targets": TARGETS, "floor": FLOOR}
