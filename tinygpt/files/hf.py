"""Hugging Face GPT-2 directories: export (tinygpt export, hf format) and import
(`tinygpt import-hf`), so that a GPT2LMHeadModel can be fine-tuned here and go back.

Names: GPT2LMHeadModel's Conv1D weights are [in, out] like ours; c_attn holds q | k | v side by
side. Import reads config.json and model.safetensors with every size checked before anything is
read or allocated (the safetensors header, each tensor's dtype, shape and byte range), and
refuses, in one line, what this architecture cannot hold.
"""
from __future__ import annotations

import json
import math
import os
import shutil
import struct
import tempfile
from pathlib import Path

import numpy as np

from .checkpoint import Checkpoint, CheckpointError, show, tokenizer_name
from ..core.config import MAX_DIMS, MAX_PARAMS, Config, n_params, param_shapes
from ..core.fs import atomic_write, check_regular, creation_mode, read_user_file
from .. import tokenizers
from .data import progress
from ..tokenizers import get_tokenizer
from .hf_tokenizer import read_tokenizer, tokenizer_files
from .outputs import WRITER

DTYPES = {"F32": (np.float32, 4), "F16": (np.float16, 2), "BF16": (None, 2)}
MODEL_TYPE, ARCHITECTURE = "gpt2", "GPT2LMHeadModel"      # the one Hugging Face architecture (a model, not a tokenizer)


def hf_state(ck: Checkpoint) -> dict:
    """GPT2LMHeadModel's names for our parameters."""
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


def check_gpt2(cfg: Config, what: str = "the model"):
    """What Hugging Face's GPT-2 cannot compute is refused before anything is written: it has no
    sliding window (a window of ctx or more is plain attention and exports as such) and its block
    is GPT-2's (core.block)."""
    if cfg.attn_window:
        raise CheckpointError(f"{what} attends through a sliding window (slidingWindow {cfg.window}), which "
                              "Hugging Face's GPT-2 does not compute; export it as tinygpt or safetensors instead")
    if not cfg.block.gpt2:
        raise CheckpointError(f"{what}'s block ({cfg.block.describe()}) is not GPT-2's, the one architecture this "
                              "tinygpt exports to Hugging Face so far; export it as tinygpt or safetensors instead")


def export_hf(ck: Checkpoint, out_dir, what: str = "the model", tokenizer_file: str | None = None) -> list:
    """A GPT2LMHeadModel directory: config.json, model.safetensors, the tokenizer's files and
    generation_config.json (hf_tokenizer), which transformers' pipelines use as they are.
    Returns the names of the files written."""
    check_gpt2(ck.cfg, what)
    d = Path(out_dir)
    if d.exists() and not d.is_dir():
        raise CheckpointError(f"{out_dir} exists and is not a directory")
    name = tokenizer_name(ck.extra, ck.cfg.vocab)
    files = tokenizer_files(get_tokenizer(name, tokenizer_file), ck.cfg)
    d.parent.mkdir(parents=True, exist_ok=True)
    files = {**files, **model_files(ck)}
    write_directory(d, files)      # config.json last: it names the rest
    return sorted(files)


def model_files(ck: Checkpoint) -> dict:
    """config.json and model.safetensors of a GPT2LMHeadModel, as bytes."""
    from safetensors.numpy import save
    cfg = ck.cfg
    config = {
        "architectures": [ARCHITECTURE], "model_type": MODEL_TYPE,
        "vocab_size": cfg.vocab, "n_positions": cfg.ctx, "n_ctx": cfg.ctx, "n_embd": cfg.d_model,
        "n_layer": cfg.layers, "n_head": cfg.heads, "n_inner": cfg.d_mlp,
        "activation_function": "gelu_new" if cfg.activation == "gelu_tanh" else "gelu",   # the model's own
        "layer_norm_epsilon": 1e-5, "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0,
        "initializer_range": 0.02, "tie_word_embeddings": True, "scale_attn_weights": True,
        "bos_token_id": 50256 if cfg.vocab == 50257 else 0, "eos_token_id": 50256 if cfg.vocab == 50257 else 0,
        "torch_dtype": "float32",
        "tinygpt_writer": WRITER,   # marks the directory's files as ours to replace
    }
    return {"model.safetensors": save(hf_state(ck), metadata={"format": "pt", "writer": WRITER}),
            "config.json": json.dumps(config, indent=2).encode()}


def write_directory(d: Path, files: dict):
    """The files whole in d, or none of them: built in a directory beside d and moved in. A new d
    is one rename; into an existing one (which may hold the user's other files) each file is
    renamed in once all are whole, the weights first, so config.json never names weights that
    are not there."""
    tmp = Path(tempfile.mkdtemp(prefix=".tinygpt-", dir=d.parent if str(d.parent) else "."))
    try:
        os.chmod(tmp, creation_mode(d, 0o777))     # a new d is tmp renamed: the umask's mode, not 0700
        for name, data in files.items():
            atomic_write(tmp / name, data)
        if d.is_dir() and not any(d.iterdir()):
            d.rmdir()                      # an empty directory (made when the output was claimed): new
        if not d.exists():
            os.rename(tmp, d)
            return
        for name in files:
            os.replace(tmp / name, d / name)
    except OSError as e:
        failed = d / Path(e.filename).name if e.filename else d
        raise OSError(e.errno, e.strerror, str(failed)) from e
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# ---- import ----------------------------------------------------------------------------------------
def _field(c: dict, key: str, default, kind, label: str):
    """A number of config.json by name: present (or defaulted), a JSON number of the right kind."""
    if c.get(key) is None:
        if default is None:
            raise CheckpointError(f"{label}: no {key}; a GPT-2 config.json has one")
        return default
    v = c[key]
    number = isinstance(v, (int, float)) and not isinstance(v, bool)
    if not number or not (isinstance(v, int) or math.isfinite(v)) or (kind is int and v != int(v)):
        raise CheckpointError(f"{label}: {key} is {show(v)}; expected {'a whole' if kind is int else 'a finite'} "
                              "number")
    return kind(v)


# Hugging Face's activation_function names for the two GELUs this architecture computes
HF_ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh"}


def _config(d: Path) -> Config:
    label = f"{d}/config.json"
    raw = read_user_file(d / "config.json", CheckpointError, label, "a GPT2LMHeadModel's config.json", 1 << 20)
    try:
        c = json.loads(raw)
        assert isinstance(c, dict)
    except (ValueError, AssertionError, RecursionError) as e:
        raise CheckpointError(f"{label} is not a JSON object (or nests too deeply); give a Hugging Face model "
                              "directory") from e
    arch = c.get("architectures") or [ARCHITECTURE]
    if c.get("model_type", MODEL_TYPE) != MODEL_TYPE or ARCHITECTURE not in arch:
        raise CheckpointError(f"{label}: a {c.get('model_type')} / {', '.join(map(str, arch))} model; "
                              "tinygpt imports GPT2LMHeadModel only")
    act = c.get("activation_function", "gelu_new")           # GPT2Config's default: GPT-2's own
    if not isinstance(act, str) or act not in HF_ACTIVATIONS:
        raise CheckpointError(f"{label}: activation {show(act)}; this architecture computes "
                              f"{', '.join(HF_ACTIVATIONS)} only")
    if c.get("tie_word_embeddings", True) is not True:
        raise CheckpointError(f"{label}: the head is not tied to the token embedding; this architecture ties them")
    eps = _field(c, "layer_norm_epsilon", 1e-5, float, label)
    if abs(eps - 1e-5) > 1e-12:
        raise CheckpointError(f"{label}: LayerNorm epsilon {eps:g}; this architecture uses 1e-5")
    for k in ("scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn"):
        if c.get(k):
            raise CheckpointError(f"{label}: {k} is set; this architecture has no such variant")
    if c.get("scale_attn_weights", True) is not True:
        raise CheckpointError(f"{label}: attention without the 1/sqrt(head dim) scale; this architecture scales")
    C = _field(c, "n_embd", None, int, label)
    cfg = Config(layers=_field(c, "n_layer", None, int, label), d_model=C, heads=_field(c, "n_head", None, int, label),
                 ctx=_field(c, "n_positions", None, int, label), d_mlp=_field(c, "n_inner", 4 * C, int, label),
                 vocab=_field(c, "vocab_size", None, int, label), batch=1, activation=HF_ACTIVATIONS[act])
    if tokenizers.by_vocab(cfg.vocab) is None:
        known = ", ".join(f"{v:,} ({n})" for v, n in tokenizers.BY_VOCAB.items())
        raise CheckpointError(f"{label}: vocabulary {cfg.vocab:,}; tinygpt has tokenizers for {known} only")
    for name, most in MAX_DIMS.items():
        v = getattr(cfg, name)
        if not 0 < v <= most:
            raise CheckpointError(f"{label}: {name} {v} is out of range (1 to {most:,})")
    if cfg.d_model % cfg.heads or cfg.d_model // cfg.heads > 128:
        raise CheckpointError(f"{label}: n_embd {cfg.d_model} / n_head {cfg.heads}: heads must divide the width "
                              "into head dims of at most 128")
    if n_params(cfg) > MAX_PARAMS:
        raise CheckpointError(f"{label}: {n_params(cfg):,} parameters, more than tinygpt holds ({MAX_PARAMS:,})")
    return cfg


def _safetensors(path: Path, cfg: Config):
    """(header, data offset) of a safetensors file whose size agrees with the config."""
    label = str(path)
    st = check_regular(path, CheckpointError, label, "the directory's model.safetensors")
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


class _Tensors:
    """The tensors of a GPT-2 model.safetensors, by their names without "transformer.", each
    checked against the shape the config gives it; `used` records which were read."""

    def __init__(self, path: Path, cfg: Config):
        self.path = path
        self.header, self.data0, self.size = _safetensors(path, cfg)
        self.names = {k[len("transformer."):] if k.startswith("transformer.") else k: k
                      for k in self.header if k != "__metadata__"}
        self.used = set()
        self.bar = None         # a progress bar, updated by each tensor's bytes

    def __call__(self, name: str, shape: tuple) -> np.ndarray:
        path, key = self.path, self.names.get(name)
        if key is None:
            raise CheckpointError(f"{path}: no tensor {name}; the model is incomplete or not a GPT-2")
        t = self.header[key]
        if not isinstance(t, dict):
            raise CheckpointError(f"{path}: the header's entry for {key} is {show(t)}, not an object with dtype, "
                                  "shape and data_offsets; the file is damaged")
        self.used.add(key)
        try:
            dtype, width = DTYPES[t["dtype"]]
            b0, b1 = (int(x) for x in t["data_offsets"])
            got = tuple(int(s) for s in t["shape"])
        except (KeyError, TypeError, ValueError) as e:
            raise CheckpointError(f"{path}: tensor {key} has a dtype tinygpt does not read ({t.get('dtype')}), or "
                                  "a malformed entry; F32, F16 and BF16 are read") from e
        if got != shape:
            raise CheckpointError(f"{path}: {key} has shape {list(got)}, the config says {list(shape)}")
        if not 0 <= b0 <= b1 <= self.size - self.data0 or b1 - b0 != width * int(np.prod(shape)):
            raise CheckpointError(f"{path}: {key}'s bytes lie outside the file or disagree with its shape")
        with open(path, "rb") as f:
            f.seek(self.data0 + b0)
            raw = f.read(b1 - b0)
        if len(raw) != b1 - b0:
            raise CheckpointError(f"{path}: the file ends inside {key}; it is truncated")
        if self.bar is not None:
            self.bar.update(len(raw))
        if dtype is None:   # bfloat16: the top half of a float32
            a = (np.frombuffer(raw, np.uint16).astype(np.uint32) << 16).view(np.float32)
        else:
            a = np.frombuffer(raw, dtype).astype(np.float32)
        return a.reshape(shape)

    def left(self) -> list:
        """What the config does not account for (a config.json over another model's weights)."""
        return sorted(k for n, k in self.names.items() if k not in self.used and n != "lm_head.weight"
                      and not (n.endswith(".attn.bias") or n.endswith(".attn.masked_bias")))   # GPT-2's masks


def _block_params(read: _Tensors, l: int, C: int, M: int) -> dict:
    """Block l's parameters under our names, GPT-2's fused c_attn split into q, k, v."""
    h = f"h.{l}."
    qkv_w, qkv_b = read(h + "attn.c_attn.weight", (C, 3 * C)), read(h + "attn.c_attn.bias", (3 * C,))
    p = {"ln1_g": read(h + "ln_1.weight", (C,)), "ln1_b": read(h + "ln_1.bias", (C,)),
         "Wq": qkv_w[:, :C], "Wk": qkv_w[:, C:2 * C], "Wv": qkv_w[:, 2 * C:],
         "bq": qkv_b[:C], "bk": qkv_b[C:2 * C], "bv": qkv_b[2 * C:],
         "Wo": read(h + "attn.c_proj.weight", (C, C)), "bo": read(h + "attn.c_proj.bias", (C,)),
         "ln2_g": read(h + "ln_2.weight", (C,)), "ln2_b": read(h + "ln_2.bias", (C,)),
         "fc_in_W": read(h + "mlp.c_fc.weight", (C, M)), "fc_in_b": read(h + "mlp.c_fc.bias", (M,)),
         "fc_out_W": read(h + "mlp.c_proj.weight", (M, C)), "fc_out_b": read(h + "mlp.c_proj.bias", (C,))}
    return {f"h{l}.{k}": np.ascontiguousarray(v) for k, v in p.items()}


BAR_FROM_BYTES = 64 << 20      # smaller files read or write in a moment: a bar then only on a terminal


def _read_all(read: _Tensors, cfg: Config) -> dict:
    """Every parameter from the file, each checked as it is read."""
    C, M, V, T = cfg.d_model, cfg.d_mlp, cfg.vocab, cfg.ctx
    P = {"tok_emb": read("wte.weight", (V, C)), "pos_emb": read("wpe.weight", (T, C)),
         "ln_f_g": read("ln_f.weight", (C,)), "ln_f_b": read("ln_f.bias", (C,))}
    if "lm_head.weight" in read.names and not np.array_equal(read("lm_head.weight", (V, C)), P["tok_emb"]):
        raise CheckpointError(f"{read.path}: lm_head.weight differs from the token embedding; this architecture "
                              "ties them")
    for l in range(cfg.layers):
        P.update(_block_params(read, l, C, M))
    return P


def import_hf(directory, quiet: bool = True) -> Checkpoint:
    """A Hugging Face GPT2LMHeadModel directory as a fresh .tinygpt checkpoint (zero moments);
    quiet=False: a progress bar over the weights' bytes (a large model's)."""
    d = Path(directory)
    if not d.is_dir():
        raise CheckpointError(f"{directory} is not a directory; give a directory with config.json and "
                              "model.safetensors")
    cfg = _config(d)
    path = d / "model.safetensors"
    read = _Tensors(path, cfg)
    read.bar = progress(read.size - read.data0, "reading the weights", disable=quiet, shown_from=BAR_FROM_BYTES)
    try:
        P = _read_all(read, cfg)
    finally:
        read.bar.close()
    left = read.left()
    if left:
        more = f" and {len(left) - 3} more" if len(left) > 3 else ""
        raise CheckpointError(f"{path}: tensors its config.json does not account for: {', '.join(left[:3])}{more}; "
                              f"the config (n_layer {cfg.layers}, n_embd {cfg.d_model}) and the weights disagree")
    bad = [n for n, a in P.items() if not np.all(np.isfinite(a))]
    if bad:
        raise CheckpointError(f"{path}: {bad[0]} holds nan or inf")
    zeros = {n: np.zeros(shape, np.float32) for n, shape, _ in param_shapes(cfg)}
    tok = read_tokenizer(d, cfg.vocab) or tokenizers.by_vocab(cfg.vocab)
    extra = {"tokenizer": tok, "importedFrom": str(d)}
    if tokenizers.kind(tok).source:
        extra["tokenizerSource"] = tokenizers.kind(tok).source
    return Checkpoint(cfg, P, zeros, {n: z.copy() for n, z in zeros.items()}, 0, [], extra)
