"""The .tinygpt file of TinyGPT's browser app, read and written exactly, and exports.

    4 bytes  "TGPT"
    4 bytes  uint32 LE version (1 or 2; we write 2)
    4 bytes  uint32 LE length N of the JSON header
    N bytes  UTF-8 JSON header
    rest     int32 LE step, then for every parameter in .tinygpt order its
             weights, AdamW m and AdamW v, float32 LE, row-major

Fields this port adds live under the header key "tinygptPy", which the
original ignores. Nothing here unpickles or evaluates anything from a file.
Writes are atomic (files.atomic_write): a temporary file beside the target, fsync, rename.
"""
from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .config import Config, param_specs
from .files import atomic_write, read_user_file

MAGIC = b"TGPT"
VERSION = 2


class CheckpointError(ValueError):
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
    except (KeyError, TypeError, ValueError) as e:
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


def decode(raw: bytes, what: str = "the file") -> Checkpoint:
    if len(raw) < 12:
        raise CheckpointError(f"{what} is too short to be a .tinygpt file ({len(raw)} bytes)")
    if raw[:4] != MAGIC:
        raise CheckpointError(f"{what} is not a .tinygpt file (it starts with {raw[:4]!r}, not b'TGPT')")
    version, hlen = struct.unpack("<II", raw[4:12])
    if version not in (1, 2):
        raise CheckpointError(f"{what} has .tinygpt version {version}; this tinygpt reads versions 1 and 2")
    if 12 + hlen > len(raw):
        raise CheckpointError(f"{what}: its header claims {hlen:,} bytes but the file has {len(raw) - 12:,} after the prefix; "
                              "the file is truncated or corrupt")
    try:
        header = json.loads(raw[12:12 + hlen].decode("utf-8"))
        if not isinstance(header, dict):
            raise ValueError("not an object")
    except (UnicodeDecodeError, ValueError) as e:
        raise CheckpointError(f"{what}: the header is not valid JSON ({e})") from e
    if "config" not in header:
        raise CheckpointError(f"{what}: the header has no config")
    cfg = config_from_header(header["config"])
    dtype = header.get("weightDtype", "fp32")
    if dtype != "fp32":
        raise CheckpointError(f"{what} stores weights as {dtype!r}; this tinygpt reads fp32 only")
    with_opt = bool(header.get("includesOptimizerState", version >= 2))
    _, nfloats = manifest(cfg, with_opt)
    state = raw[12 + hlen:]
    expected = 4 + 4 * nfloats
    declared = header.get("stateByteLength")
    if declared is not None and int(declared) != expected:
        raise CheckpointError(f"{what}: stateByteLength {declared:,} disagrees with its config, which needs {expected:,} bytes")
    if len(state) < expected:
        raise CheckpointError(f"{what} is truncated: its state has {len(state):,} of {expected:,} bytes")
    if len(state) > expected:
        raise CheckpointError(f"{what} has {len(state) - expected:,} bytes more state than its config needs")
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
    return Checkpoint(cfg, params, m, v, step, list(header.get("lossHistory") or []), dict(extra), header)


def load(path: str | os.PathLike) -> Checkpoint:
    return decode(read_user_file(path, CheckpointError, str(path), "a .tinygpt file"), str(path))


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
    atomic_write(out, save(tensors, metadata={"format": "tinygpt", "config": json.dumps(config_to_header(ck.cfg))}))


def hf_state(ck: Checkpoint) -> dict:
    """GPT2LMHeadModel's names; Conv1D weights are [in, out] like ours; q|k|v -> c_attn."""
    P, cfg = ck.params, ck.cfg
    sd = {"transformer.wte.weight": P["tok_emb"], "transformer.wpe.weight": P["pos_emb"],
          "transformer.ln_f.weight": P["ln_f_g"], "transformer.ln_f.bias": P["ln_f_b"]}
    for l in range(cfg.layers):
        p = lambda n: P[f"h{l}.{n}"]
        h = f"transformer.h.{l}."
        sd.update({
            h + "ln_1.weight": p("ln1_g"), h + "ln_1.bias": p("ln1_b"),
            h + "attn.c_attn.weight": np.concatenate([p("Wq"), p("Wk"), p("Wv")], axis=1),
            h + "attn.c_attn.bias": np.concatenate([p("bq"), p("bk"), p("bv")]),
            h + "attn.c_proj.weight": p("Wo"), h + "attn.c_proj.bias": p("bo"),
            h + "ln_2.weight": p("ln2_g"), h + "ln_2.bias": p("ln2_b"),
            h + "mlp.c_fc.weight": p("fc_in_W"), h + "mlp.c_fc.bias": p("fc_in_b"),
            h + "mlp.c_proj.weight": p("fc_out_W"), h + "mlp.c_proj.bias": p("fc_out_b"),
        })
    return {k: np.ascontiguousarray(v, np.float32) for k, v in sd.items()}


def export_hf(ck: Checkpoint, out_dir):
    from safetensors.numpy import save
    cfg = ck.cfg
    d = Path(out_dir)
    if d.exists() and not d.is_dir():
        raise CheckpointError(f"{out_dir} exists and is not a directory")
    d.mkdir(parents=True, exist_ok=True)
    config = {
        "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
        "vocab_size": cfg.vocab, "n_positions": cfg.ctx, "n_ctx": cfg.ctx, "n_embd": cfg.d_model,
        "n_layer": cfg.layers, "n_head": cfg.heads, "n_inner": cfg.d_mlp,
        "activation_function": "gelu",  # exact erf GELU, as trained
        "layer_norm_epsilon": 1e-5, "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0,
        "initializer_range": 0.02, "tie_word_embeddings": True, "scale_attn_weights": True,
        "bos_token_id": 50256 if cfg.vocab == 50257 else 0, "eos_token_id": 50256 if cfg.vocab == 50257 else 0,
        "torch_dtype": "float32",
    }
    atomic_write(d / "config.json", json.dumps(config, indent=2).encode())
    atomic_write(d / "model.safetensors", save(hf_state(ck), metadata={"format": "pt"}))
