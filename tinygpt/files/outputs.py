"""Every file a command will write, claimed before any work, and what to do when a write fails.

A claimed output must not be an input of the same command, must not replace a file tinygpt did
not write (unless forced), and its directory must take a new file of that name. The write itself
is core.fs.atomic_write.
"""
from __future__ import annotations

import errno
import hashlib
import io
import json
import os
import stat
import tempfile
from pathlib import Path

from ..core.errors import OutputError
from ..core.fs import atomic_write, name_max, read_most


def derived(path, suffix: str) -> Path:
    """path's stem + suffix (model.tinygpt -> model.loss.png): never path itself (suffix is added
    to the stem, so the name changes), and shortened with a hash where it would pass the name limit."""
    p = Path(path)
    name = p.stem + suffix
    limit = name_max(p.parent if str(p.parent) else ".")
    if len(os.fsencode(name)) > limit:
        tag = "-" + hashlib.sha1(os.fsencode(p.name)).hexdigest()[:8]
        keep = limit - len(os.fsencode(suffix + tag))
        stem = os.fsencode(p.stem)[:keep].decode("utf-8", "ignore")
        name = stem + tag + suffix
    return p.with_name(name)


# ---- what is ours ------------------------------------------------------------------------------
WRITER = "tinygpt"   # stamped in every PNG and safetensors file we write


def _head(path, n: int) -> bytes:
    try:
        with open(path, "rb") as f:
            return read_most(f, n)
    except OSError:
        return b""


def save_png(fig, path, dpi: int = 100) -> Path:
    """A matplotlib figure as a PNG stamped as ours (so a later run may replace it), written
    atomically; the figure is closed."""
    import matplotlib.pyplot as plt
    buf = io.BytesIO()
    fig.savefig(buf, dpi=dpi, format="png", metadata={"Software": WRITER})
    plt.close(fig)
    atomic_write(path, buf.getvalue())
    return Path(path)


def claim_plot(path, option: str = "plot", inputs: dict | None = None) -> Path | None:
    """A script's plot option, claimed before any work as the CLI claims its outputs."""
    return Outputs(None, inputs).claim(path, option, "PNG", is_our_png) if path else None


def is_our_png(path) -> bool:
    head = _head(path, 4096)
    return head.startswith(b"\x89PNG") and b"Software\x00" + WRITER.encode() in head


def is_our_safetensors(path) -> bool:
    head = _head(path, 8)
    if len(head) < 8:
        return False
    n = int.from_bytes(head, "little")
    if n > 100 << 20:
        return False
    try:
        meta = json.loads(_head(path, 8 + n)[8:]).get("__metadata__") or {}
    except (ValueError, AttributeError):
        return False
    return meta.get("writer") == WRITER


def is_json_lines(path, limit: int = 1 << 20) -> bool:
    """Empty, or every whole line of the first MiB a JSON object (our training logs)."""
    head = _head(path, limit)
    lines = head.split(b"\n")
    if len(head) == limit:
        lines = lines[:-1]  # the last may be cut
    try:
        return all(isinstance(json.loads(l), dict) for l in lines if l.strip())
    except (ValueError, UnicodeDecodeError):
        return False


def is_our_json(path) -> bool:
    try:
        return json.loads(_head(path, 1 << 20)).get("tinygpt_writer") == WRITER
    except (ValueError, AttributeError, UnicodeDecodeError):
        return False


# ---- claiming outputs ------------------------------------------------------------------------
def same_file(a, b) -> bool:
    """Whether two paths name one file: by identity where both exist (a hard link, a path through
    a symbolic link), by the resolved path where one is still to be written (link/base.tinygpt,
    link a symbolic link to the base's directory, is the base)."""
    try:
        if os.path.realpath(a) == os.path.realpath(b):
            return True
        return os.path.exists(a) and os.path.exists(b) and os.path.samefile(a, b)
    except (OSError, ValueError):
        return False


class Outputs:
    """The files one command will write, each checked before any work is done.

    inputs: {option: path, or the list of files reading that option opens (a directory's members,
    a token file's sidecar: tokenfile.data_files)}; no output may be one of them, by file
    identity (a hard link, or a path through a symbolic link, is the same file) or by path."""

    def __init__(self, force: bool | None = False, inputs: dict | None = None):
        self.force = bool(force)
        self.forceable = force is not None      # None: the command has no force option to offer
        self.inputs = {}
        for k, v in (inputs or {}).items():
            paths = [Path(p) for p in (v if isinstance(v, (list, tuple)) else [v]) if p]
            if paths:
                self.inputs[k] = paths
        self.claimed: dict[Path, str] = {}

    def claim(self, path, option: str, kind: str, ours=None, append: bool = False,
              updates: str | None = None) -> Path:
        """Check that `path` may be written, or raise OutputError naming {opt:option} and the fix.

        kind: what we write there, for messages; ours(path): whether an existing file is one we
        wrote (then it may be replaced); append: the file is appended to, never replaced;
        updates: the one input this output may be (a resumed checkpoint written back)."""
        p = Path(path)
        label = f"{{opt:{option}}} {p}"
        if str(path).endswith(("/", os.sep)):   # Path drops the slash: a user asking for a directory
            raise OutputError(f"{{opt:{option}}} {path} ends in a slash, which names a directory; give a file name "
                              f"for the {kind}, such as {p / ('x' + (p.suffix or '.out'))}")
        if not p.name or p.name in (".", ".."):
            raise OutputError(f"{label}: not a file name; give a file name for the {kind}")
        for opt, srcs in self.inputs.items():
            for src in srcs if opt != updates else ():
                if same_file(p, src):
                    what = f"{{opt:{opt}}}" if opt.isidentifier() else f"input ({opt})"
                    of = f" (it reads {src})" if len(srcs) > 1 else ""
                    raise OutputError(f"{label} is also this command's {what}{of}; writing the {kind} there would "
                                      "destroy an input: choose another name")
        key = p.resolve()
        if key in self.claimed:
            raise OutputError(f"{label}: the {self.claimed[key]} is written there too; give another name")
        if len(os.fsencode(p.name)) > name_max(p.parent if str(p.parent) else "."):
            raise OutputError(f"{label}: the name is {len(os.fsencode(p.name))} bytes, over this file system's "
                              f"limit of {name_max(p.parent)}; choose a shorter name")
        if p.exists() or p.is_symlink():
            try:
                st = os.stat(p)
            except OSError as e:
                raise OutputError(f"{label}: cannot use it ({e.strerror}); choose another name") from e
            if stat.S_ISDIR(st.st_mode):
                raise OutputError(f"{label} is a directory; give a file name such as {p / ('x' + p.suffix)}")
            if not stat.S_ISREG(st.st_mode):
                raise OutputError(f"{label} exists and is not a regular file; choose another name")
            if append:
                if not (ours and ours(p)):
                    raise OutputError(f"{label} exists and is not a JSON Lines log; the {kind} is only appended "
                                      "to such a file: choose another name")
            elif not (ours and ours(p)) and not self.force:
                fix = "pass {opt:force} to replace it, or choose another name" if self.forceable else \
                    "choose another name"
                raise OutputError(f"{label} exists and is not a {kind} written by tinygpt; {fix}")
        self._check_writable(p, label)
        self.claimed[key] = kind
        return p

    @staticmethod
    def _check_writable(p: Path, label: str):
        d = p.parent if str(p.parent) else Path(".")
        try:
            d.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".tinygpt-", suffix=".probe", dir=d)
            os.close(fd)
            os.unlink(tmp)
        except OSError as e:
            raise OutputError(f"{label}: cannot write in {d} ({e.strerror}); {advice(e)}") from e


def os_error_text(e: OSError) -> str:
    """An OSError as one line of a message: the file, the cause, what to do."""
    where = f"{e.filename}: " if e.filename else ""
    return f"{where}{e.strerror or e}; {advice(e)}"


def advice(e: OSError) -> str:
    """What to do about a failed write, by its cause."""
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return "free some space or write elsewhere"
    if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return "write somewhere you have permission to"
    if e.errno == errno.ENAMETOOLONG:
        return "choose a shorter name"
    return "write elsewhere"


def rescue_paths(path) -> list[Path]:
    """Where a model that could not be saved at `path` goes instead: beside it under a short
    name, then the working directory, then the temporary directory."""
    short = f"tinygpt-rescued-{os.getpid()}.tinygpt"
    p = Path(path)
    cands = [p.parent / short, Path.cwd() / short, Path(tempfile.gettempdir()) / short]
    out = []
    for c in cands:
        if c not in out and not c.exists():
            out.append(c)
    return out
