"""The .tinygpt file of TinyGPT's browser app, read and written as upstream's readers expect, and exports.

    4 bytes  "TGPT"
    4 bytes  uint32 LE version (1 or 2; we write 2, and 3 for a block other than GPT-2's)
    4 bytes  uint32 LE length N of the JSON header
    N bytes  UTF-8 JSON header
    rest     the state: int32 LE step, then the weights in the layout `weightDtype` and
             `includesOptimizerState` name (LAYOUTS below)

The header is upstream's: its field names and types (`finalLoss` an object, `bestVal` an object,
`savedAt`, `sample`, `corpus`), its manifest names with PyTorch-style shapes ([out, in]) over
bytes stored [in, out], offsets counted in the weights-only view. Fields this port adds live
under "tinygptPy", which upstream ignores; upstream fields we do not use are kept through a
resume. Upstream architecture fields we do not compute are refused, never ignored.

A model whose block is not GPT-2's (core.block: RMSNorm, RoPE, ReLU²) is written as version 3,
with its parts in the config (norm, position, ropeTheta, normEps, activation). Upstream's readers
(its playground's decodeModelFile, its python_ref/load_tinygpt.py) refuse any version but 1 and
2, so neither loads such a file as the GPT-2 block it is not; ours reads all three.
Nothing here unpickles or evaluates anything from a file, and every size is checked by
arithmetic before anything is read or allocated. Writes are atomic (core.fs.atomic_write).
"""
from __future__ import annotations

import datetime
import json
import math
import os
import struct
from dataclasses import dataclass, field

import numpy as np

from ..core.block import BIASES, MLPS, NORM_EPS, NORMS, POSITIONS, QK_NORMS, ROPE_THETA, UPSTREAM_MLP
from ..core.config import Config, n_params, own_head_dim, param_shapes
from ..core.errors import TinyGPTError
from ..core.rope import SCALINGS
from ..core.fs import atomic_write, atomic_write_pieces, available_memory, check_regular
from .. import tokenizers
from .outputs import WRITER

MAGIC = b"TGPT"
VERSION = 2
MODERN_VERSION = 3      # a block upstream does not compute: its readers refuse the version


def file_version(cfg: Config, dtype: str = "fp32") -> int:
    """2, upstream's; 3 where its readers must refuse the file: a block they do not compute, or bf16
    weights (a weightDtype they do not know, which a reader that defaults to fp32 would misread)."""
    return VERSION if cfg.block.gpt2 and dtype != "bf16" else MODERN_VERSION


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
    weight_dtype: str = "fp32"                      # how the file stored the weights
    adam_moments: bool = True                       # an fp32 file's state holds the two moment slots (zeros
                                                    # where m is None: optim_state says what they hold);
                                                    # False: weights alone (files before issue 47)


# ---- upstream's names: the file's manifest and the safetensors export ---------------------------
_BLOCK_NAMES = {"ln1_g": "ln1.weight", "ln1_b": "ln1.bias", "Wq": "attn.q_proj.weight", "bq": "attn.q_proj.bias",
                "Wk": "attn.k_proj.weight", "bk": "attn.k_proj.bias", "Wv": "attn.v_proj.weight",
                "bv": "attn.v_proj.bias", "Wo": "attn.o_proj.weight", "bo": "attn.o_proj.bias",
                "q_norm_g": "attn.q_norm.weight", "k_norm_g": "attn.k_norm.weight",
                "ln2_g": "ln2.weight", "ln2_b": "ln2.bias", "fc_in_W": "mlp.fc_in.weight",
                "fc_gate_W": "mlp.fc_gate.weight", "fc_gate_b": "mlp.fc_gate.bias",
                "fc_in_b": "mlp.fc_in.bias", "fc_out_W": "mlp.fc_out.weight", "fc_out_b": "mlp.fc_out.bias"}
_TOP_NAMES = {"tok_emb": "token_embedding.weight", "pos_emb": "position_embedding.weight", "lm_head": "lm_head.weight",
              "ln_e_g": "ln_embed.weight", "ln_e_b": "ln_embed.bias",
              "ln_f_g": "ln_final.weight", "ln_f_b": "ln_final.bias"}
# stored [in, out]; PyTorch names them [out, in]
_LINEAR = {"Wq", "Wk", "Wv", "Wo", "fc_gate_W", "fc_in_W", "fc_out_W"}


def upstream_name(name: str) -> tuple[str, bool]:
    """(upstream's name for one of our parameters, whether PyTorch's shape is ours transposed)."""
    if name in _TOP_NAMES:
        return _TOP_NAMES[name], False
    block, _, short = name.partition(".")
    return f"blocks.{block[1:]}.{_BLOCK_NAMES[short]}", short in _LINEAR


def manifest(cfg: Config) -> list[dict]:
    """Upstream's manifest: names, PyTorch-style shapes, offsets in floats in the weights-only
    view (the weights end to end, the step excluded), in storage order."""
    out, off = [], 0
    for name, shape, _ in param_shapes(cfg):
        theirs, flip = upstream_name(name)
        out.append({"name": theirs, "shape": list(shape[::-1] if flip else shape), "floatOffset": off})
        off += math.prod(shape)
    return out


def _check_manifest(entries, cfg: Config, what: str):
    """A manifest must list what the config stores, in its order: upstream's names and shapes,
    or the internal names and [in, out] shapes this port wrote before."""
    if not isinstance(entries, list):
        raise CheckpointError(f"{what}: the header's manifest is not a list")
    shapes = param_shapes(cfg)
    if len(entries) != len(shapes):
        raise CheckpointError(f"{what}: the manifest lists {len(entries):,} tensors where its config stores "
                              f"{len(shapes):,}; the file is inconsistent")
    for i, (e, (name, shape, _)) in enumerate(zip(entries, shapes)):
        theirs, flip = upstream_name(name)
        ok = {(theirs, tuple(shape[::-1] if flip else shape)), (name, tuple(shape))}
        got = (e.get("name"), tuple(e.get("shape") or ())) if isinstance(e, dict) else (None, ())
        if got not in ok:
            raise CheckpointError(f"{what}: manifest entry {i} is {show(e)}, where its config stores {theirs} "
                                  f"{list(shape[::-1] if flip else shape)}; the file is inconsistent")


def show(v, most: int = 80) -> str:
    """A value read from a file, in one bounded line."""
    s = json.dumps(v, ensure_ascii=True) if not isinstance(v, str) else repr(v)
    return s if len(s) <= most else s[:most - 3] + "..."


# ---- the header's config ---------------------------------------------------------------------
# Upstream architecture fields (its Mac app's) that change what the model computes: a file that
# sets one is refused, naming it, instead of being evaluated as the plain GPT it is not.
UNSUPPORTED = {"nExperts": "a mixture of experts",
               "useMoD": "mixture of depths", "useDifferentialAttention": "differential attention",
               "useYOCO": "YOCO's cross-decoder layers", "useDeepNorm": "DeepNorm residuals",
               "useEmbeddingRMSNorm": "an RMSNorm after the embedding",
               # its Mac app's modern parts: not yet mapped onto ours (norm, position, ...), so refused
               "useRoPE": "its rotary positions", "useRMSNorm": "its RMSNorm", "useSwiGLU": "a SwiGLU MLP",
               "useQKNorm": "QK-norm"}


def _inactive(key: str, v) -> bool:
    return v is None or v is False or v == 0 or (key == "nExperts" and v == 1)


def config_to_header(cfg: Config, tokenizer_source: str | None = None) -> dict:
    c = {"layers": cfg.layers, "dModel": cfg.d_model, "ctx": cfg.ctx, "heads": cfg.heads, "dMlp": cfg.d_mlp,
         "batchSize": cfg.batch, "learningRate": cfg.lr, "gradClip": cfg.grad_clip, "seed": cfg.seed}
    if cfg.vocab != 256:
        c["vocabSize"] = cfg.vocab
        c["tokenizerSource"] = tokenizer_source or "r50k_base"
    if cfg.block.mlp is not UPSTREAM_MLP:     # only where it is not TinyGPT's exact GELU, as vocabSize
        c["activation"] = cfg.activation
    if cfg.window:                    # upstream's field: each query attends to its last N positions
        c["slidingWindow"] = cfg.window
    blk = cfg.block
    if not blk.gpt2:                  # the parts of a version-3 file (file_version)
        c.update({"norm": blk.norm.name, "position": blk.position.name, "normEps": blk.eps, "bias": blk.bias.name,
                  "tiedHead": blk.tied, "qkNorm": blk.qk_norm.name, "kvHeads": blk.heads.kv,
                  "logitSoftcap": blk.softcap, "embedNorm": blk.embed_norm})
        if blk.position.rotary:
            c["ropeTheta"] = blk.rope_theta
            if cfg.rope_scaling:
                c["ropeScaling"] = dict(cfg.rope_scaling)
        if blk.heads.apart:           # q's width heads x headDim, not dModel
            c["headDim"] = blk.heads.hd
    return c


def _number(c: dict, key: str, default, kind, what: str):
    v = c.get(key, default)
    if v is None and default is not None:
        v = default
    number = isinstance(v, (int, float)) and not isinstance(v, bool)
    if not number or not (isinstance(v, int) or math.isfinite(v)) or (kind is int and v != int(v)):
        need = "a whole number" if kind is int else "a finite number"
        raise CheckpointError(f"{what}: the header's config.{key} is {show(v)}; expected {need}")
    return kind(v)


def rope_scaling_of(v, what: str) -> dict | None:
    """A scaled RoPE's fields as core.rope takes them ({"rope_type": linear | llama3, its numbers}),
    each checked; None where there is none."""
    if v is None:
        return None
    kind = v.get("rope_type") if isinstance(v, dict) else None
    if kind not in SCALINGS:
        raise CheckpointError(f"{what}: a RoPE scaling of {show(v)}; tinygpt computes {', '.join(SCALINGS)}")
    out = {"rope_type": kind}
    for key in SCALINGS[kind]:
        x = v.get(key)
        if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) or x <= 0:
            raise CheckpointError(f"{what}: the RoPE scaling's {key} is {show(x)}; expected a positive number")
        out[key] = float(x)
    if kind == "llama3" and out["high_freq_factor"] <= out["low_freq_factor"]:
        raise CheckpointError(f"{what}: the RoPE scaling's high_freq_factor must be above its low_freq_factor")
    return out


def config_from_header(c: dict, what: str = "the file") -> Config:
    for key, meaning in UNSUPPORTED.items():
        if not _inactive(key, c.get(key)):
            raise CheckpointError(f"{what}: its config sets {key} {show(c.get(key))} ({meaning}), which this "
                                  "tinygpt does not compute; it cannot evaluate, sample or train this model")
    for key in ("layers", "dModel", "heads", "ctx"):
        if key not in c:
            raise CheckpointError(f"{what}: the header's config has no {key}")
    d_model = _number(c, "dModel", None, int, what)
    window = _number(c, "slidingWindow", 0, int, what)        # upstream's: each query sees its last N positions
    if window < 0:
        raise CheckpointError(f"{what}: the header's config.slidingWindow is {window}; expected 0 (none) or more")
    parts = {}
    for key, name, table in (("activation", "activation", MLPS), ("norm", "norm", NORMS),
                             ("position", "position", POSITIONS), ("bias", "bias", BIASES),
                             ("qkNorm", "qk_norm", QK_NORMS)):
        parts[name] = c.get(key, next(iter(table)))           # GPT-2's where absent
        if not isinstance(parts[name], str) or parts[name] not in table:
            raise CheckpointError(f"{what}: its config sets {key} {show(parts[name])}, which this tinygpt does not "
                                  f"compute ({', '.join(table)}); it cannot evaluate, sample or train this model")
    for key, meaning in (("attnBias", "attention projections without biases"), ("tieEmbeddings", "an untied head")):
        if c.get(key, True) is not True:             # its Mac app's GPT-2 values are true
            raise CheckpointError(f"{what}: its config sets {key} {show(c.get(key))} ({meaning} as its Mac app "
                                  "computes them), which this tinygpt does not read yet; it cannot evaluate, sample "
                                  "or train this model")
    their_kv = c.get("nKvHeads")          # its Mac app's grouped-query attention: refused until mapped onto ours
    if not _inactive("nKvHeads", their_kv) and their_kv != c.get("heads"):
        raise CheckpointError(f"{what}: its config sets nKvHeads {show(their_kv)} (grouped-query attention as its "
                              "Mac app computes it), which this tinygpt does not read yet; it cannot evaluate, "
                              "sample or train this model")
    flags = {key: c.get(key, default) for key, default in (("tiedHead", True), ("embedNorm", False))}
    for key, v in flags.items():
        if not isinstance(v, bool):
            raise CheckpointError(f"{what}: the header's config.{key} is {show(v)}; expected true or false")
    cfg = Config(layers=_number(c, "layers", None, int, what), d_model=d_model,
                 heads=_number(c, "heads", None, int, what), ctx=_number(c, "ctx", None, int, what),
                 batch=_number(c, "batchSize", 16, int, what), d_mlp=_number(c, "dMlp", 4 * d_model, int, what),
                 vocab=_number(c, "vocabSize", 256, int, what), lr=_number(c, "learningRate", 3e-4, float, what),
                 grad_clip=_number(c, "gradClip", 1.0, float, what), seed=_number(c, "seed", 0, int, what),
                 window=window, rope_theta=_number(c, "ropeTheta", ROPE_THETA, float, what),
                 norm_eps=_number(c, "normEps", NORM_EPS, float, what), tied=flags["tiedHead"],
                 embed_norm=flags["embedNorm"], softcap=_number(c, "logitSoftcap", 0.0, float, what),
                 kv_heads=_number(c, "kvHeads", 0, int, what), head_dim=_number(c, "headDim", 0, int, what), **parts)
    cfg.rope_scaling = rope_scaling_of(c.get("ropeScaling"), what)
    if cfg.kv_heads == cfg.heads:       # one a query head: the default's value
        cfg.kv_heads = 0
    cfg.head_dim = own_head_dim(cfg.d_model, cfg.heads, cfg.head_dim)
    try:
        cfg.validate()
    except ValueError as e:
        raise CheckpointError(f"{what}: the header's config is invalid: {e}") from e
    return cfg


# ---- the state's layouts ---------------------------------------------------------------------
INT4_BLOCK = 64                 # upstream's default int4BlockSize
MAX_INT4_BLOCK = 1 << 16


def _int4_blocks(cfg: Config, block: int) -> int:
    return sum(-(-math.prod(shape) // block) for _, shape, _ in param_shapes(cfg))


def to_bf16(a: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bits (uint16): the nearest, ties to even; NaN stays a NaN."""
    u = np.ascontiguousarray(a, np.float32).view(np.uint32)
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(np.isnan(a), np.uint16(0x7FC0), rounded)


def state_bytes(cfg: Config, dtype: str, with_opt: bool, block: int = INT4_BLOCK) -> int:
    """Bytes of the state, step included, for a layout (LAYOUTS), by arithmetic."""
    n = n_params(cfg)
    if dtype == "fp32":
        return 4 + 4 * n * (3 if with_opt else 1)
    if dtype in ("fp16", "bf16"):
        return 4 + 2 * n
    blocks = _int4_blocks(cfg, block)
    return 4 + 2 * blocks + blocks * block // 2


LAYOUTS = {   # weightDtype: what the state holds after the step
    "fp32": "per tensor its weights and two moment slots (AdamW's m and v: optim_state) as float32, or the "
            "weights alone without optimizer state",
    "fp16": "every weight as float16, tensors end to end in manifest order (weights only)",
    "bf16": "every weight as bfloat16 (a float32's high half, rounded to nearest even), tensors end to end "
            "in manifest order (weights only; this trainer's, in a version 3 file)",
    "int4": "every tensor's float16 block scales, then every tensor's 4-bit values, two a byte (weights only)",
}


def _finite(v):
    """A loss as JSON can hold it (and JavaScript's JSON.parse reads it): null for nan and inf."""
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def _history(h) -> list:
    """Upstream's lossHistory points, {step, train, val}, val null where not measured."""
    return [{"step": p.get("step"), "train": _finite(p.get("train")), "val": _finite(p.get("val"))}
            for p in h if isinstance(p, dict)]


def _losses(history: list, kept: dict) -> tuple[dict | None, dict | None]:
    """(finalLoss, bestVal) as upstream writes them: the last point, and the lowest val seen."""
    final = None
    if history:
        last = history[-1]
        final = {"step": last.get("step"), "train": last.get("train"), "val": last.get("val")}
    vals = [p for p in history if isinstance(p.get("val"), (int, float))]
    best = kept.get("bestVal") if isinstance(kept.get("bestVal"), dict) else None
    if vals:
        low = min(vals, key=lambda p: p["val"])
        if best is None or not isinstance(best.get("loss"), (int, float)) or low["val"] < best["loss"]:
            best = {"loss": low["val"], "step": low["step"]}
    return final, best


BUILTIN_CORPUS = "tinygpt built-in: Python's reference documentation"
EVAL_EVERY = 100        # the header's evalEvery for a run that gave none (options.TrainOptions' default)
# Fields every write computes from the state; a header read keeps the rest.
DERIVED = {"version", "savedAt", "config", "manifest", "includesOptimizerState", "weightDtype", "stateByteLength",
           "lossHistory", "finalLoss", "bestVal", "corpus", "sample", "tinygptPy",
           "int4BlockSize", "int4ScalesBytes", "int4PackedBytes"}


def corpus_name(extra: dict, header: dict):
    """The header's corpus: what another writer put there, kept (upstream's is the training text
    itself, which its playground puts back in its text box), else the data our run read (its
    file name, never a path to open)."""
    if extra.get("corpusKept") and isinstance(header.get("corpus"), str):
        return header["corpus"]
    if "data" in extra:
        return os.path.basename(extra["data"]) if extra["data"] else BUILTIN_CORPUS
    return header.get("corpus")


def now() -> str:
    """The time as upstream's savedAt writes it (ISO 8601, UTC, milliseconds)."""
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def build_header(ck: Checkpoint, dtype: str, saved_at: str | None = None) -> dict:
    cfg, kept = ck.cfg, ck.header
    with_opt = dtype == "fp32" and ck.adam_moments
    kept_config = kept.get("config") if isinstance(kept.get("config"), dict) else {}
    config = {k: v for k, v in kept_config.items() if k not in ("vocabSize", "tokenizerSource")}
    config.update(config_to_header(cfg, ck.extra.get("tokenizerSource") or kept_config.get("tokenizerSource")))
    config.setdefault("backend", "webgpu")
    # upstream's continue loop counts its next evaluation from evalEvery (NaN without it): the
    # run's own interval, or the file's, or ours by default
    every = ck.extra.get("evalEvery")
    if not (isinstance(every, int) and not isinstance(every, bool) and every > 0):
        every = kept_config.get("evalEvery")
        every = every if isinstance(every, int) and not isinstance(every, bool) and every > 0 else EVAL_EVERY
    config["evalEvery"] = every
    total = (ck.extra.get("schedule") or {}).get("total") if isinstance(ck.extra.get("schedule"), dict) else None
    if isinstance(total, int) and total > 0:
        config["maxSteps"] = total
    history = _history(ck.loss_history)
    final, best = _losses(history, kept)
    header = {"version": file_version(cfg, dtype),
              "savedAt": saved_at or kept.get("savedAt") or now(),
              "config": config, "manifest": manifest(cfg), "includesOptimizerState": with_opt,
              "weightDtype": dtype, "stateByteLength": state_bytes(cfg, dtype, with_opt),
              "lossHistory": history, "finalLoss": final,
              "sample": kept.get("sample") if isinstance(kept.get("sample"), str) else "",
              "bestVal": best}
    corpus = corpus_name(ck.extra, kept)
    if corpus is not None:
        header["corpus"] = corpus
    header.update({k: v for k, v in kept.items() if k not in DERIVED})   # another writer's fields
    header["tinygptPy"] = ck.extra
    return header


def encode(ck: Checkpoint, dtype: str = "fp32", saved_at: str | None = None) -> bytes:
    """The file's bytes: fp32 with optimizer state (what training writes), or fp16 weights only
    (the compact form upstream's playground loads)."""
    return b"".join(encode_pieces(ck, dtype, saved_at)[0])


def encode_pieces(ck: Checkpoint, dtype: str = "fp32", saved_at: str | None = None):
    """(the file's bytes as pieces, a tensor at a time, made as they are read; their total length):
    a large model is written without its whole file in memory."""
    cfg = ck.cfg
    header = build_header(ck, dtype, saved_at)
    with_opt = header["includesOptimizerState"]
    hbytes = json.dumps(header, separators=(",", ":"), allow_nan=False).encode("utf-8")
    head = [MAGIC, struct.pack("<II", file_version(cfg, dtype), len(hbytes)), hbytes, struct.pack("<i", int(ck.step))]
    for name, shape, _ in param_shapes(cfg):         # shapes first: nothing is written of a wrong one
        a = ck.params[name]
        if tuple(np.shape(a)) != tuple(shape):
            raise CheckpointError(f"{name} has shape {np.shape(a)}, the config says {tuple(shape)}")

    def tensors():
        yield from head
        for name, shape, _ in param_shapes(cfg):
            for d in ((ck.params, ck.m, ck.v) if with_opt else (ck.params,)):
                a = np.zeros(shape, np.float32) if d is None else np.asarray(d[name], np.float32)
                if a.shape != tuple(shape):
                    raise CheckpointError(f"{name} has shape {a.shape}, the config says {tuple(shape)}")
                if dtype == "fp16":
                    h = a.astype("<f2")
                    if not np.all(np.isfinite(h)) and np.all(np.isfinite(a)):
                        raise CheckpointError(f"{upstream_name(name)[0]} holds values beyond float16's range "
                                              f"(largest {float(np.abs(a).max()):g}, float16 holds 65,504); "
                                              "export it as fp32 instead")
                    yield h.tobytes()
                elif dtype == "bf16":
                    yield to_bf16(a).astype("<u2").tobytes()
                else:
                    yield a.astype("<f4").tobytes()
    return tensors(), sum(map(len, head)) - 4 + state_bytes(cfg, dtype, with_opt)


MAX_HEADER = 256 << 20  # bytes of JSON header we read at most (a long loss history is ~50 bytes a step;
                        # a LoRA run's adapters, tinygpt.files.lora_files, 16 bytes a parameter)
def tokenizer_name(extra: dict, vocab: int) -> str:
    """The tokenizer a file names (ours, under tinygptPy), else TinyGPT's by vocabulary size (its
    BPE, tokenizers.UPSTREAM, for any vocabulary that is not another's)."""
    return extra.get("tokenizer", tokenizers.by_vocab(vocab, tokenizers.UPSTREAM))


def _tokenizer_check(header: dict, extra: dict, cfg: Config, what: str):
    """The file's tokenizer must be one we have, producing its vocabulary: upstream names an
    own BPE by its tokenizerSource, which we name back when we do not have it (a tokenizer that
    lists no sources, the bytes, takes any)."""
    known = ", ".join(f"{n}: {tokenizers.KINDS[n].vocab:,}" for n in tokenizers.NAMES)
    if "tokenizer" not in extra:
        source = header["config"].get("tokenizerSource")
        tail = source.rstrip("/").rsplit("/", 1)[-1] if isinstance(source, str) else None
        k = tokenizers.KINDS.get(tokenizers.by_vocab(cfg.vocab))
        if k is None or (source is not None and k.sources and source not in k.sources and tail not in k.sources):
            raise CheckpointError(f"{what}: its tokenizer ({show(source) if source is not None else 'unnamed'}, "
                                  f"{cfg.vocab:,} tokens) is not one this tinygpt has ({known})")
    tok = tokenizer_name(extra, cfg.vocab)
    k = tokenizers.KINDS.get(tok) if isinstance(tok, str) else None
    if k is not None and not k.choosable:       # one the file carries (an imported model's tokenizer.json)
        if not isinstance(extra.get("tokenizerJson"), str):
            raise CheckpointError(f"{what}: it names a Hugging Face tokenizer but holds no tokenizer.json; the "
                                  "file is inconsistent (import the model again)")
    elif k is None or k.vocab != cfg.vocab:
        known = ", ".join(f"{n} ({tokenizers.KINDS[n].vocab:,})" for n in tokenizers.NAMES)
        raise CheckpointError(f"{what}: its tokenizer {show(tok)} cannot produce its vocabulary of {cfg.vocab:,} "
                              f"tokens (known: {known}); the file is inconsistent")


def _prefix(pre: bytes, size: int, what: str) -> tuple[int, int]:
    """(version, header length) from the first 12 bytes of a file of `size` bytes."""
    if len(pre) < 12:
        raise CheckpointError(f"{what} is too short to be a .tinygpt file ({size} bytes)")
    if pre[:4] != MAGIC:
        raise CheckpointError(f"{what} is not a .tinygpt file (it starts with {pre[:4]!r}, not b'TGPT')")
    version, hlen = struct.unpack("<II", pre[4:12])
    if version not in (1, 2, MODERN_VERSION):
        raise CheckpointError(f"{what} has .tinygpt version {version}; this tinygpt reads versions 1 to 3")
    if 12 + hlen > size:
        raise CheckpointError(f"{what}: its header claims {hlen:,} bytes but the file has {size - 12:,} after the "
                              "prefix; the file is truncated or corrupt")
    if hlen > MAX_HEADER:
        raise CheckpointError(f"{what}: its header claims {hlen:,} bytes, more than the {MAX_HEADER:,} a "
                              ".tinygpt header may have")
    return version, hlen


@dataclass
class Layout:
    """What a header says the state holds, checked against the state's length."""
    dtype: str
    with_opt: bool
    block: int
    nbytes: int


def _layout(version: int, header: dict, cfg: Config, what: str, state_len: int | None = None) -> Layout:
    dtype = header.get("weightDtype", "fp32")
    if dtype not in LAYOUTS:
        raise CheckpointError(f"{what} stores weights as {show(dtype)}; this tinygpt reads "
                              f"{', '.join(LAYOUTS)}")
    # without the field (a version-1 file, or another writer's), upstream's reader takes an fp32
    # state with the moments: so do we, unless the state is exactly the weights alone
    weights_only = state_len is not None and state_len == state_bytes(cfg, dtype, False)
    with_opt = header.get("includesOptimizerState", dtype == "fp32" and not weights_only)
    if not isinstance(with_opt, bool):
        raise CheckpointError(f"{what}: the header's includesOptimizerState is {show(with_opt)}; expected "
                              "true or false")
    if with_opt and dtype != "fp32":
        raise CheckpointError(f"{what}: {dtype} weights with optimizer state is not a layout TinyGPT writes "
                              "(its fp16 and int4 files are weights only)")
    block = header.get("int4BlockSize", INT4_BLOCK) if dtype == "int4" else INT4_BLOCK
    if dtype == "int4" and (isinstance(block, bool) or not isinstance(block, int) or not 2 <= block <= MAX_INT4_BLOCK
                            or block % 2):
        raise CheckpointError(f"{what}: the header's int4BlockSize is {show(block)}; expected an even whole "
                              f"number from 2 to {MAX_INT4_BLOCK:,}")
    lay = Layout(dtype, with_opt, block, state_bytes(cfg, dtype, with_opt, block))
    if dtype == "int4":
        blocks = _int4_blocks(cfg, block)
        for key, want in (("int4ScalesBytes", 2 * blocks), ("int4PackedBytes", blocks * block // 2)):
            if header.get(key) is not None and header[key] != want:
                raise CheckpointError(f"{what}: {key} {show(header[key])} disagrees with its config, which "
                                      f"needs {want:,} bytes")
    return lay


def _header(version: int, hbytes: bytes, state_len: int, what: str):
    """(header, cfg, layout): the config and layout checked by arithmetic against the state's
    length before anything is sized from them."""
    try:
        # NaN and Infinity (another writer's; JSON has neither) read as null, as TinyGPT's own
        # writer (JSON.stringify) writes them: a field kept from the file can always be saved again
        # (kept as NaN, it trained a whole run and then failed the save)
        header = json.loads(hbytes.decode("utf-8"), parse_constant=lambda name: None)
        if not isinstance(header, dict):
            raise ValueError("not an object")
    except RecursionError as e:
        raise CheckpointError(f"{what}: the header nests its JSON too deeply to be a .tinygpt header") from e
    except (UnicodeDecodeError, ValueError) as e:
        raise CheckpointError(f"{what}: the header is not valid JSON ({e})") from e
    if not isinstance(header.get("config"), dict):
        raise CheckpointError(f"{what}: the header has no config")
    cfg = config_from_header(header["config"], what)
    lay = _layout(version, header, cfg, what, state_len)
    declared = header.get("stateByteLength")
    if declared is not None and declared != lay.nbytes:
        raise CheckpointError(f"{what}: stateByteLength {show(declared)} disagrees with its config and weightDtype "
                              f"{lay.dtype}, which need {lay.nbytes:,} bytes")
    if state_len < lay.nbytes:
        raise CheckpointError(f"{what} is truncated: its state has {state_len:,} of {lay.nbytes:,} bytes")
    if state_len > lay.nbytes:
        raise CheckpointError(f"{what} has {state_len - lay.nbytes:,} bytes more state than its config needs")
    if header.get("manifest") is not None:
        _check_manifest(header["manifest"], cfg, what)
    extra = header.get("tinygptPy") or {}
    if not isinstance(extra, dict):
        raise CheckpointError(f"{what}: the header's tinygptPy field is not an object")
    _tokenizer_check(header, extra, cfg, what)
    return header, cfg, lay


def _weights(cfg: Config, lay: Layout, state: bytes):
    """(params, m, v) from the state after its step, as float32 in our [in, out] layout."""
    shapes = param_shapes(cfg)
    params, m, v = {}, ({} if lay.with_opt else None), ({} if lay.with_opt else None)
    if lay.dtype == "int4":
        blocks = _int4_blocks(cfg, lay.block)
        scales = np.frombuffer(state, "<f2", offset=4, count=blocks).astype(np.float32)
        packed = np.frombuffer(state, np.uint8, offset=4 + 2 * blocks, count=blocks * lay.block // 2)
        b0 = 0
        for name, shape, _ in shapes:
            n = math.prod(shape)
            nb = -(-n // lay.block)
            raw = packed[b0 * lay.block // 2:(b0 + nb) * lay.block // 2]
            nib = np.empty(raw.size * 2, np.float32)
            nib[0::2], nib[1::2] = raw & 15, raw >> 4      # element i in the low nibble when i is even
            w = (nib.reshape(nb, lay.block) - 8) * scales[b0:b0 + nb, None]
            params[name] = w.reshape(-1)[:n].reshape(shape)
            b0 += nb
        return params, m, v
    kind = {"fp16": "<f2", "bf16": "<u2"}.get(lay.dtype, "<f4")
    floats = np.frombuffer(state, kind, offset=4, count=n_params(cfg) * (3 if lay.with_opt else 1))
    pos = 0
    for name, shape, _ in shapes:        # a tensor at a time: no float32 copy of the whole state on the way
        n = math.prod(shape)
        for d in ((params, m, v) if lay.with_opt else (params,)):
            raw = floats[pos:pos + n]
            if lay.dtype == "bf16":              # a bfloat16 is the high half of its float32
                d[name] = (raw.astype(np.uint32) << 16).view(np.float32).reshape(shape)
            else:
                d[name] = raw.reshape(shape).astype(np.float32)
            pos += n
    return params, m, v


STREAMED = {"fp32": "<f4", "fp16": "<f2", "bf16": "<u2"}   # the weightDtypes read a tensor at a time


def _read_tensors(f, cfg: Config, lay: Layout, what: str, moments: bool = True):
    """(params, m, v) of an fp32, fp16 or bf16 state, after its step, read from the open file a
    tensor at a time into float32 arrays of their own: no copy of the whole state in memory (a
    bf16 SmolLM2-135M took 1.3 GB to load that way, 0.8 GB so), and the moments freed wherever a
    run drops them. moments=False: the moments are passed over, not read (m, v None)."""
    keep = lay.with_opt and moments
    kind = STREAMED[lay.dtype]
    size = np.dtype(kind).itemsize
    params, m, v = {}, ({} if keep else None), ({} if keep else None)
    for name, shape, _ in param_shapes(cfg):
        for d in ((params, m, v) if lay.with_opt else (params,)):
            if d is None:                       # a moment nobody asked for, skipped
                f.seek(size * math.prod(shape), os.SEEK_CUR)
                continue
            a = np.empty(shape, kind)
            if f.readinto(memoryview(a).cast("B")) != a.nbytes:
                raise CheckpointError(f"{what} changed while being read; try again")
            if lay.dtype == "bf16":              # a bfloat16 is the high half of its float32
                a = (a.astype(np.uint32) << 16).view(np.float32)
            d[name] = a.astype(np.float32, copy=False)
    return params, m, v


def _build(header, cfg, lay: Layout, state: bytes, what: str, weights=None) -> Checkpoint:
    """The checkpoint of a state (its step, then its weights: weights where they were read already)."""
    step = struct.unpack("<i", state[:4])[0]
    if step < 0:
        raise CheckpointError(f"{what}: its state begins with step {step:,}; a step count is never negative")
    params, m, v = weights or _weights(cfg, lay, state)
    extra = header.get("tinygptPy") or {}
    history = header.get("lossHistory")
    history = [p for p in history if isinstance(p, dict)] if isinstance(history, list) else []
    return Checkpoint(cfg, params, m, v, step, history, dict(extra), header, lay.dtype)


def decode(raw: bytes, what: str = "the file") -> Checkpoint:
    version, hlen = _prefix(raw[:12], len(raw), what)
    header, cfg, lay = _header(version, raw[12:12 + hlen], len(raw) - 12 - hlen, what)
    return _build(header, cfg, lay, raw[12 + hlen:], what)


def _head(f, what: str):
    """(header, cfg, layout, the state's length) of an open .tinygpt file, read up to its state."""
    size = os.fstat(f.fileno()).st_size
    version, hlen = _prefix(f.read(12), size, what)
    state_len = size - 12 - hlen
    header, cfg, lay = _header(version, f.read(hlen), state_len, what)
    return header, cfg, lay, state_len


def load(path: str | os.PathLike, label: str | None = None, moments: bool = True) -> Checkpoint:
    """Read a .tinygpt file through one open file (one version of it, whatever replaces its name
    meanwhile): a regular file, its prefix and header checked against its size (and the
    machine's free memory) before the state is read. moments=False (evaluation, sampling, a plan):
    an fp32 file's optimizer moments are passed over, two thirds of its state (m, v None)."""
    what = label or str(path)
    check_regular(path, CheckpointError, what, "a .tinygpt file")
    try:
        with open(path, "rb") as f:
            header, cfg, lay, state_len = _head(f, what)
            # an fp32, fp16 or bf16 file's tensors are read into their arrays; an int4 one's state
            # whole, then converted
            streamed = lay.dtype in STREAMED
            size = np.dtype(STREAMED.get(lay.dtype, "<f4")).itemsize
            skipped = 2 * size * n_params(cfg) if streamed and lay.with_opt and not moments else 0
            need = (state_len - skipped) * 4 // size if streamed else state_len + 12 * n_params(cfg)
            if need > available_memory():
                raise CheckpointError(f"{what}: its {state_len:,} bytes of weights need more memory than is free "
                                      f"({available_memory():,} bytes)")
            state = f.read(4 if streamed else state_len)
            weights = _read_tensors(f, cfg, lay, what, moments) if streamed and len(state) == 4 else None
            rest = f.read(1) if streamed else b""
    except OSError as e:
        raise CheckpointError(f"{what}: cannot read it ({e.strerror}); check its permissions") from e
    if len(state) != (4 if streamed else state_len) or rest or (streamed and weights is None):
        raise CheckpointError(f"{what} changed while being read; try again")
    return _build(header, cfg, lay, state, what, weights)


def tokenizer_of_file(path, label: str | None = None):
    """The tokenizer a .tinygpt file records, reading only its prefix and header (checked as load
    checks them); an imported model's tokenizer.json travels there."""
    what = label or str(path)
    check_regular(path, CheckpointError, what, "a .tinygpt file")
    try:
        with open(path, "rb") as f:
            header, cfg, _, _ = _head(f, what)
    except OSError as e:
        raise CheckpointError(f"{what}: cannot read it ({e.strerror}); check its permissions") from e
    return tokenizers.of_record(header.get("tinygptPy") or {}, cfg.vocab)


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


ENCODED = ("fp32", "fp16", "bf16")   # the weightDtypes encode writes (int4 is the export's: export.py)


def save(path, ck: Checkpoint, dtype: str = "fp32"):
    """Write ck whole under path (atomically, a tensor at a time), stamped with the time of saving."""
    atomic_write_pieces(path, *encode_pieces(ck, dtype, saved_at=now()))


def is_tinygpt(path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == MAGIC
    except OSError:
        return False


# ---- exports -----------------------------------------------------------------------------------
def export_safetensors(ck: Checkpoint, out):
    """The weights under upstream's manifest names, each tensor in PyTorch's layout ([out, in]
    for the linear layers' weights, the shape the manifest gives), so a state dict keyed like
    upstream's python_ref model loads them as they are."""
    from safetensors.numpy import save
    tensors = {}
    for name, _, _ in param_shapes(ck.cfg):
        theirs, flip = upstream_name(name)
        a = np.asarray(ck.params[name], np.float32)
        tensors[theirs] = np.ascontiguousarray(a.T if flip else a)
    atomic_write(out, save(tensors, metadata={"format": "pt", "names": "TinyGPT's manifest names, PyTorch shapes",
                                              "writer": WRITER, "config": json.dumps(config_to_header(ck.cfg))}))
