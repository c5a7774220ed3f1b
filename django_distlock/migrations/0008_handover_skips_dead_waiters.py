"""A permit is not handed to a waiter whose connection has gone (PostgreSQL).

A permit's release grants the free permits to the waiters first in line
(migration 0006). A waiter whose process died since its last attempt kept
its place for up to two seconds, and a release in that time granted it a
permit that nobody held until the permit's TTL ran out. Now a waiter's
connection takes a session-level advisory lock on its channel's name
(``distlock_wait_<random>``, hashed by ``hashtextextended``) when it starts
to listen on it, and PostgreSQL drops that lock when the connection closes.
The release tries the lock first: a waiter whose lock is free has gone, so
its place is dropped and the permit goes to the next in line. Channels of
processes still on the earlier code (``distlock_conn_<random>``) hold no
such lock: their waiters are granted permits as before.
"""

from importlib import import_module

from django.db import migrations

RELEASE = """
CREATE OR REPLACE FUNCTION distlock_share_release(
    p_digest text, p_token text, p_channel text,
    OUT o_found boolean, OUT o_live boolean)
LANGUAGE plpgsql AS $$
-- Give back the shared lease, permit or queued place p_token of p_digest
-- (its row becomes a free row of the name); o_live: it was a live lease.
-- With p_channel (the name's channel), waiters do not poll: a shared
-- lease's waiters are woken, all of them; a writer's place gone, the
-- readers queued behind it; the permits free are granted to the permit
-- waiters first in line, passing over (and dropping the places of) those
-- whose connection has gone.
DECLARE
    v_kind text;
    v_limit integer;
    v_mark text;
    v_fence bigint;
    v_waiter record;
    v_expires timestamptz;
    v_latest timestamptz;
    v_room bigint;
BEGIN
    -- As for an exclusive release: a release lost in a server crash leaves
    -- the lease taken until it expires, so it need not wait for the flush.
    -- A permit handed over is lost with it, and so is its waiter's
    -- notification: the waiter finds its place gone and queues again.
    PERFORM set_config('synchronous_commit', 'off', true);
    SELECT fence INTO v_fence FROM django_distlock_lockrecord
     WHERE digest = p_digest FOR UPDATE;
    -- "was": the row as it was before this statement (the snapshot's).
    UPDATE django_distlock_lockshare s
       SET kind = 'free', token = '', expires_at = clock_timestamp()
      FROM django_distlock_lockshare was
     WHERE s.id = was.id AND s.digest = p_digest AND s.token = p_token
       AND was.digest = p_digest AND was.token = p_token
    RETURNING was.expires_at > clock_timestamp(), was.kind, was.permits
         INTO o_live, v_kind, v_limit;
    o_found := FOUND;
    IF NOT o_found THEN
        o_live := false;
        RETURN;
    END IF;
    IF v_kind IN ('shared', 'permit') THEN
        v_mark := CASE v_kind WHEN 'permit' THEN '(permits)' ELSE '(shared)' END;
        -- The row stays marked while a holder of its kind lives, until the
        -- latest expiry among them; else it is free.
        UPDATE django_distlock_lockrecord
           SET token = CASE WHEN EXISTS (
                   SELECT 1 FROM django_distlock_lockshare
                    WHERE digest = p_digest AND kind = v_kind
                      AND expires_at > clock_timestamp()) THEN token END,
               expires_at = COALESCE((
                   SELECT max(expires_at) FROM django_distlock_lockshare
                    WHERE digest = p_digest AND kind = v_kind
                      AND expires_at > clock_timestamp()), expires_at)
         WHERE digest = p_digest AND token = v_mark;
    END IF;
    IF p_channel IS NULL THEN
        RETURN;  -- waiters poll (WAIT = "poll")
    END IF;
    IF v_kind IN ('shared', 'writer') THEN
        PERFORM pg_notify(p_channel, '');
        RETURN;
    END IF;
    -- A permit or a permit waiter's place: the free permits go to the first
    -- waiters in line, first come, first served.
    v_room := v_limit - (
        SELECT count(*) FROM django_distlock_lockshare
         WHERE digest = p_digest AND kind = 'permit'
           AND expires_at > clock_timestamp());
    FOR v_waiter IN
        SELECT id, token, ttl, channel FROM django_distlock_lockshare
         WHERE digest = p_digest AND kind = 'queued'
           AND expires_at > clock_timestamp()
         ORDER BY acquired_at, id
    LOOP
        EXIT WHEN v_room <= 0;
        IF v_waiter.channel IS NULL THEN
            -- A waiter that does not listen for a handover takes the permit
            -- itself, woken on its own channel ('distlock_' and its token).
            PERFORM pg_notify('distlock_' || left(v_waiter.token, 40), '');
            v_room := v_room - 1;
            CONTINUE;
        END IF;
        -- A waiter's connection holds an advisory lock on its channel for
        -- as long as it lives: if the lock is free, the connection has gone
        -- (the waiter's process died), and its place is dropped instead of
        -- being granted a permit nobody would hold. Channels of earlier
        -- code ('distlock_conn_...') hold no such lock.
        IF starts_with(v_waiter.channel, 'distlock_wait_')
           AND v_waiter.channel <> ALL (ARRAY(SELECT pg_listening_channels()))
           AND pg_try_advisory_xact_lock_shared(
                   hashtextextended(v_waiter.channel, 0)) THEN
            UPDATE django_distlock_lockshare
               SET kind = 'free', token = '', expires_at = clock_timestamp()
             WHERE id = v_waiter.id;
            CONTINUE;
        END IF;
        v_room := v_room - 1;
        v_fence := v_fence + 1;
        v_expires := clock_timestamp() + make_interval(secs => v_waiter.ttl);
        UPDATE django_distlock_lockshare
           SET kind = 'permit', fence = v_fence, acquired_at = clock_timestamp(),
               expires_at = v_expires
         WHERE id = v_waiter.id;
        v_latest := greatest(v_latest, v_expires);
        PERFORM pg_notify(v_waiter.channel, v_waiter.token || ' ' || v_fence);
    END LOOP;
    IF v_latest IS NOT NULL THEN
        UPDATE django_distlock_lockrecord
           SET expires_at = greatest(
                   CASE WHEN token = '(permits)' THEN expires_at END, v_latest),
               token = '(permits)', fence = v_fence
         WHERE digest = p_digest;
    END IF;
END
$$
"""


def create_function(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(RELEASE)


def restore_function(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        before = import_module("django_distlock.migrations.0007_share_rows_reused")
        schema_editor.execute(before.RELEASE)


class Migration(migrations.Migration):
    dependencies = [
        ("django_distlock", "0007_share_rows_reused"),
    ]

    operations = [
        migrations.RunPython(
            create_function,
            restore_function,
            hints={"model_name": "lockshare"},
            elidable=False,
        ),
    ]
