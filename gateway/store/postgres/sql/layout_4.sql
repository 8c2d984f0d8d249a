-- Layout 4 of the PostgreSQL store: the outbox of operation.completed events (SPEC 23).
-- A row is made by the very write that stores a terminal record owing the event (a
-- trigger on that row, so in the same statement and transaction: both or neither), once
-- an operation (ON CONFLICT DO NOTHING); marked sent, it stays until the record goes.
-- The trigger fires only for terminal rows, a handful of writes an operation; it finds
-- the record's flag in its JSON text, not by parsing it (a record may hold \u0000, which
-- json and jsonb refuse): '"announce":true' with unescaped quotes is only ever the
-- record's own key (inside a JSON string every quote is escaped).

CREATE TABLE @.completions (
    operation_id text COLLATE "C" PRIMARY KEY
        REFERENCES @.operations (operation_id) ON DELETE CASCADE,
    ended_at     double precision NOT NULL,
    sent         boolean NOT NULL DEFAULT false
);
CREATE INDEX completions_owed ON @.completions (ended_at, operation_id) WHERE NOT sent;

CREATE FUNCTION @.sg_owe() RETURNS trigger LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    INSERT INTO @.completions (operation_id, ended_at)
    VALUES (NEW.operation_id, coalesce(NEW.ended_at, 0)) ON CONFLICT DO NOTHING;
    RETURN NULL;
END
$$;

CREATE TRIGGER operations_owe AFTER INSERT OR UPDATE ON @.operations FOR EACH ROW
    WHEN (NEW.outcome IN ('succeeded', 'failed', 'cancelled', 'expired')
          AND strpos(NEW.data, '"announce":true') > 0)
    EXECUTE FUNCTION @.sg_owe();
