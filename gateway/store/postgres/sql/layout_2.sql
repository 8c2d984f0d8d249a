-- Layout 2 of the PostgreSQL store: the audit lines of every replica (SPEC 25, "Audit
-- across replicas"). Self-contained: two tables of their own, nothing in layout 1 changed.
-- The file each replica writes stays the source of truth; these are its copy, shipped in
-- batches off the request path, so every replica's lines can be read in one place.

-- One row a chain (an audit file): the replica that writes it and the last line shipped.
-- ``chain``: 16 hex digits of SHA-256 of the replica's name and the file's first line's hash.
CREATE TABLE @.audit_chains (
    chain      text COLLATE "C" PRIMARY KEY,
    replica    text NOT NULL,
    last_seq   bigint NOT NULL,     -- the highest seq shipped; purge never removes its line
    shipped_at double precision NOT NULL
);

-- The lines themselves, as written to the file (``line``: its JSON text without the
-- newline, hash and all, so the database chain verifies as the file does); the other
-- columns are what queries look lines up by, checked against the line by ``verify``.
CREATE TABLE @.audit_lines (
    chain        text COLLATE "C" NOT NULL,
    seq          bigint NOT NULL,
    at           double precision NOT NULL,
    operation_id text COLLATE "C",
    line         text NOT NULL,
    PRIMARY KEY (chain, seq)
);
CREATE INDEX audit_lines_operation ON @.audit_lines (operation_id)
    WHERE operation_id IS NOT NULL;
