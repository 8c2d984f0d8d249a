"""The PostgreSQL store (``postgresql://``): one shared store for many replicas.

Job: keep records, leases and pacing windows in PostgreSQL, each rule a PL/pgSQL function
(``sql/layout_N.sql``, the layout installed by ``statusgate migrate``), the poll path's
statements of one loop turn pipelined by ``turns``, rows decoded by ``rows``. ``store``
holds ``PostgresStore``. Importing this package needs nothing; importing ``store`` needs
the optional psycopg 3 (``statusgate[postgres]``).

May import: ``gateway.core``, ``gateway``, ``gateway.settings``, ``gateway.store``'s
shared modules (``base``, ``shared``), psycopg and psycopg-pool; never another backend,
never a layer above the store. No psycopg exception leaves this package.
"""
