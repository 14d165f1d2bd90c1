"""The tuning cache: what `tinygpt tune` measured fastest on each adapter, kept between runs.

One JSON object {adapter key: entry} in ~/.cache/tinygpt/tuning.json (TINYGPT_CACHE_DIR or
XDG_CACHE_HOME move it). An entry holds only what tune writes; anything else is ignored with a
warning, and a cache that cannot be read never stops a command.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from ..core.errors import warn
from ..core.fs import atomic_write

TUNING_MAX_BYTES = 1 << 20


def cache_dir() -> Path:
    d = os.environ.get("TINYGPT_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "tinygpt")
    return Path(d)


def tuning_path() -> Path:
    return cache_dir() / "tuning.json"


def load_tuning_cache() -> dict:
    """The whole cache {adapter key: entry}, {} where there is none; ValueError (saying why) where
    it is not a regular JSON-object file of at most 1 MiB. The one reader of the file."""
    path = tuning_path()
    if not path.exists():
        return {}
    try:
        if not path.is_file() or path.stat().st_size > TUNING_MAX_BYTES:
            raise ValueError("not a regular file of at most 1 MiB")
        allv = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(str(e)) from e
    if not isinstance(allv, dict):
        raise ValueError(f"it holds a {type(allv).__name__}, not an object")
    return allv


def save_tuning(key: str, entry: dict | None) -> Path | None:
    """Write (or with None, remove) this adapter's entry; an unreadable cache is replaced. A cache
    that cannot be written is a warning, never the end of the command: None then."""
    try:
        return _save(key, entry)
    except OSError as e:
        warn(f"could not write the tuning cache in {cache_dir()} ({e.strerror or e}); the command goes on "
             "without it: set TINYGPT_CACHE_DIR to a writable directory to keep the measurements")
        return None


def _save(key: str, entry: dict | None) -> Path:
    try:
        allv = load_tuning_cache()
    except ValueError:
        allv = {}
    if entry is None:
        allv.pop(key, None)
    else:
        allv[key] = entry
    path = tuning_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, json.dumps(allv, indent=2).encode())
    return path


def _pow2(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0 and v & (v - 1) == 0


def _valid_tuning(key: str, value) -> bool:
    """What `tinygpt tune` writes for each key; anything else is ignored."""
    if key == "matmul_wx":
        return value in (8, 16, 32, 64) and not isinstance(value, bool)
    if key == "online_block":
        return isinstance(value, list) and len(value) == 2 and all(_pow2(v) for v in value) \
            and value[0] <= 1024 and value[1] <= 64
    if key == "peaks":                            # FMA GFLOP/s and streaming GB/s (tune.measure_peaks)
        return isinstance(value, dict) and set(value) == {"gflops", "gbps"} and all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v < 1e9 for v in value.values())
    if key == "matmul_tile":                      # (WX, WY, TM, TV, BK); plan.tile_problem judges the device
        return isinstance(value, list) and len(value) == 5 and all(
            isinstance(v, int) and not isinstance(v, bool) and 0 < v <= 1024 for v in value)
    if key == "matmul":
        return value in ("sg", "tiled", "vec4", "scalar")
    if key == "attention":
        return value in ("sg", "tiles")
    return False


def read_tuning(key: str) -> dict:
    """The kernel variants `tinygpt tune` measured fastest on this adapter, or {} (the defaults).

    A cache that cannot be read, or an entry of it that tune could not have written, is ignored
    with one warning naming the file and how to reset it."""
    path = tuning_path()
    reset = f"reset it with 'tinygpt tune {{opt:reset}}' or delete {path}"
    try:
        entry = load_tuning_cache().get(key, {})
        if not isinstance(entry, dict):
            raise ValueError(f"the entry for this adapter is {type(entry).__name__}, not an object")
    except ValueError as e:
        warn(f"ignoring the tuning cache {path} ({e}); the default kernels run; {reset}")
        return {}
    bad = {k: v for k, v in entry.items() if not _valid_tuning(k, v)}
    if bad:
        shown = ", ".join(f"{k}={json.dumps(v)}" for k, v in list(bad.items())[:3])
        warn(f"ignoring invalid entries of the tuning cache {path}: {shown}; {reset}")
    return {k: v for k, v in entry.items() if k not in bad}


def reset_tuning(key: str) -> str:
    """Remove this adapter's entry from the cache (the file, if it cannot be read); says what it did."""
    path = tuning_path()
    if not path.exists():
        return f"no tuning cache at {path}: nothing to reset"
    try:
        held = key in load_tuning_cache()
    except ValueError:
        try:
            path.unlink()
        except OSError as e:
            return f"could not remove the unreadable tuning cache {path} ({e.strerror}); remove it by hand"
        return f"removed the unreadable tuning cache {path}"
    if not held:
        return f"{path} holds no entry for this adapter: nothing to reset"
    if save_tuning(key, None) is None:
        return f"{path} keeps this adapter's entry (it could not be rewritten)"
    return f"removed this adapter's entry from {path}; the default kernels run until the next tune"
