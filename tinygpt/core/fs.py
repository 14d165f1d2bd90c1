"""The file-system primitives every layer may use: how much memory is left, reading a user's file
only after its size is checked, and writing a file atomically.

Reading: only regular files (a FIFO would hang, /dev/zero never ends), and only up to a size
stated before a byte is read. Writing: a short temporary name beside the target, fsync, rename,
so a crash leaves the old file or the new one, never half of one.
"""
from __future__ import annotations

import os
import sys
import stat
import tempfile
from contextlib import contextmanager
from pathlib import Path


def available_memory() -> int:
    """Bytes of memory this process can still use: Linux's MemAvailable (free memory plus the page
    cache it can drop; plain free memory would refuse files after any large read), else free
    physical pages, else 4 GiB."""
    try:
        with open("/proc/meminfo", "rb") as f:
            for line in f:
                if line.startswith(b"MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 4 << 30


def check_regular(path, error: type, label: str, expect: str) -> os.stat_result:
    """stat (follows links, opens nothing): a regular file, or error(one line)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise error(f"{label}: no such file; give {expect}") from None
    except OSError as e:
        raise error(f"{label}: cannot read it ({e.strerror}); check the path and its permissions") from e
    if stat.S_ISDIR(st.st_mode):
        raise error(f"{label}: is a directory; give {expect}")
    if not stat.S_ISREG(st.st_mode):
        kind = "a FIFO" if stat.S_ISFIFO(st.st_mode) else "a device" if stat.S_ISCHR(st.st_mode) or \
            stat.S_ISBLK(st.st_mode) else "a socket" if stat.S_ISSOCK(st.st_mode) else "not a regular file"
        raise error(f"{label}: is {kind}, not a regular file; give {expect}")
    return st


def read_most(f, n: int) -> bytes:
    """f.read(n) that allocates only what the file holds: f.read(n) reserves n bytes before it
    reads (a bound of 4 GiB failed with MemoryError on a 22 KB file under a memory limit). The
    bytes the file holds now in one read, then, should it have grown, 1 MiB at a time up to n."""
    try:
        left = max(0, os.fstat(f.fileno()).st_size - f.tell())
    except (OSError, ValueError, AttributeError):
        left = 0
    first = f.read(min(n, left))
    if len(first) >= n:
        return first
    parts, got = [first], len(first)
    while got < n:
        more = f.read(min(n - got, 1 << 20))
        if not more:
            break
        parts.append(more)
        got += len(more)
    return first if len(parts) == 1 else b"".join(parts)


def read_user_file(path, error: type, label: str, expect: str, max_bytes: int, what_limits: str = "") -> bytes:
    """The bytes of a regular file of at most max_bytes, or error(one line) naming label and the fix."""
    st = check_regular(path, error, label, expect)
    if st.st_size > max_bytes:
        why = f" ({what_limits})" if what_limits else ""
        raise error(f"{label}: {st.st_size:,} bytes is more than the {max_bytes:,} this can read{why}; "
                    f"give {expect}")
    try:
        with open(path, "rb") as f:
            data = read_most(f, max_bytes + 1)
    except OSError as e:
        raise error(f"{label}: cannot read it ({e.strerror}); check its permissions") from e
    if len(data) > max_bytes:  # it grew since the stat
        raise error(f"{label}: grew past {max_bytes:,} bytes while being read; give {expect}")
    return data



def name_max(directory) -> int:
    try:
        return int(os.pathconf(directory if Path(directory).exists() else ".", "PC_NAME_MAX"))
    except (OSError, ValueError):
        return 255




def creation_mode(path, base: int = 0o666) -> int:
    """The permission bits a new file (base 0o666) or directory (0o777) at path gets: those of the
    file it replaces, else base less the umask, as open() and mkdir() would give. (mkstemp and
    mkdtemp make 0600 and 0700 whatever the umask: a checkpoint others were to read was not.)"""
    try:
        return stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        mask = os.umask(0)
        os.umask(mask)
        return base & ~mask


def atomic_write(path, data: bytes):
    """Temporary file beside the target (a short name, whatever the target's length), fsync,
    rename, fsync the directory. A crash at any point leaves the old file or the new one.
    Under writes_shown, a large file's writing shows a progress bar."""
    view, step = memoryview(data), 16 << 20
    atomic_write_pieces(path, (view[i:i + step] for i in range(0, len(view), step)), len(view))


def atomic_write_pieces(path, pieces, total: int):
    """atomic_write of a file made in pieces (a checkpoint, tensor by tensor: never whole in
    memory) of `total` bytes in all."""
    with atomic_writer(path) as f:
        if not _SHOWN[0] or total < WRITE_BAR_FROM:
            for piece in pieces:
                f.write(piece)
            return
        from tqdm import tqdm
        with tqdm(total=total, desc=f"writing {Path(path).name}", unit="B", unit_scale=True, unit_divisor=1024,
                  leave=False, file=sys.stderr, dynamic_ncols=True) as bar:
            for piece in pieces:
                f.write(piece)
                bar.update(len(piece))


WRITE_BAR_FROM = 64 << 20       # smaller files are written in a moment
_SHOWN = [False]


@contextmanager
def writes_shown(show: bool = True):
    """Within the block, atomic_write shows a bar for each large file (the export's, import-hf's)."""
    was, _SHOWN[0] = _SHOWN[0], show
    try:
        yield
    finally:
        _SHOWN[0] = was


@contextmanager
def atomic_writer(path):
    """atomic_write for a file written in pieces (a token file of any size): yields the temporary
    file; it replaces path only when the block ends without an error, and is removed otherwise."""
    p = Path(path)
    d = p.parent if str(p.parent) else Path(".")
    fd, tmp = tempfile.mkstemp(prefix=".tinygpt-", suffix=".tmp", dir=d)
    try:
        os.fchmod(fd, creation_mode(p))
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)
    except BaseException as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(e, OSError) and e.errno is not None and e.filename in (None, tmp):
            raise OSError(e.errno, e.strerror, str(p)) from e     # the message names the file, not the temporary
            # (an error about another file, an input read in the block, keeps its own name)
        raise
    try:
        dfd = os.open(d, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError:
        pass
