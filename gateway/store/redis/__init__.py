"""The Redis store (``redis://``, ``redis+cluster://``): one shared store for many replicas.

Job: keep records, leases and pacing windows in Redis, each rule a Lua script run
atomically (``lua/*.lua``, loaded and keyed by ``layout``), the poll path's commands of one
loop turn pipelined by ``turns`` over the wire format in ``wire``. ``store`` holds
``RedisStore``.

May import: ``gateway.core``, ``gateway``, ``gateway.settings``, ``gateway.store``'s
shared modules (``base``, ``shared``) and redis-py; never another backend, never a layer
above the store. No redis-py exception leaves this package (they become ``StoreError``).
"""
