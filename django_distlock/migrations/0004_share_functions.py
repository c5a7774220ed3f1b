"""PostgreSQL functions for shared locks and semaphore permits.

Taking or giving back a shared lease or a permit reads and changes several
rows under the lock of the name's row (see ``backends/database/shares.py``).
Statement by statement that is about eight round trips, all of them with the
row locked, so every other holder of the name waits for them. These two
functions run the same steps inside the server: one round trip, the row
locked for the time of the statements only. Other vendors keep the
statement-by-statement transaction.

Each statement in a PL/pgSQL function takes a new snapshot (READ COMMITTED),
so the reads after ``SELECT ... FOR UPDATE`` see what the previous holder of
the row lock committed, as the client-side transaction does.
"""

from django.db import migrations

ACQUIRE = """
CREATE OR REPLACE FUNCTION distlock_share_acquire(
    p_digest text, p_namespace text, p_name text, p_mode text,
    p_limit integer, p_token text, p_host text, p_pid integer, p_thread text,
    p_ttl float8, p_waiter_ttl float8, p_hint float8,
    OUT o_fence bigint, OUT o_wait float8, OUT o_limit integer)
LANGUAGE plpgsql AS $$
-- Grant a shared lease (p_mode 'shared') or a permit (p_mode 'permit') of
-- p_limit. Granted: o_fence. Not granted: o_wait, the seconds worth waiting
-- (a permit waiter keeps its place in the queue meanwhile). A live permit of
-- another limit: o_limit, that limit.
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
        -- live permit of another limit, waiters queued, this waiter's place,
        -- rows expired.
        SELECT count(*) FILTER (WHERE kind = 'permit' AND expires_at > v_now),
               min(EXTRACT(EPOCH FROM (expires_at - v_now))::float8)
                   FILTER (WHERE kind = 'permit' AND expires_at > v_now),
               min(permits) FILTER (WHERE kind = 'permit'
                   AND expires_at > v_now AND permits <> p_limit),
               count(*) FILTER (WHERE kind = 'queued' AND expires_at > v_now),
               min(id) FILTER (WHERE token = p_token AND kind = 'queued'
                   AND expires_at > v_now),
               count(*) FILTER (WHERE expires_at <= v_now)
          INTO v_held, v_soonest, o_limit, v_queued, v_mine, v_stale
          FROM django_distlock_lockshare WHERE digest = p_digest;
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
                       token, fence, host, pid, thread, acquired_at, expires_at)
                VALUES (p_digest, 'queued', p_limit, p_token, 0, p_host, p_pid,
                        p_thread, clock_timestamp(),
                        clock_timestamp() + make_interval(secs => p_waiter_ttl));
            ELSE
                UPDATE django_distlock_lockshare
                   SET expires_at = clock_timestamp()
                                    + make_interval(secs => p_waiter_ttl)
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

RELEASE = """
CREATE OR REPLACE FUNCTION distlock_share_release(
    p_digest text, p_token text, p_channel text,
    OUT o_found boolean, OUT o_live boolean)
LANGUAGE plpgsql AS $$
-- Remove the shared lease, permit or queued place p_token of p_digest;
-- o_live: it was a live lease. With p_channel (the name's channel), wake
-- the waiters: a permit's first in line, a shared lease's all of them.
DECLARE
    v_kind text;
    v_limit integer;
    v_mark text;
    v_waiter text;
BEGIN
    -- As for an exclusive release: a release lost in a server crash leaves
    -- the lease taken until it expires, so it need not wait for the flush.
    PERFORM set_config('synchronous_commit', 'off', true);
    PERFORM 1 FROM django_distlock_lockrecord WHERE digest = p_digest FOR UPDATE;
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
        IF p_channel IS NULL THEN
            NULL;  -- waiters poll (WAIT = "poll")
        ELSIF v_kind = 'permit' THEN
            -- Wake only the waiters first in line, one per free permit, each
            -- on its own channel ('distlock_' and its token).
            FOR v_waiter IN
                SELECT token FROM django_distlock_lockshare
                 WHERE digest = p_digest AND kind = 'queued'
                   AND expires_at > clock_timestamp()
                 ORDER BY id
                 LIMIT greatest(0, v_limit - (
                     SELECT count(*) FROM django_distlock_lockshare
                      WHERE digest = p_digest AND kind = 'permit'
                        AND expires_at > clock_timestamp()))
            LOOP
                PERFORM pg_notify('distlock_' || left(v_waiter, 40), '');
            END LOOP;
        ELSE
            PERFORM pg_notify(p_channel, '');
        END IF;
    END IF;
END
$$
"""

DROP = (
    "DROP FUNCTION IF EXISTS distlock_share_acquire(text, text, text, text, "
    "integer, text, text, integer, text, float8, float8, float8)",
    "DROP FUNCTION IF EXISTS distlock_share_release(text, text, text)",
)


def create_functions(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(ACQUIRE)
        schema_editor.execute(RELEASE)


def drop_functions(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        for statement in DROP:
            schema_editor.execute(statement)


class Migration(migrations.Migration):
    dependencies = [
        ("django_distlock", "0003_lockshare"),
    ]

    operations = [
        migrations.RunPython(
            create_functions,
            drop_functions,
            hints={"model_name": "lockshare"},
            elidable=False,
        ),
    ]
