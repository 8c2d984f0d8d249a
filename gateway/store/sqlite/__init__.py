"""The SQLite store (``sqlite:///path``): one file, one process's writer, group commit.

Job: keep records, leases and pacing windows in one SQLite file for a single gateway
process, with its own machinery: the record cache (``cache``), the WAL's fsync in a helper
process (``wal_sync`` asks ``fsync_helper`` over a pipe) and the loop-turn share
(``loop_share``). ``store`` holds ``SQLiteStore``.

May import: ``gateway.core``, ``gateway``, ``gateway.settings`` and ``gateway.store``'s
shared modules (``base``); never another backend, never a layer above the store.
``fsync_helper`` runs as ``python -I -S``: it imports the standard library only.
"""
