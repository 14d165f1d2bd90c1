"""Reading what a user names and writing what a user keeps.

read_user_file turns every way a path can be wrong into one sentence of the
caller's error type; atomic_write never leaves half a file behind.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path


def read_user_file(path, error: type, label: str, expect: str) -> bytes:
    """The bytes at path, or error(one line): label names the flag or file, expect what to give."""
    p = Path(path)
    if not p.exists():
        raise error(f"{label}: no such file; give {expect}")
    if p.is_dir():
        raise error(f"{label}: is a directory; give {expect}")
    try:
        return p.read_bytes()
    except OSError as e:
        raise error(f"{label}: cannot read it ({e.strerror}); check its permissions") from e


def atomic_write(path, data: bytes):
    """Temporary file beside the target, fsync, rename, fsync the directory.

    A crash at any point leaves either the old file or the new one, never half of one."""
    p = Path(path)
    d = p.parent if str(p.parent) else Path(".")
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=d)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    try:
        dfd = os.open(d, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError:
        pass
