"""The program of the SQLite store's fsync process (gateway/store/sqlite/wal_sync.py starts it).

``python -I -S fsync_helper.py PATH``: first one byte on standard output, READY (nothing
asked of it before that byte can have run); then for every byte read on standard input,
fsync PATH and answer one byte, 0 when the fsync succeeded, else its errno. PATH is
opened at the first request and again when it was unlinked and made anew (a WAL file SQLite
reset), its folder fsynced at each such open so the new file's name is durable too.

It exits at the end of its input: the gateway closed it, or died. It runs in a session of
its own and ignores SIGINT, SIGTERM and SIGHUP, so a Ctrl-C, a service manager's stop or a
reload signal sent to the gateway's processes by name (its command line holds "gateway")
leaves the gateway's fsyncs to run. It must never import the gateway or anything beyond
os, signal and sys: it starts in milliseconds and runs on an interpreter lock of its own,
which is why it exists (a thread of the gateway's needs the loop's lock before and after each
fsync, which cost the loop's callers milliseconds a write under load).
"""

from __future__ import annotations

import os
import signal
import sys

READY = b"+"


class WalFile:
    """PATH's descriptor, opened again when the file was replaced. Also the gateway's own,
    for the fsyncs it makes on a thread while no helper can be started."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.fd: int | None = None

    def sync(self) -> None:
        fd = self.fd
        if fd is not None and os.fstat(fd).st_nlink == 0:
            os.close(fd)
            fd = self.fd = None
        if fd is None:
            fd = self.fd = os.open(self.path, os.O_RDONLY)
            folder = os.open(os.path.dirname(os.path.abspath(self.path)), os.O_RDONLY)
            try:
                os.fsync(folder)
            finally:
                os.close(folder)
        os.fsync(fd)

    def close(self) -> None:
        fd, self.fd = self.fd, None
        if fd is not None:
            os.close(fd)


def main(path: str) -> int:
    for ignored in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(ignored, signal.SIG_IGN)
    wal = WalFile(path)
    try:
        os.write(1, READY)
    except OSError:  # the gateway is gone
        return 0
    while True:
        try:
            asked = os.read(0, 64)
        except OSError:
            return 0
        if not asked:
            return 0
        for _ in asked:  # requests are one at a time; more bytes would each get an answer
            try:
                wal.sync()
                status = 0
            except OSError as exc:
                status = min(max(exc.errno or 255, 1), 255)
            try:
                os.write(1, bytes((status,)))
            except OSError:  # the gateway is gone
                return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
