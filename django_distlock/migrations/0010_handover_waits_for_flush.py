"""A permit handed over is durable before its waiter hears of it (PostgreSQL).

A release does not wait for the WAL flush (``synchronous_commit`` off for
its transaction): a release lost in a server crash only leaves the lease
taken until it expires. But a permit's release also hands the free permits
to the waiters first in line (migration 0006), and each handed permit is a
grant with a fencing token of its own. That grant did not wait for the
flush either, while its waiter was told of it at the commit, before the
flush: a server crash in that window (up to ``wal_writer_delay``, 200 ms by
default) lost a grant its waiter held and worked under, and the next
acquisition after the restart got the same fencing token again (measured:
a waiter handed token 2, the server killed, the next holder given 2).

Now a release that hands a permit over commits as the caller's
``synchronous_commit`` says, as an acquisition does: the waiter's
notification goes out once the grant is on disk. A release that hands
nothing over still does not wait.
"""

from importlib import import_module

from django.db import migrations

BEFORE = import_module("django_distlock.migrations.0009_listen_while_queued")
edit = BEFORE._edit

RELEASE = BEFORE.RELEASE
RELEASE = edit(
    RELEASE,
    """    v_listened text;
BEGIN
    -- As for an exclusive release: a release lost in a server crash leaves
    -- the lease taken until it expires, so it need not wait for the flush.
    -- A permit handed over is lost with it, and so is its waiter's
    -- notification: the waiter finds its place gone and queues again.
    PERFORM set_config('synchronous_commit', 'off', true);""",
    """    v_listened text;
    v_sync text;
BEGIN
    -- As for an exclusive release: a release lost in a server crash leaves
    -- the lease taken until it expires, so it need not wait for the flush.
    -- A permit handed over is a grant: that release waits for it (below).
    v_sync := current_setting('synchronous_commit');
    PERFORM set_config('synchronous_commit', 'off', true);""",
)
RELEASE = edit(
    RELEASE,
    """    IF v_latest IS NOT NULL THEN
        UPDATE django_distlock_lockrecord""",
    """    IF v_latest IS NOT NULL THEN
        -- Permits granted, each with a fencing token: the commit waits for
        -- the flush as an acquisition's does (the caller's setting), and
        -- the waiters' notifications go out after it. A crash cannot lose
        -- a grant a waiter was told of, nor give its token out again.
        PERFORM set_config('synchronous_commit', v_sync, true);
        UPDATE django_distlock_lockrecord""",
)


def create_function(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(RELEASE)


def restore_function(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(BEFORE.RELEASE)


class Migration(migrations.Migration):
    dependencies = [
        ("django_distlock", "0009_listen_while_queued"),
    ]

    operations = [
        migrations.RunPython(
            create_function,
            restore_function,
            hints={"model_name": "lockshare"},
            elidable=False,
        ),
    ]
