"""Reading a Hugging Face model directory, whatever its architecture: config.json's fields, and
the weights of one model.safetensors or of several (model.safetensors.index.json's shards), each
tensor checked against the shape the config gives it before its bytes are read, one tensor in
memory at a time beside the float32 copy kept. An architecture (hf.ARCHITECTURES) says which
tensors it reads and what its config means.
"""
from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from .checkpoint import CheckpointError, show
from ..core.config import MAX_DIMS, MAX_PARAMS, Config, n_params
from ..core.fs import check_regular, read_user_file
from .data import progress

DTYPES = {"F32": (np.float32, 4), "F16": (np.float16, 2), "BF16": (None, 2)}
BAR_FROM_BYTES = 64 << 20      # smaller files read or write in a moment: a bar then only on a terminal
MAX_CONFIG = 1 << 20
MAX_INDEX = 64 << 20            # a sharded model's index (a 70B model's is 100 kB)
MAX_SHARDS = 4096


@dataclass(frozen=True)
class Architecture:
    """One Hugging Face architecture: its names, what its config means, which tensors it reads."""
    name: str                   # config.json's architectures entry: "GPT2LMHeadModel", ...
    model_type: str
    prefix: str                 # the tensors' names begin with it inside the model ("transformer.", "model.")
    config: Callable            # (config.json as a dict, label, ctx or None) -> Config, refusing in one line
    read: Callable              # (Tensors, Config) -> our parameters
    state: Callable             # (Config, params) -> {its tensor name: array}
    config_json: Callable       # (Config, tokenizer) -> config.json
    computes: Callable          # (core.block.Block) -> whether this architecture computes that block
    unread: tuple = ()          # suffixes of tensors a file may carry that hold no parameter (masks, tables)
    peft_modules: dict | None = None    # our matrix -> its module's path in a block (None: lora_files' own)


def field(c: dict, key: str, default, kind, label: str, family: str = "a GPT-2"):
    """A number of config.json by name: present (or defaulted), a JSON number of the right kind."""
    if c.get(key) is None:
        if default is None:
            raise CheckpointError(f"{label}: no {key}; {family} config.json has one")
        return default
    v = c[key]
    number = isinstance(v, (int, float)) and not isinstance(v, bool)
    if not number or not (isinstance(v, int) or math.isfinite(v)) or (kind is int and v != int(v)):
        raise CheckpointError(f"{label}: {key} is {show(v)}; expected {'a whole' if kind is int else 'a finite'} "
                              "number")
    return kind(v)


def read_config(d: Path) -> tuple[dict, str]:
    """(config.json as a dict, its label)."""
    label = f"{d}/config.json"
    raw = read_user_file(d / "config.json", CheckpointError, label, "a Hugging Face model's config.json", MAX_CONFIG)
    try:
        c = json.loads(raw)
        assert isinstance(c, dict)
    except (ValueError, AssertionError, RecursionError) as e:
        raise CheckpointError(f"{label} is not a JSON object (or nests too deeply); give a Hugging Face model "
                              "directory") from e
    return c, label


def check_size(cfg: Config, label: str, names: dict | None = None):
    """The config's dimensions within what tinygpt holds, before anything is sized from them;
    names: config.json's name for each of ours, for the message."""
    names = names or {}
    for name, most in MAX_DIMS.items():
        v = getattr(cfg, name)
        if not 0 < v <= most:
            raise CheckpointError(f"{label}: {names.get(name, name)} {v} is out of range (1 to {most:,})")
    if cfg.d_model % cfg.heads or cfg.d_model // cfg.heads > 128:
        raise CheckpointError(f"{label}: width {cfg.d_model} / {cfg.heads} heads: heads must divide the width into "
                              "head dims of at most 128")
    if n_params(cfg) > MAX_PARAMS:
        raise CheckpointError(f"{label}: {n_params(cfg):,} parameters, more than tinygpt holds ({MAX_PARAMS:,})")
    try:
        cfg.validate()
    except ValueError as e:
        raise CheckpointError(f"{label}: {e}") from e


def _header(path: Path, cfg: Config):
    """(header, data offset, size) of a safetensors file whose size agrees with the config."""
    label = str(path)
    st = check_regular(path, CheckpointError, label, "the directory's safetensors file")
    with open(path, "rb") as f:
        pre = f.read(8)
        if len(pre) < 8:
            raise CheckpointError(f"{label}: too short to be a safetensors file")
        (hlen,) = struct.unpack("<Q", pre)
        if hlen > min(64 << 20, st.st_size - 8):
            raise CheckpointError(f"{label}: a header of {hlen:,} bytes, more than the file or 64 MiB holds; "
                                  "the file is damaged")
        try:
            header = json.loads(f.read(hlen))
            assert isinstance(header, dict)
        except (ValueError, AssertionError, RecursionError) as e:
            raise CheckpointError(f"{label}: its header is not a JSON object (or nests too deeply); the file is "
                                  "damaged") from e
    n = n_params(cfg)
    most = 8 + hlen + 4 * n + 4 * cfg.layers * (cfg.ctx * cfg.ctx + 1) + (1 << 20) + 4 * cfg.vocab * cfg.d_model
    if st.st_size > most:
        raise CheckpointError(f"{label}: {st.st_size:,} bytes, far more than a model of this config holds")
    return header, 8 + hlen, st.st_size


def shard_files(d: Path) -> list[Path]:
    """model.safetensors, or the shards model.safetensors.index.json names (each a file in d)."""
    one, index = d / "model.safetensors", d / "model.safetensors.index.json"
    if one.exists() or not index.exists():
        return [one]
    label = str(index)
    raw = read_user_file(index, CheckpointError, label, "a sharded model's index", MAX_INDEX, "64 MiB")
    try:
        wm = json.loads(raw).get("weight_map")
        assert isinstance(wm, dict) and all(isinstance(v, str) for v in wm.values())
    except (ValueError, AssertionError, AttributeError, RecursionError) as e:
        raise CheckpointError(f"{label}: no weight_map of tensor names to file names; the index is damaged") from e
    names = sorted(set(wm.values()))
    bad = [n for n in names if Path(n).name != n or n in (".", "..")]
    if bad or not names or len(names) > MAX_SHARDS:
        raise CheckpointError(f"{label}: its weight_map names {show(bad[0]) if bad else len(names)} as a file; "
                              f"shards are 1 to {MAX_SHARDS:,} files beside the index")
    return [d / n for n in names]


class Tensors:
    """The tensors of a model's safetensors files, by their names without the architecture's prefix,
    each checked against the shape the config gives it; `used` records which were read."""

    def __init__(self, files: list[Path], cfg: Config, prefix: str):
        self.files, self.names, self.used, self.bar = {}, {}, set(), None     # bar: updated by each tensor's bytes
        for path in files:
            header, data0, size = _header(path, cfg)
            self.files[path] = (header, data0, size)
            for k in header:
                if k != "__metadata__":
                    self.names[k[len(prefix):] if k.startswith(prefix) else k] = (path, k)
        self.size = sum(size - data0 for _, data0, size in self.files.values())

    def __contains__(self, name: str) -> bool:
        return name in self.names

    def __call__(self, name: str, shape: tuple, transpose: bool = False) -> np.ndarray:
        """The tensor as float32 [shape]; transpose: stored [out, in] (PyTorch's Linear), given [in, out]."""
        if name not in self.names:
            raise CheckpointError(f"{next(iter(self.files))}: no tensor {name}; the model is incomplete or not "
                                  "the architecture its config names")
        path, key = self.names[name]
        header, data0, size = self.files[path]
        t = header[key]
        if not isinstance(t, dict):
            raise CheckpointError(f"{path}: the header's entry for {key} is {show(t)}, not an object with dtype, "
                                  "shape and data_offsets; the file is damaged")
        self.used.add(name)
        stored = tuple(shape[::-1]) if transpose else tuple(shape)
        try:
            dtype, width = DTYPES[t["dtype"]]
            b0, b1 = (int(x) for x in t["data_offsets"])
            got = tuple(int(s) for s in t["shape"])
        except (KeyError, TypeError, ValueError) as e:
            raise CheckpointError(f"{path}: tensor {key} has a dtype tinygpt does not read ({t.get('dtype')}), or "
                                  "a malformed entry; F32, F16 and BF16 are read") from e
        if got != stored:
            raise CheckpointError(f"{path}: {key} has shape {list(got)}, the config says {list(stored)}")
        if not 0 <= b0 <= b1 <= size - data0 or b1 - b0 != width * int(np.prod(stored)):
            raise CheckpointError(f"{path}: {key}'s bytes lie outside the file or disagree with its shape")
        with open(path, "rb") as f:
            f.seek(data0 + b0)
            raw = f.read(b1 - b0)
        if len(raw) != b1 - b0:
            raise CheckpointError(f"{path}: the file ends inside {key}; it is truncated")
        if self.bar is not None:
            self.bar.update(len(raw))
        if dtype is None:   # bfloat16: the top half of a float32
            a = (np.frombuffer(raw, np.uint16).astype(np.uint32) << 16).view(np.float32)
        else:
            a = np.frombuffer(raw, dtype).astype(np.float32)
        a = a.reshape(stored)
        return np.ascontiguousarray(a.T) if transpose else a

    def left(self, unread: tuple) -> list:
        """What the config does not account for (a config.json over another model's weights)."""
        return sorted(self.names[n][1] for n in self.names
                      if n not in self.used and not any(n.endswith(u) for u in unread))


def read_model(arch: Architecture, read, cfg: Config, label: str, quiet: bool, reading: str, fields: str) -> dict:
    """Every parameter an architecture reads from `read` (Tensors, or a GGUF file's), with a bar over
    the weights' bytes; tensors the config does not account for, and any nan or inf, refused.
    fields: what describes the model, for the message ("its config.json")."""
    read.bar = progress(read.size, reading, disable=quiet, shown_from=BAR_FROM_BYTES)
    try:
        P = arch.read(read, cfg)
    finally:
        read.bar.close()
    left = read.left(arch.unread)
    if left:
        more = f" and {len(left) - 3} more" if len(left) > 3 else ""
        raise CheckpointError(f"{label}: tensors {fields} does not account for: {', '.join(left[:3])}{more}; "
                              f"{fields} ({cfg.layers} layers, width {cfg.d_model}) and the weights disagree")
    bad = [n for n, a in P.items() if not np.all(np.isfinite(a))]
    if bad:
        raise CheckpointError(f"{label}: {bad[0]} holds nan or inf")
    return P
