"""Reading the files of the SQLite database this process has open, without breaking its locks.

SQLite locks its files with POSIX (`fcntl`) locks, and the kernel drops every such lock a
process holds on a file the moment that process closes *any* descriptor of it: a test that
reads the live database with `open()` or copies it with `shutil` takes away the shared lock
each of its connections holds in WAL mode. The next process to close its last connection then
believes it is the only one, checkpoints and deletes the `-wal` and `-shm` files under this
process's connections, whose next transaction finds "database disk image is malformed" (the
xdist worker's whole database, for every test after it). So the bytes are read by a child
process, whose descriptors are its own.
"""

from __future__ import annotations

import subprocess
from pathlib import Path


def read_bytes_elsewhere(path: Path | str) -> bytes:
    """The bytes of `path`, read by another process."""
    return subprocess.run(["cat", "--", str(path)], capture_output=True, check=True, timeout=60).stdout


def copy_elsewhere(source: Path | str, target: Path | str) -> None:
    """`source` copied to `target` by another process."""
    subprocess.run(["cp", "--", str(source), str(target)], capture_output=True, check=True, timeout=60)
