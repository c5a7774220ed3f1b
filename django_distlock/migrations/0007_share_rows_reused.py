"""Rows of the share table reused, not inserted and deleted (PostgreSQL).

Each shared lease, permit and queued place was a row inserted on
acquisition and deleted on release: an entry added to each index of
``LockShare`` every time, which stayed behind, dead, until the table was
vacuumed. A connection opened once the table had grown planned a bitmap
scan for a name's rows, which does not mark the dead entries it meets (a
plain index scan does), so every acquisition read all of them again: the
shared cycle cost 5x more after 20,000 acquisitions of one name without a
vacuum (docs/performance.md). Now a release turns the row into a
*free* row of its name (``kind`` ``'free'``, no token), and the next lease,
permit or place of that name takes a free row by an UPDATE that changes no
indexed column (a HOT update: no index entry, the old version pruned from
the page). The token is no longer indexed for that: one index on
``digest`` serves every lookup, each of which names the digest and finds a
handful of rows. A waiter's place in line is the time it queued
(``acquired_at``), then its id, since a reused row keeps its id. Other
vendors keep inserting and deleting rows; ``locks clear --stale`` deletes
free rows too.
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
-- A new lease or place takes a free row of the name if there is one (a
-- HOT update), else inserts one. Places are granted in order of the time
-- they queued (acquired_at), then id.
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
    v_mine_at timestamptz;
    v_granted bigint;
    v_stale integer;
    v_free bigint;
    v_ahead integer;
    v_kind text;
    v_expires float8;
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
        -- or the permit a release handed it, rows expired, a free row.
        SELECT count(*) FILTER (WHERE kind = 'permit' AND expires_at > v_now),
               min(EXTRACT(EPOCH FROM (expires_at - v_now))::float8)
                   FILTER (WHERE kind = 'permit' AND expires_at > v_now),
               min(permits) FILTER (WHERE kind = 'permit'
                   AND expires_at > v_now AND permits <> p_limit),
               count(*) FILTER (WHERE kind = 'queued' AND expires_at > v_now),
               min(id) FILTER (WHERE token = p_token AND kind = 'queued'
                   AND expires_at > v_now),
               min(acquired_at) FILTER (WHERE token = p_token
                   AND kind = 'queued' AND expires_at > v_now),
               max(fence) FILTER (WHERE token = p_token AND kind = 'permit'
                   AND expires_at > v_now),
               count(*) FILTER (WHERE expires_at <= v_now AND kind <> 'free'),
               min(id) FILTER (WHERE kind = 'free')
          INTO v_held, v_soonest, o_limit, v_queued, v_mine, v_mine_at,
               v_granted, v_stale, v_free
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
            UPDATE django_distlock_lockshare SET kind = 'free', token = ''
             WHERE digest = p_digest AND expires_at <= v_now AND kind <> 'free';
        END IF;
        v_ahead := 0;
        IF v_queued > 0 THEN
            SELECT count(*) INTO v_ahead FROM django_distlock_lockshare
             WHERE digest = p_digest AND kind = 'queued' AND expires_at > v_now
               AND (v_mine IS NULL OR (acquired_at, id) < (v_mine_at, v_mine));
        END IF;
        IF v_held + v_ahead >= p_limit THEN
            -- No room: this waiter keeps (or takes) its place in the queue.
            IF v_mine IS NULL THEN
                v_mine := v_free;
                v_kind := 'queued';
                v_expires := p_waiter_ttl;
            ELSE
                UPDATE django_distlock_lockshare
                   SET expires_at = clock_timestamp()
                                    + make_interval(secs => p_waiter_ttl),
                       ttl = p_ttl, channel = p_channel
                 WHERE id = v_mine;
            END IF;
            o_wait := greatest(p_hint, COALESCE(v_soonest, 0));
            PERFORM set_config('synchronous_commit', 'off', true);
        ELSE
            -- Room: this waiter's place, if it has one, becomes its permit.
            v_mine := COALESCE(v_mine, v_free);
            v_kind := 'permit';
            v_expires := p_ttl;
            v_fence := v_fence + 1;  -- each permit a fencing token of its own
            v_mark := '(permits)';
        END IF;
    ELSE
        IF v_live AND v_token <> '(shared)' THEN
            o_wait := greatest(p_hint, COALESCE(v_remaining, 0));
            PERFORM set_config('synchronous_commit', 'off', true);
            RETURN;
        END IF;
        -- Writer preference: readers wait while a writer is queued.
        SELECT min(EXTRACT(EPOCH FROM (expires_at - v_now))::float8)
                   FILTER (WHERE kind = 'writer' AND expires_at > v_now),
               count(*) FILTER (WHERE expires_at <= v_now AND kind <> 'free'),
               min(id) FILTER (WHERE kind = 'free')
          INTO v_soonest, v_stale, v_free
          FROM django_distlock_lockshare WHERE digest = p_digest;
        IF v_stale > 0 THEN
            UPDATE django_distlock_lockshare SET kind = 'free', token = ''
             WHERE digest = p_digest AND expires_at <= v_now AND kind <> 'free';
        END IF;
        IF v_soonest IS NOT NULL THEN
            o_wait := greatest(p_hint, v_soonest);
            PERFORM set_config('synchronous_commit', 'off', true);
            RETURN;
        END IF;
        v_mine := v_free;
        v_kind := 'shared';
        v_expires := p_ttl;
        v_mark := '(shared)';
    END IF;
    IF v_kind IS NULL THEN
        RETURN;  -- a waiter's place refreshed
    END IF;
    IF v_mine IS NOT NULL THEN
        UPDATE django_distlock_lockshare
           SET kind = v_kind, permits = p_limit, token = p_token,
               fence = CASE WHEN v_kind = 'queued' THEN 0 ELSE v_fence END,
               host = p_host, pid = p_pid, thread = p_thread,
               acquired_at = clock_timestamp(),
               expires_at = clock_timestamp() + make_interval(secs => v_expires),
               ttl = CASE WHEN v_kind = 'queued' THEN p_ttl END,
               channel = CASE WHEN v_kind = 'queued' THEN p_channel END
         WHERE id = v_mine AND kind IN ('free', 'queued');
    END IF;
    IF v_mine IS NULL OR NOT FOUND THEN
        INSERT INTO django_distlock_lockshare (digest, kind, permits, token,
               fence, host, pid, thread, acquired_at, expires_at, ttl, channel)
        VALUES (p_digest, v_kind, p_limit, p_token,
                CASE WHEN v_kind = 'queued' THEN 0 ELSE v_fence END,
                p_host, p_pid, p_thread, clock_timestamp(),
                clock_timestamp() + make_interval(secs => v_expires),
                CASE WHEN v_kind = 'queued' THEN p_ttl END,
                CASE WHEN v_kind = 'queued' THEN p_channel END);
    END IF;
    IF v_kind = 'queued' THEN
        RETURN;
    END IF;
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
-- waiters first in line.
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
    FOR v_waiter IN
        SELECT id, token, ttl, channel FROM django_distlock_lockshare
         WHERE digest = p_digest AND kind = 'queued'
           AND expires_at > clock_timestamp()
         ORDER BY acquired_at, id
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


def create_functions(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(ACQUIRE)
        schema_editor.execute(RELEASE)


def restore_functions(apps, schema_editor):
    # Free rows have no token: the unique (digest, token) restored next
    # would refuse them.
    apps.get_model("django_distlock", "LockShare").objects.using(
        schema_editor.connection.alias
    ).filter(kind="free").delete()
    if schema_editor.connection.vendor == "postgresql":
        before = import_module("django_distlock.migrations.0006_share_handover")
        schema_editor.execute(before.ACQUIRE)
        schema_editor.execute(before.RELEASE)


class Migration(migrations.Migration):
    dependencies = [
        ("django_distlock", "0006_share_handover"),
    ]

    operations = [
        migrations.RemoveConstraint(
            model_name="lockshare",
            name="distlock_share_digest_token",
        ),
        migrations.AddIndex(
            model_name="lockshare",
            index=models.Index(fields=["digest"], name="distlock_share_digest"),
        ),
        migrations.RunPython(
            create_functions,
            restore_functions,
            hints={"model_name": "lockshare"},
            elidable=False,
        ),
    ]
