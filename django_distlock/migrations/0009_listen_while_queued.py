"""A permit waiter's connection listens only while it waits (PostgreSQL).

A permit waiter's connection listened on its channel from its first
acquisition on, and never stopped (migration 0006). PostgreSQL signals
every backend of the database that listens on any channel at each
NOTIFY, and each signalled backend reads the notification queue: measured
on PostgreSQL 15, about 5.5 µs of server CPU per listening backend per
NOTIFY, and 1.8 µs more for the sender. So every permit handed over cost
the server time in proportion to all the connections that had ever waited
for a permit, waiting or not.

Now the acquisition function listens on ``p_channel`` in the transaction
that queues the waiter, and stops listening in the one that grants it a
permit; the release of a handed permit, or of a place given up, stops
listening on its channel. ``LISTEN`` and ``UNLISTEN`` take effect when the
function's transaction commits. A release that hands the permit over takes the row
lock of the name after the queueing transaction let it go, so its
notification comes after the waiter listens: none is lost. No round trip
is added; the client no longer sends ``LISTEN`` itself.
"""

from importlib import import_module
from textwrap import indent

from django.db import migrations

BEFORE_ACQUIRE = import_module("django_distlock.migrations.0007_share_rows_reused")
BEFORE_RELEASE = import_module(
    "django_distlock.migrations.0008_handover_skips_dead_waiters"
)



def _unlisten(channel: str, depth: int) -> str:
    """PL/pgSQL, ``depth`` blocks deep: stop listening on ``channel`` if
    the session listens on it and has no other place in the name's queue."""
    sql = f"""IF {channel} IS NOT NULL
   AND {channel} = ANY (ARRAY(SELECT pg_listening_channels()))
   AND NOT EXISTS (SELECT 1 FROM django_distlock_lockshare
                    WHERE digest = p_digest AND kind = 'queued'
                      AND channel = {channel}) THEN
    EXECUTE 'UNLISTEN ' || quote_ident({channel});
END IF;"""
    return indent(sql, "    " * depth).lstrip()


#: Listen on the waiter's channel (nothing more if it does already).
_LISTEN = indent(
    """IF p_channel IS NOT NULL THEN
    EXECUTE 'LISTEN ' || quote_ident(p_channel);
END IF;""",
    "        ",
).lstrip()


def _edit(sql: str, old: str, new: str) -> str:
    if sql.count(old) != 1:
        raise AssertionError(f"not found once in the function: {old!r}")
    return sql.replace(old, new)


ACQUIRE = BEFORE_ACQUIRE.ACQUIRE
ACQUIRE = _edit(
    ACQUIRE,
    "-- where a release may hand it a permit). A live permit",
    "-- where a release may hand it a permit; the session listens there\n"
    "-- until it is granted one). A live permit",
)
ACQUIRE = _edit(
    ACQUIRE,
    """            -- Handed over while the notification was on its way.
            o_fence := v_granted;""",
    f"""            -- Handed over while the notification was on its way.
            {_unlisten("p_channel", 3)}
            o_fence := v_granted;""",
)
ACQUIRE = _edit(
    ACQUIRE,
    """    IF v_kind IS NULL THEN
        RETURN;  -- a waiter's place refreshed""",
    f"""    IF v_kind IS NULL THEN
        {_LISTEN}
        RETURN;  -- a waiter's place refreshed""",
)
ACQUIRE = _edit(
    ACQUIRE,
    """    IF v_kind = 'queued' THEN
        RETURN;""",
    f"""    IF v_kind = 'queued' THEN
        {_LISTEN}
        RETURN;""",
)
ACQUIRE = _edit(
    ACQUIRE,
    """    o_fence := v_fence;
    o_wait := 0;
END""",
    f"""    IF v_mine_at IS NOT NULL THEN
        -- A waiter that had queued (and listened): the common, uncontended
        -- grant does not even look.
        {_unlisten("p_channel", 2)}
    END IF;
    o_fence := v_fence;
    o_wait := 0;
END""",
)

RELEASE = BEFORE_RELEASE.RELEASE
RELEASE = _edit(
    RELEASE,
    """    v_room bigint;
BEGIN""",
    """    v_room bigint;
    v_listened text;
BEGIN""",
)
RELEASE = _edit(
    RELEASE,
    """    RETURNING was.expires_at > clock_timestamp(), was.kind, was.permits
         INTO o_live, v_kind, v_limit;
    o_found := FOUND;
    IF NOT o_found THEN
        o_live := false;
        RETURN;
    END IF;""",
    f"""    RETURNING was.expires_at > clock_timestamp(), was.kind, was.permits,
              was.channel
         INTO o_live, v_kind, v_limit, v_listened;
    o_found := FOUND;
    IF NOT o_found THEN
        o_live := false;
        RETURN;
    END IF;
    -- A permit handed to this session, or its place given up: it waits no
    -- more, and stops listening (unless it has another place in line).
    {_unlisten("v_listened", 1)}""",
)


def create_functions(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(ACQUIRE)
        schema_editor.execute(RELEASE)


def restore_functions(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(BEFORE_ACQUIRE.ACQUIRE)
        schema_editor.execute(BEFORE_RELEASE.RELEASE)


class Migration(migrations.Migration):
    dependencies = [
        ("django_distlock", "0008_handover_skips_dead_waiters"),
    ]

    operations = [
        migrations.RunPython(
            create_functions,
            restore_functions,
            hints={"model_name": "lockshare"},
            elidable=False,
        ),
    ]
