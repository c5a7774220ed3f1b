"""Semaphore permits handed over by the release (PostgreSQL, WAIT="notify").

Before, a release woke the first permit waiters in line and each then came
back to take its permit: an attempt more per contended permit, and the
permit idle meanwhile. Now a waiter's place in the queue names the channel
its connection listens on and the TTL it asks for, and the release grants
the free permits to the first waiters in line itself, with a fencing token
each, which the notification carries (``"<token> <fence>"``). A waiter
that died since its last attempt may be granted one; it expires with the
waiter's TTL, as a permit of a holder that dies does.

The acquire function takes the waiter's channel as a 13th argument. The old
12-argument one stays, as a call of the new one without a channel, for the
processes of a rolling upgrade that still run the earlier code: their
waiters are woken on their own channels, as before, and take their permits
themselves. The columns are new, nullable fields; other vendors leave them
empty.
"""

from importlib import import_module

from django.db import migrations, models

ACQUIRE = """
CREATE OR REPLACE FUNCTION distlock_share_acquire(
    p_digest text, p_namespace text, p_name text, p_mode text,
    p_limit integer, p_token text, p_host text, p_pid integer, p_thread text,
    p_ttl float8, p_waiter_ttl float8, p_hint float8, p_channel text,
    OUT o_fence bigint, OUT o_wait float8, OUT o_limit integer)
LANGUAGE plpgsql AS $$
-- Grant a shared lease (p_mode 'shared') or a permit (p_mode 'permit') of
-- p_limit. Granted: o_fence. Not granted: o_wait, the seconds worth waiting
-- (a permit waiter keeps its place in the queue meanwhile, with p_channel,
-- where a release may hand it a permit). A live permit of another limit:
-- o_limit, that limit.
--
-- An attempt that grants nothing commits without waiting for the WAL flush
-- (the row lock is held until then): what it wrote, a waiter's place or a
-- purge, is worth nothing after a server crash.
DECLARE
    v_token text;
    v_live boolean;
    v_remaining float8;
    v_fence bigint;
    v_floor bigint;
    v_held integer;
    v_soonest float8;
    v_queued integer;
    v_mine bigint;
    v_granted bigint;
    v_stale integer;
    v_ahead integer;
    v_mark text;
    v_now timestamptz;
BEGIN
    FOR attempt IN 1..3 LOOP
        SELECT token, token IS NOT NULL AND expires_at > clock_timestamp(),
               EXTRACT(EPOCH FROM (expires_at - clock_timestamp()))::float8, fence
          INTO v_token, v_live, v_remaining, v_fence
          FROM django_distlock_lockrecord WHERE digest = p_digest FOR UPDATE;
        EXIT WHEN FOUND;
        IF attempt = 3 THEN
            RAISE EXCEPTION USING MESSAGE = 'the row of ' || quote_literal(p_name)
                || ' vanished twice while it was being created';
        END IF;
        -- As for an exclusive lock's first acquisition: the shared lock on
        -- the floor row keeps clear_stale() from raising it meanwhile.
        INSERT INTO django_distlock_lockrecord
               (digest, namespace, name, fence, host, thread)
        VALUES ('', '', '', 0, '', '') ON CONFLICT (digest) DO NOTHING;
        SELECT fence INTO v_floor FROM django_distlock_lockrecord
         WHERE digest = '' FOR SHARE;
        INSERT INTO django_distlock_lockrecord
               (digest, namespace, name, fence, host, thread)
        VALUES (p_digest, p_namespace, p_name, v_floor, '', '')
            ON CONFLICT (digest) DO NOTHING;
    END LOOP;
    v_now := clock_timestamp();
    IF p_mode = 'permit' THEN
        -- One pass over the name's rows: permits out, the soonest expiry, a
        -- live permit of another limit, waiters queued, this waiter's place
        -- or the permit a release handed it, rows expired.
        SELECT count(*) FILTER (WHERE kind = 'permit' AND expires_at > v_now),
               min(EXTRACT(EPOCH FROM (expires_at - v_now))::float8)
                   FILTER (WHERE kind = 'permit' AND expires_at > v_now),
               min(permits) FILTER (WHERE kind = 'permit'
                   AND expires_at > v_now AND permits <> p_limit),
               count(*) FILTER (WHERE kind = 'queued' AND expires_at > v_now),
               min(id) FILTER (WHERE token = p_token AND kind = 'queued'
                   AND expires_at > v_now),
               max(fence) FILTER (WHERE token = p_token AND kind = 'permit'
                   AND expires_at > v_now),
               count(*) FILTER (WHERE expires_at <= v_now)
          INTO v_held, v_soonest, o_limit, v_queued, v_mine, v_granted, v_stale
          FROM django_distlock_lockshare WHERE digest = p_digest;
        IF v_granted IS NOT NULL THEN
            -- Handed over while the notification was on its way.
            o_fence := v_granted;
            o_wait := 0;
            o_limit := NULL;
            RETURN;
        END IF;
        IF o_limit IS NOT NULL THEN
            RETURN;
        END IF;
        IF v_stale > 0 THEN
            -- A waiter whose place expired queues again, at the back.
            DELETE FROM django_distlock_lockshare
             WHERE digest = p_digest AND expires_at <= v_now;
        END IF;
        v_ahead := 0;
        IF v_queued > 0 THEN
            SELECT count(*) INTO v_ahead FROM django_distlock_lockshare
             WHERE digest = p_digest AND kind = 'queued' AND expires_at > v_now
               AND id < COALESCE(v_mine, 9223372036854775807);
        END IF;
        IF v_held + v_ahead >= p_limit THEN
            -- No room: this waiter keeps (or takes) its place in the queue.
            IF v_mine IS NULL THEN
                INSERT INTO django_distlock_lockshare (digest, kind, permits,
                       token, fence, host, pid, thread, acquired_at, expires_at,
                       ttl, channel)
                VALUES (p_digest, 'queued', p_limit, p_token, 0, p_host, p_pid,
                        p_thread, clock_timestamp(),
                        clock_timestamp() + make_interval(secs => p_waiter_ttl),
                        p_ttl, p_channel);
            ELSE
                UPDATE django_distlock_lockshare
                   SET expires_at = clock_timestamp()
                                    + make_interval(secs => p_waiter_ttl),
                       ttl = p_ttl, channel = p_channel
                 WHERE id = v_mine;
            END IF;
            o_wait := greatest(p_hint, COALESCE(v_soonest, 0));
            PERFORM set_config('synchronous_commit', 'off', true);
            RETURN;
        END IF;
        IF v_mine IS NOT NULL THEN
            DELETE FROM django_distlock_lockshare WHERE id = v_mine;
        END IF;
        v_fence := v_fence + 1;  -- each permit a fencing token of its own
        v_mark := '(permits)';
    ELSE
        IF v_live AND v_token <> '(shared)' THEN
            o_wait := greatest(p_hint, COALESCE(v_remaining, 0));
            PERFORM set_config('synchronous_commit', 'off', true);
            RETURN;
        END IF;
        -- Writer preference: readers wait while a writer is queued.
        SELECT min(EXTRACT(EPOCH FROM (expires_at - v_now))::float8)
                   FILTER (WHERE kind = 'writer' AND expires_at > v_now),
               count(*) FILTER (WHERE expires_at <= v_now)
          INTO v_soonest, v_stale
          FROM django_distlock_lockshare WHERE digest = p_digest;
        IF v_stale > 0 THEN
            DELETE FROM django_distlock_lockshare
             WHERE digest = p_digest AND expires_at <= v_now;
        END IF;
        IF v_soonest IS NOT NULL THEN
            o_wait := greatest(p_hint, v_soonest);
            PERFORM set_config('synchronous_commit', 'off', true);
            RETURN;
        END IF;
        v_mark := '(shared)';
    END IF;
    INSERT INTO django_distlock_lockshare (digest, kind, permits, token, fence,
           host, pid, thread, acquired_at, expires_at)
    VALUES (p_digest, p_mode, p_limit, p_token, v_fence, p_host, p_pid,
            p_thread, clock_timestamp(),
            clock_timestamp() + make_interval(secs => p_ttl));
    -- The mark's expiry is the latest among the holders.
    UPDATE django_distlock_lockrecord
       SET expires_at = greatest(
               CASE WHEN token = v_mark THEN expires_at END,
               clock_timestamp() + make_interval(secs => p_ttl)),
           token = v_mark, fence = v_fence
     WHERE digest = p_digest;
    o_fence := v_fence;
    o_wait := 0;
END
$$
"""

#: The 12-argument acquire of migration 0004, for processes that still run
#: the code before this migration: the same function, without a channel.
ACQUIRE_WITHOUT_CHANNEL = """
CREATE OR REPLACE FUNCTION distlock_share_acquire(
    p_digest text, p_namespace text, p_name text, p_mode text,
    p_limit integer, p_token text, p_host text, p_pid integer, p_thread text,
    p_ttl float8, p_waiter_ttl float8, p_hint float8,
    OUT o_fence bigint, OUT o_wait float8, OUT o_limit integer)
LANGUAGE sql AS $$
SELECT * FROM distlock_share_acquire(
    $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, NULL::text)
$$
"""

RELEASE = """
CREATE OR REPLACE FUNCTION distlock_share_release(
    p_digest text, p_token text, p_channel text,
    OUT o_found boolean, OUT o_live boolean)
LANGUAGE plpgsql AS $$
-- Remove the shared lease, permit or queued place p_token of p_digest;
-- o_live: it was a live lease. With p_channel (the name's channel), waiters
-- do not poll: a shared lease's waiters are woken, all of them; a writer's
-- place gone, the readers queued behind it; the permits free are granted
-- to the permit waiters first in line.
DECLARE
    v_kind text;
    v_limit integer;
    v_mark text;
    v_fence bigint;
    v_waiter record;
    v_expires timestamptz;
    v_latest timestamptz;
BEGIN
    -- As for an exclusive release: a release lost in a server crash leaves
    -- the lease taken until it expires, so it need not wait for the flush.
    -- A permit handed over is lost with it, and so is its waiter's
    -- notification: the waiter finds its place gone and queues again.
    PERFORM set_config('synchronous_commit', 'off', true);
    SELECT fence INTO v_fence FROM django_distlock_lockrecord
     WHERE digest = p_digest FOR UPDATE;
    DELETE FROM django_distlock_lockshare
     WHERE token = p_token AND digest = p_digest
    RETURNING expires_at > clock_timestamp(), kind, permits
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
    FOR v_waiter IN
        SELECT id, token, ttl, channel FROM django_distlock_lockshare
         WHERE digest = p_digest AND kind = 'queued'
           AND expires_at > clock_timestamp()
         ORDER BY id
         LIMIT greatest(0, v_limit - (
             SELECT count(*) FROM django_distlock_lockshare
              WHERE digest = p_digest AND kind = 'permit'
                AND expires_at > clock_timestamp()))
    LOOP
        IF v_waiter.channel IS NULL THEN
            -- A waiter that does not listen for a handover takes the permit
            -- itself, woken on its own channel ('distlock_' and its token).
            PERFORM pg_notify('distlock_' || left(v_waiter.token, 40), '');
            CONTINUE;
        END IF;
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

DROP_ACQUIRE = (
    "DROP FUNCTION IF EXISTS distlock_share_acquire(text, text, text, text, "
    "integer, text, text, integer, text, float8, float8, float8, text)"
)


def create_functions(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        for statement in (ACQUIRE, ACQUIRE_WITHOUT_CHANNEL, RELEASE):
            schema_editor.execute(statement)


def restore_functions(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        before = import_module("django_distlock.migrations.0004_share_functions")
        for statement in (before.ACQUIRE, before.RELEASE, DROP_ACQUIRE):
            schema_editor.execute(statement)


class Migration(migrations.Migration):
    dependencies = [
        ("django_distlock", "0005_lockshare_digest_token"),
    ]

    operations = [
        migrations.AddField(
            model_name="lockshare",
            name="ttl",
            field=models.FloatField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="lockshare",
            name="channel",
            field=models.CharField(blank=True, max_length=63, null=True),
        ),
        migrations.RunPython(
            create_functions,
            restore_functions,
            hints={"model_name": "lockshare"},
            elidable=False,
        ),
    ]
