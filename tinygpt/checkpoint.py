"""The .tinygpt file of TinyGPT's browser app, read and written exactly, and exports.

    4 bytes  "TGPT"
    4 bytes  uint32 LE version (1 or 2; we write 2)
    4 bytes  uint32 LE length N of the JSON header
    N bytes  UTF-8 JSON header
    rest     int32 LE step, then for every parameter in .tinygpt order its
             weights, AdamW m and AdamW v, float32 LE, row-major

Fields this port adds live under the header key "tinygptPy", which the
original ignores. Nothing here unpickles or evaluates anything from a file.
Writes are atomic (core.fs.atomic_write): a temporary file beside the target, fsync, rename.
"""
from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass, field

import numpy as np

from .core.config import Config, n_params, param_specs
from .core.errors import TinyGPTError
from .core.fs import atomic_write, available_memory, check_regular
from .outputs import WRITER

MAGIC = b"TGPT"
VERSION = 2


class CheckpointError(TinyGPTError, ValueError):
    pass


@dataclass
class Checkpoint:
    cfg: Config
    params: dict
    m: dict | None = None
    v: dict | None = None
    step: int = 0
    loss_history: list = field(default_factory=list)
    extra: dict = field(default_factory=dict)       # our own fields: tokenizer, data state, ...
    header: dict = field(default_factory=dict)      # the whole header as read (unknown keys kept)


def config_to_header(cfg: Config, tokenizer_source: str | None = None) -> dict:
    c = {"layers": cfg.layers, "dModel": cfg.d_model, "ctx": cfg.ctx, "heads": cfg.heads, "dMlp": cfg.d_mlp,
         "batchSize": cfg.batch, "learningRate": cfg.lr, "gradClip": cfg.grad_clip, "seed": cfg.seed}
    if cfg.vocab != 256:
        c["vocabSize"] = cfg.vocab
        c["tokenizerSource"] = tokenizer_source or "r50k_base"
    return c


def config_from_header(c: dict) -> Config:
    try:
        cfg = Config(layers=int(c["layers"]), d_model=int(c["dModel"]), heads=int(c["heads"]), ctx=int(c["ctx"]),
                     batch=int(c.get("batchSize", 16)), d_mlp=int(c.get("dMlp") or 4 * int(c["dModel"])),
                     vocab=int(c.get("vocabSize", 256)), lr=float(c.get("learningRate", 3e-4)),
                     grad_clip=float(c.get("gradClip", 1.0)), seed=int(c.get("seed", 0)))
    except (KeyError, TypeError, ValueError, OverflowError) as e:
        raise CheckpointError(f"the header's config is incomplete or malformed ({e!r})") from e
    try:
        cfg.validate()
    except ValueError as e:
        raise CheckpointError(f"the header's config is invalid: {e}") from e
    return cfg


def manifest(cfg: Config, with_opt: bool = True):
    out, off = [], 0
    for name, shape, _ in param_specs(cfg):
        out.append({"name": name, "shape": list(shape), "floatOffset": off})
        off += int(np.prod(shape)) * (3 if with_opt else 1)
    return out, off


def encode(ck: Checkpoint) -> bytes:
    cfg = ck.cfg
    man, nfloats = manifest(cfg)
    header = {k: v for k, v in ck.header.items()}  # keep what another writer put there
    header.update({
        "config": config_to_header(cfg, ck.extra.get("tokenizerSource")),
        "includesOptimizerState": True,
        "weightDtype": "fp32",
        "stateByteLength": 4 + 4 * nfloats,
        "manifest": man,
        "lossHistory": ck.loss_history,
    })
    if ck.loss_history:
        header["finalLoss"] = ck.loss_history[-1].get("train")
    header["tinygptPy"] = ck.extra
    hbytes = json.dumps(header, separators=(",", ":")).encode("utf-8")
    parts = [MAGIC, struct.pack("<II", VERSION, len(hbytes)), hbytes, struct.pack("<i", int(ck.step))]
    for name, shape, _ in param_specs(cfg):
        for d in (ck.params, ck.m, ck.v):
            a = np.zeros(shape, np.float32) if d is None else np.asarray(d[name], "<f4")
            if a.shape != tuple(shape):
                raise CheckpointError(f"{name} has shape {a.shape}, the config says {tuple(shape)}")
            parts.append(a.tobytes())
    return b"".join(parts)


MAX_HEADER = 64 << 20   # bytes of JSON header we read at most (a long loss history is ~50 bytes a step)
TOKENIZER_VOCAB = {"byte": 256, "gpt2": 50257}


def tokenizer_name(extra: dict, vocab: int) -> str:
    """The tokenizer a file names (ours, under tinygptPy), else TinyGPT's by vocabulary size."""
    return extra.get("tokenizer", "byte" if vocab == 256 else "gpt2")


def _prefix(pre: bytes, size: int, what: str) -> tuple[int, int]:
    """(version, header length) from the first 12 bytes of a file of `size` bytes."""
    if len(pre) < 12:
        raise CheckpointError(f"{what} is too short to be a .tinygpt file ({size} bytes)")
    if pre[:4] != MAGIC:
        raise CheckpointError(f"{what} is not a .tinygpt file (it starts with {pre[:4]!r}, not b'TGPT')")
    version, hlen = struct.unpack("<II", pre[4:12])
    if version not in (1, 2):
        raise CheckpointError(f"{what} has .tinygpt version {version}; this tinygpt reads versions 1 and 2")
    if 12 + hlen > size:
        raise CheckpointError(f"{what}: its header claims {hlen:,} bytes but the file has {size - 12:,} after the "
                              "prefix; the file is truncated or corrupt")
    if hlen > MAX_HEADER:
        raise CheckpointError(f"{what}: its header claims {hlen:,} bytes, more than the {MAX_HEADER:,} a "
                              ".tinygpt header may have")
    return version, hlen


def _header(version: int, hbytes: bytes, state_len: int, what: str):
    """(header, cfg, with_opt, float count): the config checked by arithmetic against the state's
    length before anything is sized from it."""
    try:
        header = json.loads(hbytes.decode("utf-8"))
        if not isinstance(header, dict):
            raise ValueError("not an object")
    except (UnicodeDecodeError, ValueError) as e:
        raise CheckpointError(f"{what}: the header is not valid JSON ({e})") from e
    if not isinstance(header.get("config"), dict):
        raise CheckpointError(f"{what}: the header has no config")
    cfg = config_from_header(header["config"])
    dtype = header.get("weightDtype", "fp32")
    if dtype != "fp32":
        raise CheckpointError(f"{what} stores weights as {dtype!r}; this tinygpt reads fp32 only")
    with_opt = bool(header.get("includesOptimizerState", version >= 2))
    nfloats = n_params(cfg) * (3 if with_opt else 1)
    expected = 4 + 4 * nfloats
    declared = header.get("stateByteLength")
    if declared is not None and declared != expected:
        raise CheckpointError(f"{what}: stateByteLength {declared!r} disagrees with its config, which needs "
                              f"{expected:,} bytes")
    if state_len < expected:
        raise CheckpointError(f"{what} is truncated: its state has {state_len:,} of {expected:,} bytes")
    if state_len > expected:
        raise CheckpointError(f"{what} has {state_len - expected:,} bytes more state than its config needs")
    extra = header.get("tinygptPy") or {}
    if not isinstance(extra, dict):
        raise CheckpointError(f"{what}: the header's tinygptPy field is not an object")
    tok = tokenizer_name(extra, cfg.vocab)
    if TOKENIZER_VOCAB.get(tok) != cfg.vocab:
        known = ", ".join(f"{k} ({v:,})" for k, v in TOKENIZER_VOCAB.items())
        raise CheckpointError(f"{what}: its tokenizer {tok!r} cannot produce its vocabulary of {cfg.vocab:,} "
                              f"tokens (known: {known}); the file is inconsistent")
    return header, cfg, with_opt, nfloats


def _build(header, cfg, with_opt, nfloats, state: bytes) -> Checkpoint:
    step = struct.unpack("<i", state[:4])[0]
    floats = np.frombuffer(state, "<f4", offset=4, count=nfloats)
    params, m, v = {}, ({} if with_opt else None), ({} if with_opt else None)
    pos = 0
    for name, shape, _ in param_specs(cfg):
        n = int(np.prod(shape))
        for d in ((params, m, v) if with_opt else (params,)):
            d[name] = floats[pos:pos + n].reshape(shape).astype(np.float32)
            pos += n
    extra = header.get("tinygptPy") or {}
    history = header.get("lossHistory")
    return Checkpoint(cfg, params, m, v, step, list(history) if isinstance(history, list) else [], dict(extra),
                      header)


def decode(raw: bytes, what: str = "the file") -> Checkpoint:
    version, hlen = _prefix(raw[:12], len(raw), what)
    header, cfg, with_opt, nfloats = _header(version, raw[12:12 + hlen], len(raw) - 12 - hlen, what)
    return _build(header, cfg, with_opt, nfloats, raw[12 + hlen:])


def load(path: str | os.PathLike, label: str | None = None) -> Checkpoint:
    """Read a .tinygpt file: a regular file, its prefix and header checked against its size (and
    the machine's free memory) before the state is read."""
    what = label or str(path)
    st = check_regular(path, CheckpointError, what, "a .tinygpt file")
    try:
        with open(path, "rb") as f:
            version, hlen = _prefix(f.read(12), st.st_size, what)
            hbytes = f.read(hlen)
            state_len = st.st_size - 12 - hlen
            header, cfg, with_opt, nfloats = _header(version, hbytes, state_len, what)
            if 3 * state_len > available_memory():
                raise CheckpointError(f"{what}: its {state_len:,} bytes of weights need more memory than is free "
                                      f"({available_memory():,} bytes)")
            state = f.read(state_len)
    except OSError as e:
        raise CheckpointError(f"{what}: cannot read it ({e.strerror}); check its permissions") from e
    if len(state) != state_len:
        raise CheckpointError(f"{what} changed while being read; try again")
    return _build(header, cfg, with_opt, nfloats, state)


def peek_step(path) -> int | None:
    """The step a .tinygpt file holds, reading only its prefix and header; None if it is not one."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            version, hlen = _prefix(f.read(12), size, str(path))
            f.seek(12 + hlen)
            raw = f.read(4)
        return struct.unpack("<i", raw)[0] if len(raw) == 4 else None
    except (OSError, CheckpointError):
        return None


def save(path, ck: Checkpoint):
    atomic_write(path, encode(ck))


def is_tinygpt(path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == MAGIC
    except OSError:
        return False


# ---- exports -----------------------------------------------------------------------------------
def export_safetensors(ck: Checkpoint, out):
    from safetensors.numpy import save
    tensors = {name: np.ascontiguousarray(ck.params[name], np.float32) for name, _, _ in param_specs(ck.cfg)}
    atomic_write(out, save(tensors, metadata={"format": "tinygpt", "writer": WRITER,
                                              "config": json.dumps(config_to_header(ck.cfg))}))
