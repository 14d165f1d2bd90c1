"""A LoRA run's files: its adapters inside the .tinygpt checkpoint, merged weights, and PEFT's format.

The checkpoint of a LoRA run is an ordinary .tinygpt (TinyGPT's readers read it as the base
model, which its state holds bit for bit); the adapters, their AdamW moments, the LoRA settings
and the base's identity live under tinygptPy.lora, each tensor as base64 float32 little-endian:

    {"rank", "alpha", "targets", "biases", "base": sha256 of the base weights, "baseStep",
     "tensors": {name: {"shape": [...], "w": b64, "m": b64, "v": b64}}}

The export's peft format writes Hugging Face PEFT's adapter_config.json and adapter_model.safetensors
for the model its hf format writes (files.hf's architecture of the block). On GPT-2, q, k and v
adapters become one LoRA on its fused c_attn (A stacked, B block-diagonal, its rank and alpha given
by rank_pattern and alpha_pattern so that alpha / rank stays ours); on the Llama family each
matrix is its own module (q_proj ... down_proj), A and B as they are. The adapters option of eval and
sample folds such a directory into a base model, after checking the base is the one the adapters
were trained on.
"""
from __future__ import annotations

import base64
import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .checkpoint import Checkpoint, CheckpointError, show
from ..core.config import Config, n_params
from ..core.fs import check_regular, read_most, read_user_file
from ..core.lora import LoRA, adapter_name, adapter_shapes, base_hash, make_lora, merged
from ..core.errors import TinyGPTError, warn
from .hf import architecture_of, write_directory
from .outputs import WRITER

PEFT_MODULES = {"Wo": "attn.c_proj", "fc_in_W": "mlp.c_fc", "fc_out_W": "mlp.c_proj"}   # c_attn: q | k | v


@dataclass
class LoraState:
    """A LoRA run as its checkpoint records it."""
    lora: LoRA
    params: dict        # the adapters
    m: dict
    v: dict
    base: str           # sha256 of the base weights the adapters were started on
    base_step: int      # the base file's step


def _b64(a: np.ndarray) -> str:
    return base64.b64encode(np.ascontiguousarray(a, "<f4").tobytes()).decode("ascii")


def record(st: LoraState) -> dict:
    """tinygptPy.lora of a checkpoint."""
    d = st.lora.as_dict()
    d.update(base=st.base, baseStep=st.base_step,
             tensors={n: {"shape": list(st.params[n].shape), "w": _b64(st.params[n]), "m": _b64(st.m[n]),
                          "v": _b64(st.v[n])} for n in st.params})
    return d


def read(ck: Checkpoint, what: str) -> LoraState | None:
    """The LoRA run a checkpoint holds (None for a plain model), every field checked."""
    rec = ck.extra.get("lora")
    if rec is None:
        return None
    bad = lambda why: CheckpointError(f"{what}: its LoRA record {why}; the file is damaged or not tinygpt's")
    if not isinstance(rec, dict):
        raise bad("is not an object")
    try:
        lora = make_lora(rec.get("rank"), rec.get("alpha"), rec.get("targets"), rec.get("biases", False),
                         label=f"{what}: its LoRA rank")
    except TinyGPTError as e:
        raise bad(f"holds settings this tinygpt refuses ({e})") from e
    if not isinstance(rec.get("base"), str) or len(rec["base"]) != 64:
        raise bad("names no base model")
    tensors = rec.get("tensors")
    if not isinstance(tensors, dict):
        raise bad("holds no tensors")
    params, m, v = {}, {}, {}
    for name, shape, _ in adapter_shapes(ck.cfg, lora):
        t = tensors.get(name)
        if not isinstance(t, dict) or t.get("shape") != list(shape):
            raise bad(f"lacks {name} {list(shape)}")
        n = math.prod(shape)
        for d, key in ((params, "w"), (m, "m"), (v, "v")):
            try:
                raw = base64.b64decode(t.get(key, ""), validate=True)
            except (ValueError, TypeError) as e:
                raise bad(f"holds {name}.{key} that is not base64") from e
            if len(raw) != 4 * n:
                raise bad(f"holds {len(raw):,} bytes for {name}.{key}, which needs {4 * n:,}")
            d[name] = np.frombuffer(raw, "<f4").reshape(shape).astype(np.float32)
    if len(tensors) != len(params):
        raise bad(f"holds {len(tensors)} tensors where its settings make {len(params)}")
    step = rec.get("baseStep", 0)
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise bad(f"has baseStep {show(step)}")
    return LoraState(lora, params, m, v, rec["base"], step)


def model_params(ck: Checkpoint, what: str, adapters=None) -> dict:
    """The weights a checkpoint computes with: its own, or a LoRA run's base with the adapters
    folded in (evaluation, sampling, inspection and merged exports take these); `adapters`, a
    directory from the export's peft format, folded into the checkpoint as its base instead."""
    finite_weights(ck, what)
    st = read(ck, what)
    if adapters is not None:
        if st is not None:
            raise CheckpointError(f"{what} holds LoRA adapters of its own; give {{opt:adapters}} with the base "
                                  "model they were trained on")
        return read_peft(adapters, ck, f"{{opt:adapters}} {adapters}")
    return ck.params if st is None else merged({**ck.params, **st.params}, ck.cfg, st.lora)


def finite_weights(ck: Checkpoint, what: str):
    """Refuse weights holding NaN or infinity before anything runs on them (such a file evaluated
    to nan without a word, and sample failed inside Python's bytes())."""
    for name, w in ck.params.items():
        bad = int(np.size(w) - np.count_nonzero(np.isfinite(w)))
        if bad:
            raise CheckpointError(f"{what}: its weights {name} hold {bad:,} NaN or infinite value{'s' * (bad > 1)} "
                                  "(the run diverged before this file was saved); use an earlier checkpoint, or "
                                  "train again with a lower {opt:lr}")


# ---- PEFT -----------------------------------------------------------------------------------------
def peft_tensors(cfg: Config, lora: LoRA, adapters: dict) -> tuple[dict, dict, dict]:
    """(tensors under PEFT's keys for the model's architecture, rank_pattern, alpha_pattern)."""
    modules = architecture_of(cfg).peft_modules
    if modules is not None:           # a module per matrix
        return {_module_key(l, modules[W], w): np.ascontiguousarray(adapters[adapter_name(l, W, w)], np.float32)
                for l in range(cfg.layers) for W in lora.targets for w in "AB"}, {}, {}
    R, out, ranks, alphas = lora.rank, {}, {}, {}
    qkv = [W for W in ("Wq", "Wk", "Wv") if W in lora.targets]
    key = lambda l, module, which: f"base_model.model.transformer.h.{l}.{module}.lora_{which}.weight"
    C = cfg.d_model
    for l in range(cfg.layers):
        get = lambda W, which: adapters[adapter_name(l, W, which)]
        if qkv:                         # one LoRA on c_attn [C, 3C]: A stacked, B block-diagonal
            A = np.concatenate([get(W, "A") for W in qkv], axis=0)                 # [n R, C]
            B = np.zeros((3 * C, len(qkv) * R), np.float32)
            for j, W in enumerate(qkv):
                i = ("Wq", "Wk", "Wv").index(W)
                B[i * C:(i + 1) * C, j * R:(j + 1) * R] = get(W, "B")
            out[key(l, "attn.c_attn", "A")], out[key(l, "attn.c_attn", "B")] = A, B
        for W, module in PEFT_MODULES.items():
            if W in lora.targets:
                out[key(l, module, "A")], out[key(l, module, "B")] = get(W, "A"), get(W, "B")
    if len(qkv) > 1:                    # alpha / rank stays ours: n R and n alpha on c_attn
        ranks["c_attn"], alphas["c_attn"] = len(qkv) * R, len(qkv) * lora.alpha
    return {k: np.ascontiguousarray(v, np.float32) for k, v in out.items()}, ranks, alphas


def _module_key(l: int, module: str, which: str) -> str:
    """PEFT's key of a Llama-family layer's module's A or B."""
    return f"base_model.model.model.layers.{l}.{module}.lora_{which}.weight"


def export_peft(ck: Checkpoint, out_dir, what: str) -> list:
    """adapter_config.json and adapter_model.safetensors of a LoRA checkpoint, for the model the
    export's hf format writes of the same file; returns the names written."""
    from safetensors.numpy import save
    architecture_of(ck.cfg, what)
    st = read(ck, what)
    if st is None:
        raise CheckpointError(f"{what} holds no LoRA adapters (it was not trained with {{opt:lora}}); export the "
                              "whole model with {opt:format} hf")
    if st.lora.biases:
        raise CheckpointError(f"{what} trained its biases and LayerNorms beside the adapters, which PEFT's LoRA "
                              "files cannot hold; export the model with {opt:merge} instead")
    tensors, ranks, alphas = peft_tensors(ck.cfg, st.lora, st.params)
    config = peft_config(ck.cfg, st.lora, ranks, alphas)
    meta = {"format": "pt", "writer": WRITER, "tinygpt_base_sha256": st.base,
            "tinygpt_lora": json.dumps(st.lora.as_dict())}
    files = {"adapter_model.safetensors": save(tensors, metadata=meta),
             "adapter_config.json": (json.dumps(config, indent=2) + "\n").encode()}
    write_directory(Path(out_dir), files)
    return sorted(files)


def peft_config(cfg: Config, lora: LoRA, ranks: dict, alphas: dict) -> dict:
    """adapter_config.json for these adapters. Only fields PEFT has had since rank_pattern came
    (0.6): an older PEFT refuses a field it does not know, and every field left out is at its
    default. GPT-2's Conv1D stores its weights [in, out] (fan_in_fan_out), a Linear [out, in]."""
    own = architecture_of(cfg).peft_modules
    if own is not None:
        modules = [own[W].rpartition(".")[2] for W in lora.targets]
    else:
        modules = (["c_attn"] if any(W in lora.targets for W in ("Wq", "Wk", "Wv")) else []) + \
            [PEFT_MODULES[W] for W in PEFT_MODULES if W in lora.targets]
    return {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": lora.rank, "lora_alpha": lora.alpha,
            "target_modules": modules, "rank_pattern": ranks, "alpha_pattern": alphas, "lora_dropout": 0.0,
            "fan_in_fan_out": own is None, "bias": "none", "modules_to_save": None, "inference_mode": True,
            "base_model_name_or_path": None}


# the fields of adapter_config.json that change what PEFT loads or computes; each must be what the
# adapters' own record says (a config PEFT would load with another rank, scale or modules is refused)
PEFT_LOADS = ("peft_type", "r", "lora_alpha", "target_modules", "rank_pattern", "alpha_pattern", "fan_in_fan_out",
              "bias", "modules_to_save")
PEFT_DEFAULTS = {"r": 8, "lora_alpha": 8, "fan_in_fan_out": False, "bias": "none", "rank_pattern": {},
                 "alpha_pattern": {}, "modules_to_save": None}   # LoraConfig's, for a field left out
PEFT_OFF = ("use_rslora", "use_dora")      # another scale, another form of weight: not ours when set
MAX_PEFT_CONFIG = 1 << 20
MAX_SAFETENSORS_HEADER = 64 << 20
PEFT_FILES = ("adapter_config.json", "adapter_model.safetensors")


def peft_files(directory) -> list[Path]:
    """The files reading an adapters directory opens: inputs no output may be."""
    return [Path(directory) / name for name in PEFT_FILES] if directory else []


def _safetensors_header(f: Path, size: int, label: str) -> tuple[dict, dict, int]:
    """(the tensors' header, its __metadata__, its length) of a safetensors file of `size` bytes,
    read first: the tensors it declares are checked against the adapters' own settings before
    the file is read (a 3 GiB file was read whole and then refused)."""
    with open(f, "rb") as h:
        pre = h.read(8)
        n = int.from_bytes(pre, "little") if len(pre) == 8 else -1
        if not 0 < n <= min(MAX_SAFETENSORS_HEADER, size - 8):
            raise CheckpointError(f"{label}: not a safetensors file (a header of {n:,} bytes in a file of "
                                  f"{size:,}); give the directory tinygpt export {{opt:format}} peft wrote")
        try:
            header = json.loads(read_most(h, n))
            meta = header.pop("__metadata__", None) or {}
            assert isinstance(header, dict) and isinstance(meta, dict)
        except (ValueError, AssertionError, UnicodeDecodeError, RecursionError) as e:
            raise CheckpointError(f"{label}: its header is not a safetensors header; the file is damaged") from e
    return header, meta, n


def read_peft(directory, base: Checkpoint, what: str) -> dict:
    """A directory the export's peft format wrote, folded into `base`: its weights merged, after the
    base is checked to be the model the adapters were trained on (by its weights' sha256)."""
    from safetensors import SafetensorError
    from safetensors.numpy import load
    d = Path(directory)
    f = d / "adapter_model.safetensors"
    label = f"{what}'s adapter_model.safetensors"
    st = check_regular(f, CheckpointError, label, "the adapters tinygpt export wrote")
    header, meta, n = _safetensors_header(f, st.st_size, label)
    want = meta.get("tinygpt_base_sha256")
    if not want:
        raise CheckpointError(f"{what}: its adapters do not name the base model they were trained on (not written "
                              "by tinygpt export {opt:format} peft)")
    try:
        lo = json.loads(meta.get("tinygpt_lora", ""))
        lora = make_lora(lo["rank"], lo["alpha"], lo["targets"], lo.get("biases", False))
    except (ValueError, KeyError, TypeError, TinyGPTError) as e:
        raise CheckpointError(f"{what}: its adapters' LoRA settings are unreadable") from e
    ours = {n: tuple(shape) for n, shape, _ in adapter_shapes(base.cfg, lora)}
    if sum(int(np.prod(s_)) for s_ in ours.values()) > 4 * n_params(base.cfg):
        raise CheckpointError(f"{what}: its adapters' settings (rank {lora.rank}) are larger than the base model "
                              "could train; the file is not this base's")
    shapes = {k: v.shape for k, v in peft_tensors(base.cfg, lora, {k: np.zeros(s_, np.float32)
                                                                  for k, s_ in ours.items()})[0].items()}
    _check_peft_header(header, shapes, label)
    need = 8 + n + sum(PEFT_DTYPES[header[k]["dtype"]] * int(np.prod(s_)) for k, s_ in shapes.items())
    if st.st_size != need:
        raise CheckpointError(f"{label}: {st.st_size:,} bytes where its tensors need {need:,}; the file is damaged")
    _check_peft_config(d, lora, base.cfg, what)
    have = base_hash(base.params, base.cfg)
    if have != want:
        raise CheckpointError(f"{what}: these adapters were trained on another base model (sha256 {want[:12]}...), "
                              f"not this one ({have[:12]}...); give the base they were made for")
    raw = read_user_file(f, CheckpointError, label, "a safetensors file", need)
    try:
        tensors = load(raw)
    except (ValueError, SafetensorError) as e:
        raise CheckpointError(f"{what}: adapter_model.safetensors is not a safetensors file ({e})") from e
    other = sorted({header[k]["dtype"] for k in shapes} - {"F32"})
    if other:       # PEFT saves a half-precision or double model's adapters in its dtype
        tensors = {k: np.asarray(v).astype(np.float32) for k, v in tensors.items()}
        bad = sorted(k for k, v in tensors.items() if not np.all(np.isfinite(v)))
        if bad:
            raise CheckpointError(f"{label}: {bad[0]} holds values beyond float32's range (or not finite); these "
                                  "are no trained adapters")
        warn(f"{what}: its adapters are stored as {', '.join(other)}; read as float32")
    adapters = peft_adapters(base.cfg, lora, tensors, what)
    return merged({**base.params, **adapters}, base.cfg, lora)


PEFT_DTYPES = {"F32": 4, "F16": 2, "F64": 8}      # bytes of the dtypes PEFT saves adapters in, read as float32


def _check_peft_header(header: dict, shapes: dict, label: str):
    """Every tensor the adapters need, of its shape, in a float dtype PEFT writes (float32, or a
    half-precision or double model's F16 or F64), and nothing else (an integer tensor is not a
    weight)."""
    missing = sorted(set(shapes) - set(header))
    extra = sorted(set(header) - set(shapes))
    if missing or extra:
        k = (missing or extra)[0]
        raise CheckpointError(f"{label}: {'no' if missing else 'an unexpected'} tensor {k}"
                              f"{'' if missing else ' (these adapters have no such module)'}; give the directory "
                              "tinygpt export {opt:format} peft wrote")
    for k, t in header.items():
        if not isinstance(t, dict) or t.get("dtype") not in PEFT_DTYPES \
                or tuple(t.get("shape") or ()) != tuple(shapes[k]):
            got = f"{t.get('dtype')} {t.get('shape')}" if isinstance(t, dict) else show(t)
            raise CheckpointError(f"{label}: {k} is {got}, where the adapters need F32, F16 or F64 "
                                  f"{list(shapes[k])}; give the directory tinygpt export {{opt:format}} peft wrote")


def _check_peft_config(d: Path, lora: LoRA, cfg: Config, what: str):
    """adapter_config.json says what the adapters' own record says, on every field that changes what
    PEFT loads: rank, alpha and their patterns, the modules, the layout."""
    label = f"{what}'s adapter_config.json"
    raw = read_user_file(d / "adapter_config.json", CheckpointError, label, "the config tinygpt export wrote",
                         MAX_PEFT_CONFIG)
    try:
        got = json.loads(raw)
        assert isinstance(got, dict)
    except (ValueError, AssertionError, UnicodeDecodeError, RecursionError) as e:
        raise CheckpointError(f"{label} is not a JSON object; give the directory tinygpt export "
                              "{opt:format} peft wrote") from e
    _, ranks, alphas = peft_tensors(cfg, lora, {n: np.zeros(s, np.float32) for n, s, _ in adapter_shapes(cfg, lora)})
    mine = peft_config(cfg, lora, ranks, alphas)
    norm = lambda k, v: sorted(v) if k == "target_modules" and isinstance(v, list) else v
    for k in PEFT_LOADS:
        if norm(k, got.get(k, PEFT_DEFAULTS.get(k))) != norm(k, mine[k]):
            raise CheckpointError(f"{label}: {k} is {show(got.get(k))}, where the adapters beside it were written "
                                  f"with {show(mine[k])}; PEFT would load them otherwise: give the directory as "
                                  "tinygpt export {opt:format} peft wrote it")
    for k in PEFT_OFF:
        if got.get(k):
            raise CheckpointError(f"{label}: {k} is set, which PEFT computes otherwise than these adapters were "
                                  "trained; give the directory as tinygpt export {opt:format} peft wrote it")


def peft_adapters(cfg: Config, lora: LoRA, tensors: dict, what: str) -> dict:
    """Our adapters from PEFT's tensors (the inverse of peft_tensors), every shape checked."""
    shapes = {name: tuple(shape) for name, shape, _ in adapter_shapes(cfg, lora)}
    modules = architecture_of(cfg).peft_modules
    if modules is not None:
        return {adapter_name(l, W, w): _tensor(tensors, _module_key(l, modules[W], w), shapes[adapter_name(l, W, w)],
                                               what)
                for l in range(cfg.layers) for W in lora.targets for w in "AB"}
    qkv = [W for W in ("Wq", "Wk", "Wv") if W in lora.targets]
    R, C, out = lora.rank, cfg.d_model, {}
    key = lambda l, module, which: f"base_model.model.transformer.h.{l}.{module}.lora_{which}.weight"
    take = lambda k, shape: _tensor(tensors, k, shape, what)
    for l in range(cfg.layers):
        if qkv:
            A = take(key(l, "attn.c_attn", "A"), (len(qkv) * R, C))
            B = take(key(l, "attn.c_attn", "B"), (3 * C, len(qkv) * R))
            for j, W in enumerate(qkv):
                i = ("Wq", "Wk", "Wv").index(W)
                out[adapter_name(l, W, "A")] = A[j * R:(j + 1) * R]
                out[adapter_name(l, W, "B")] = B[i * C:(i + 1) * C, j * R:(j + 1) * R]
        for W, module in PEFT_MODULES.items():
            if W in lora.targets:
                for which in "AB":
                    n = adapter_name(l, W, which)
                    out[n] = take(key(l, module, which), shapes[n])
    return {k: np.ascontiguousarray(v, np.float32) for k, v in out.items()}


def _tensor(tensors: dict, key: str, shape: tuple, what: str) -> np.ndarray:
    t = tensors.get(key)
    if t is None or tuple(t.shape) != tuple(shape):
        got = "missing" if t is None else f"of shape {list(t.shape)}"
        raise CheckpointError(f"{what}: its adapters' {key} is {got}, where the base model needs {list(shape)}")
    return np.asarray(t, np.float32)

