-- Layout 1 of the PostgreSQL store. @ is replaced by the quoted schema name.
-- Hot counters (version, used, next_poll_at) are in no index, and every table keeps room on
-- its pages (fillfactor), so a poll's writes are HOT updates: no index entry per write.
-- The functions are the store's few multi-step writes, each one round trip and atomic
-- (READ COMMITTED re-checks an UPDATE's WHERE on the newest row version), on the
-- database's clock, which every replica shares.

CREATE TABLE @.operations (
    operation_id    text COLLATE "C" PRIMARY KEY,
    account         text NOT NULL,
    provider        text NOT NULL,
    provider_job_id text NOT NULL,
    outcome         text NOT NULL,
    started_at      double precision NOT NULL,
    deadline_at     double precision NOT NULL,
    ended_at        double precision,
    reason          text,             -- the escalation's reason while escalated
    used            integer NOT NULL, -- status requests spent
    budget          integer NOT NULL, -- status requests permitted
    next_poll_at    double precision NOT NULL,
    version         bigint NOT NULL,
    data            text NOT NULL,    -- the record as JSON, the source of truth
    UNIQUE (account, provider, provider_job_id)
) WITH (fillfactor = 70);
CREATE INDEX operations_started ON @.operations (started_at, operation_id);
CREATE INDEX operations_deadline ON @.operations (provider, deadline_at)
    WHERE outcome = 'pending';
CREATE INDEX operations_ended ON @.operations (provider, ended_at)
    WHERE outcome <> 'pending';
CREATE INDEX operations_escalated ON @.operations (provider, reason)
    WHERE outcome = 'escalated';

CREATE TABLE @.idempotency (
    key        text PRIMARY KEY,
    expires_at double precision NOT NULL,
    data       text NOT NULL
);
CREATE INDEX idempotency_expires ON @.idempotency (expires_at);

-- A released lease keeps its row (token '', expired): taking it again is a HOT update.
CREATE TABLE @.leases (
    name       text PRIMARY KEY,
    token      text NOT NULL,
    expires_at double precision NOT NULL
) WITH (fillfactor = 70);

-- The provider's pacing window (the instants of recent status calls) and its tightening.
CREATE TABLE @.pacing (
    provider    text PRIMARY KEY,
    calls       double precision[] NOT NULL DEFAULT '{}',
    tight_rate  double precision,
    tight_until double precision
) WITH (fillfactor = 70);

-- SPEC 20: the {final.*} values of an operation's final answer, so a result route can be
-- addressed by value; written with the record, gone with it (purge cascades here).
CREATE TABLE @.result_values (
    account      text NOT NULL,
    provider     text NOT NULL,
    value        text NOT NULL,
    operation_id text COLLATE "C" NOT NULL
        REFERENCES @.operations (operation_id) ON DELETE CASCADE,
    PRIMARY KEY (account, provider, value, operation_id)
);
CREATE INDEX result_values_operation ON @.result_values (operation_id);

CREATE FUNCTION @.sg_now() RETURNS double precision LANGUAGE sql VOLATILE AS
$$ SELECT extract(epoch FROM clock_timestamp())::double precision $$;

-- A lease taken (or renewed by its holder) unless another unexpired token holds it; NULL
-- when not. PL/pgSQL, not SQL: PostgreSQL plans an SQL function's INSERT at every call,
-- a PL/pgSQL statement once a session (measured: 40-55 us less database CPU a poll).
CREATE FUNCTION @.sg_acquire(p_name text, p_token text, p_ttl double precision)
RETURNS boolean LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    INSERT INTO @.leases AS l (name, token, expires_at)
    VALUES (p_name, p_token, @.sg_now() + p_ttl)
    ON CONFLICT (name) DO UPDATE SET token = excluded.token, expires_at = excluded.expires_at
    WHERE l.token = excluded.token OR l.expires_at <= @.sg_now();
    IF FOUND THEN RETURN true; END IF;
    RETURN NULL;
END
$$;

-- The sliding window of pacing.py: 0 when a call may go now (it is counted), else seconds.
CREATE FUNCTION @.sg_pace(
    p_provider text, p_rate double precision, p_guard double precision,
    p_minwait double precision
) RETURNS double precision LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    t_rate double precision;
    t_until double precision;
    lim integer;
    win double precision;
    kept double precision[];
    now double precision := @.sg_now();
BEGIN
    SELECT tight_rate, tight_until INTO t_rate, t_until FROM @.pacing
    WHERE provider = p_provider;
    IF t_until IS NOT NULL AND t_until > now THEN
        IF t_rate <= 0 THEN RETURN t_until - now; END IF;
        IF p_rate <= 0 OR t_rate < p_rate THEN p_rate := t_rate; END IF;
    END IF;
    IF p_rate <= 0 THEN RETURN 0; END IF;
    lim := greatest(1, floor(p_rate));
    win := lim / p_rate * p_guard;
    SELECT calls INTO kept FROM @.pacing WHERE provider = p_provider FOR UPDATE;
    IF NOT FOUND THEN
        INSERT INTO @.pacing (provider) VALUES (p_provider) ON CONFLICT DO NOTHING;
        SELECT calls INTO kept FROM @.pacing WHERE provider = p_provider FOR UPDATE;
    END IF;
    now := @.sg_now();  -- after any wait for the row
    kept := ARRAY(SELECT c FROM unnest(kept) AS c WHERE c > now - win ORDER BY c);
    IF cardinality(kept) < lim THEN
        UPDATE @.pacing SET calls = kept || now WHERE provider = p_provider;
        RETURN 0;
    END IF;
    RETURN greatest(kept[1] + win - now, p_minwait);
END
$$;

-- The record write: compare-and-set on version. A write that spends a status request is
-- the reservation, one UPDATE whose WHERE re-checks outcome, budget, schedule and deadline
-- on the database clock. 1 written, 0 stale version, -1 no record, -2 refused by the clock.
CREATE FUNCTION @.sg_cas(
    p_id text, p_version bigint, p_data text, p_outcome text, p_used integer,
    p_budget integer, p_next double precision, p_deadline double precision,
    p_ended double precision, p_reason text, p_tolerance double precision
) RETURNS integer LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    stored bigint;
BEGIN
    UPDATE @.operations SET
        version = version + 1, data = p_data, outcome = p_outcome, used = p_used,
        budget = p_budget, next_poll_at = p_next, deadline_at = p_deadline,
        ended_at = p_ended, reason = p_reason
    WHERE operation_id = p_id AND version = p_version
      AND (p_used <= used
           OR (outcome = 'pending' AND used < budget AND p_used = used + 1
               AND next_poll_at <= @.sg_now() + p_tolerance AND deadline_at > @.sg_now()));
    IF FOUND THEN RETURN 1; END IF;
    SELECT version INTO stored FROM @.operations WHERE operation_id = p_id;
    IF NOT FOUND THEN RETURN -1; END IF;
    IF stored <> p_version THEN RETURN 0; END IF;
    RETURN -2;
END
$$;

-- A poll's first step: the lease, a place in the pacing window, then the reservation.
-- (wait, written, stored record when stale): wait -1 when another holds the lease, more
-- than 0 when pacing asks to wait (nothing written; the lease kept either way).
CREATE FUNCTION @.sg_start(
    p_lease text, p_token text, p_ttl double precision, p_provider text,
    p_rate double precision, p_guard double precision, p_minwait double precision,
    p_id text, p_version bigint, p_data text, p_outcome text, p_used integer,
    p_budget integer, p_next double precision, p_deadline double precision,
    p_ended double precision, p_reason text, p_tolerance double precision,
    OUT wait double precision, OUT written integer, OUT moved text
) LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    written := 0;
    IF @.sg_acquire(p_lease, p_token, p_ttl) IS NULL THEN
        wait := -1;
        RETURN;
    END IF;
    wait := @.sg_pace(p_provider, p_rate, p_guard, p_minwait);
    IF wait <> 0 OR p_id IS NULL THEN RETURN; END IF;
    written := @.sg_cas(p_id, p_version, p_data, p_outcome, p_used, p_budget, p_next,
                        p_deadline, p_ended, p_reason, p_tolerance);
    IF written = 0 THEN
        SELECT data INTO moved FROM @.operations WHERE operation_id = p_id;
    END IF;
END
$$;

-- A poll's write-back, fenced: written only while p_token still holds the lease by the
-- database clock (the lease row locked until commit, so no one takes it meanwhile), the
-- lease released with it. 1 written, 0 stale, -1 no record, -2 refused, -3 lease lost.
CREATE FUNCTION @.sg_finish(
    p_lease text, p_token text,
    p_id text, p_version bigint, p_data text, p_outcome text, p_used integer,
    p_budget integer, p_next double precision, p_deadline double precision,
    p_ended double precision, p_reason text, p_tolerance double precision
) RETURNS integer LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    written integer;
BEGIN
    PERFORM 1 FROM @.leases WHERE name = p_lease AND token = p_token
        AND expires_at > @.sg_now() FOR UPDATE;
    IF NOT FOUND THEN RETURN -3; END IF;
    IF p_id IS NULL THEN RETURN 1; END IF;
    written := @.sg_cas(p_id, p_version, p_data, p_outcome, p_used, p_budget, p_next,
                        p_deadline, p_ended, p_reason, p_tolerance);
    IF written = 1 THEN
        UPDATE @.leases SET token = '', expires_at = 0 WHERE name = p_lease;
    END IF;
    RETURN written;
END
$$;

-- An idempotency key: the first writer wins until the entry expires. NULL when claimed
-- (by this same claim too, sent again), else the unexpired entry's JSON.
CREATE FUNCTION @.sg_claim(
    p_key text, p_expires double precision, p_data text, p_now double precision
) RETURNS text LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    seen text;
BEGIN
    INSERT INTO @.idempotency (key, expires_at, data) VALUES (p_key, p_expires, p_data)
    ON CONFLICT (key) DO UPDATE SET expires_at = excluded.expires_at, data = excluded.data
    WHERE @.idempotency.expires_at <= p_now;
    IF FOUND THEN RETURN NULL; END IF;
    SELECT data INTO seen FROM @.idempotency WHERE key = p_key;
    IF seen = p_data THEN RETURN NULL; END IF;  -- this same claim, sent again
    RETURN seen;
END
$$;
