"""Where Mesa keeps the machine code it compiles for this process: a folder of its own for each
SIMD width that llvmpipe is asked to build for.

Why: Mesa's on-disk shader cache (lavapipe and llvmpipe, Mesa 22.3.6 at least) keys a compiled
shader by the shader's NIR, the driver build and the CPU, but not by LP_NATIVE_VECTOR_WIDTH, the
SIMD width llvmpipe compiles for, which is also the subgroup size it reports (128 bits: 4
lanes, 256: 8, 512: 16). A kernel whose NIR does not depend on the subgroup size (ours read it
nowhere) compiles to the same key at every width, so code built for 4-lane subgroups is loaded,
without a word, by a process that runs 8-lane ones: online_sg.wgsl, whose lanes broadcast to a
workgroup of 8, then computes NaN (docs/engines.md, "The shader cache"). `make test` runs the
kernel tests at 4 and 16 lanes, and a user's own experiments do the same; one shared folder is
enough to poison it.

Mesa reads MESA_SHADER_CACHE_DIR once, when the driver starts, so this runs before the first
adapter is enumerated. The folder is tinygpt-lp-<width> ("native" when the width is the CPU's
own) in <tinygpt's cache dir>/mesa, or in the MESA_SHADER_CACHE_DIR the user named: code of one
width never meets another's, and a cache another program or an older tinygpt filled is not read
at all. A child process (a test's, a script's) inherits the variable and, seeing one of these
folders, takes its sibling for its own width. MESA_SHADER_CACHE_DISABLE is the user's and is left
alone. Drivers other than Mesa's ignore the variable.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

from .tuning import cache_dir

PREFIX = "tinygpt-lp-"
_SET = {}     # the folder this process gave Mesa, once


def width_key() -> str:
    """The part of the environment that changes llvmpipe's code and that Mesa's key misses."""
    width = os.environ.get("LP_NATIVE_VECTOR_WIDTH", "").strip()
    return re.sub(r"[^0-9A-Za-z]", "_", width)[:16] if width else "native"


def shader_cache_dir() -> Path:
    """The folder Mesa is to use: see the module's docstring."""
    given = _SET.get("given", os.environ.get("MESA_SHADER_CACHE_DIR"))
    base = Path(given) if given else cache_dir() / "mesa"
    if base.name.startswith(PREFIX):       # a parent process's choice: its base, this width
        base = base.parent
    return base / (PREFIX + width_key())


def separate_shader_caches() -> Path:
    """Point Mesa at this width's folder before any driver starts (idempotent: the first call
    decides, as Mesa reads the variable only once); returns it."""
    if "dir" not in _SET:
        _SET["given"] = os.environ.get("MESA_SHADER_CACHE_DIR")
        d = shader_cache_dir()
        try:
            d.mkdir(parents=True, exist_ok=True)    # Mesa makes only the last level itself
        except OSError:
            pass                                    # Mesa then runs without a disk cache: slower, still right
        os.environ["MESA_SHADER_CACHE_DIR"] = str(d)
        _SET["dir"] = d
    return _SET["dir"]
