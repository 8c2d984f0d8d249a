-- Layout 3 of the PostgreSQL store: agent keys made through the operator API, and the
-- quota counts of submissions (SPEC 25). @ is replaced by the quoted schema name.

-- A key is kept as the sha256 of its token, never the token.
CREATE TABLE @.agent_keys (
    id           text PRIMARY KEY,
    token_sha256 text NOT NULL UNIQUE,
    created_at   double precision NOT NULL,
    data         text NOT NULL
);

-- A holder (key:ID or account:NAME): its active places (one per operation id, held while
-- the operation is pending or reserved, or for a while with no record: in flight) and its
-- forwarded submissions (kept an hour).
CREATE TABLE @.quota_active (
    holder       text NOT NULL,
    operation_id text COLLATE "C" NOT NULL,
    claimed_at   double precision NOT NULL,
    PRIMARY KEY (holder, operation_id)
);
CREATE TABLE @.quota_submits (
    holder       text NOT NULL,
    operation_id text COLLATE "C" NOT NULL,
    at           double precision NOT NULL,
    PRIMARY KEY (holder, operation_id)
);

-- keys.quota_wait, the same rule: 0 when counted, else the seconds to wait. A transaction
-- advisory lock on the holder serializes its claims, so replicas never both take the
-- last place; places whose operations ended are given back first.
CREATE FUNCTION @.sg_quota(
    p_holder text, p_id text, p_now double precision, p_max_active integer,
    p_per_hour integer, p_hour double precision, p_retry double precision,
    p_hold double precision
) RETURNS double precision LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    wait double precision := 0;
    n integer;
    oldest double precision;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext('statusgate-quota:' || p_holder));
    IF p_max_active IS NOT NULL THEN
        DELETE FROM @.quota_active q WHERE q.holder = p_holder AND NOT EXISTS (
            SELECT 1 FROM @.operations o WHERE o.operation_id = q.operation_id
            AND o.outcome IN ('pending', 'reserved'))
        AND (q.claimed_at <= p_now - p_hold OR EXISTS (
            SELECT 1 FROM @.operations o WHERE o.operation_id = q.operation_id));
        SELECT count(*) INTO n FROM @.quota_active WHERE holder = p_holder;
        IF n >= p_max_active THEN wait := p_retry; END IF;
    END IF;
    IF p_per_hour IS NOT NULL THEN
        DELETE FROM @.quota_submits WHERE holder = p_holder AND at <= p_now - p_hour;
        SELECT count(*) INTO n FROM @.quota_submits WHERE holder = p_holder;
        IF n >= p_per_hour THEN
            SELECT at INTO oldest FROM @.quota_submits WHERE holder = p_holder
            ORDER BY at OFFSET n - p_per_hour LIMIT 1;
            wait := greatest(wait, oldest + p_hour - p_now);
        END IF;
    END IF;
    IF wait = 0 THEN
        IF p_max_active IS NOT NULL THEN
            INSERT INTO @.quota_active VALUES (p_holder, p_id, p_now)
            ON CONFLICT (holder, operation_id) DO UPDATE SET claimed_at = excluded.claimed_at;
        END IF;
        IF p_per_hour IS NOT NULL THEN
            INSERT INTO @.quota_submits VALUES (p_holder, p_id, p_now)
            ON CONFLICT (holder, operation_id) DO UPDATE SET at = excluded.at;
        END IF;
    END IF;
    RETURN wait;
END
$$;
