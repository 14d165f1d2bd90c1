"""LoRA: low-rank adapters beside chosen weight matrices, the base model frozen.

A targeted matrix W [in, out] (the model's layout: rows of x times W) computes

    y = x W + b + s (x A^T) B^T,   s = alpha / rank,

with A [rank, in] and B [out, rank] in PEFT's shapes (lora_A.weight, lora_B.weight), so an
export writes them as they are. B starts at zero, so step 0 is the base model; A starts as PEFT's
does (kaiming-uniform, bound 1 / sqrt(in)). Only the adapters (and, with `biases`, every bias and
LayerNorm) get gradients and AdamW moments; the rest is never written.

A `LoRA` is a value made once from the options (or a resumed file) and passed down, as the
precision policy is: the model's layout, the buffer table, the block and the reference read it.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from .config import Config, param_shapes
from .errors import UsageError

# the option's names for the block's matrices, in the block's order
TARGETS = {"q": "Wq", "k": "Wk", "v": "Wv", "o": "Wo", "gate": "fc_gate_W", "fc_in": "fc_in_W", "fc_out": "fc_out_W"}
DEFAULT_TARGETS = ("q", "k", "v", "o")
MAX_RANK = 4096


@dataclass(frozen=True)
class LoRA:
    rank: int
    alpha: float
    targets: tuple            # matrix names (TARGETS' values), in the block's order
    biases: bool = False      # also train every bias and LayerNorm

    @property
    def scale(self) -> float:
        return self.alpha / self.rank

    def as_dict(self) -> dict:
        short = {v: k for k, v in TARGETS.items()}
        return {"rank": self.rank, "alpha": self.alpha, "targets": [short[t] for t in self.targets],
                "biases": self.biases}


def make_lora(rank: int, alpha: float | None = None, targets=None, biases: bool = False,
              label: str = "{opt:lora}") -> LoRA:
    """A LoRA from the options (or a file's record), each value checked: one-line errors."""
    if isinstance(rank, bool) or not isinstance(rank, int) or not 1 <= rank <= MAX_RANK:
        raise UsageError(f"{label} takes a rank from 1 to {MAX_RANK:,}, got {rank!r}")
    alpha = 2.0 * rank if alpha is None else alpha
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0 < float(alpha) < 1e6:
        raise UsageError(f"{{opt:lora_alpha}} must be a positive number under 1e6, got {alpha!r}")
    names = list(DEFAULT_TARGETS if targets is None else targets)
    unknown = [t for t in names if t not in TARGETS]
    if unknown or not names:
        raise UsageError(f"{{opt:lora_targets}} takes a comma-separated list of {', '.join(TARGETS)}; got "
                         f"{','.join(map(str, names)) or 'nothing'}")
    chosen = tuple(TARGETS[t] for t in TARGETS if t in names)      # the block's order, once each
    return LoRA(rank, float(alpha), chosen, bool(biases))


def shapes(cfg: Config, W: str) -> tuple[int, int]:
    """(in, out) of one of the block's matrices."""
    C, M, hs = cfg.d_model, cfg.d_mlp, cfg.block.heads
    return {"fc_gate_W": (C, M), "fc_in_W": (C, M), "fc_out_W": (M, C), "Wq": (C, hs.q_width), "Wk": (C, hs.kv_width),
            "Wv": (C, hs.kv_width), "Wo": (hs.q_width, C)}[W]


def adapter_name(l: int, W: str, which: str) -> str:
    return f"h{l}.{W}.lora_{which}"


def adapter_shapes(cfg: Config, lora: LoRA) -> list[tuple[str, tuple, bool]]:
    """(name, shape, decayed) of every adapter, layer by layer: A [rank, in] then B [out, rank]; a
    target the model does not have (gate, without a gated MLP) is refused."""
    have = {n.partition(".")[2] for n, _, _ in param_shapes(cfg) if n.startswith("h0.")}
    missing = [short for short, W in TARGETS.items() if W in lora.targets and W not in have]
    if missing:
        raise UsageError(f"{{opt:lora_targets}} {','.join(missing)}: this model has no such projection (its block: "
                         f"{cfg.block.describe()})")
    out = []
    for l in range(cfg.layers):
        for W in lora.targets:
            i, o = shapes(cfg, W)
            out += [(adapter_name(l, W, "A"), (lora.rank, i), True), (adapter_name(l, W, "B"), (o, lora.rank), True)]
    return out


def is_bias_or_norm(name: str) -> bool:
    short = name.split(".")[-1]
    return short.startswith(("ln", "b")) or short.endswith("_b") or short.endswith("_g")


def trainable_shapes(cfg: Config, lora: LoRA | None) -> list[tuple[str, tuple, bool]]:
    """What gets gradients and moments, in the flat buffers' order: every parameter without LoRA;
    with it the adapters, after every bias and LayerNorm where `biases` (each LayerNorm's bias
    right after its gain, as the full layout has them)."""
    if lora is None:
        return param_shapes(cfg)
    extra = [s for s in param_shapes(cfg) if lora.biases and is_bias_or_norm(s[0])]
    return extra + adapter_shapes(cfg, lora)


def init_adapters(cfg: Config, lora: LoRA, seed: int | None = None) -> dict:
    """A as PEFT initializes it (uniform in +-1/sqrt(in)), B zero: step 0 computes the base model."""
    rng = np.random.default_rng([cfg.seed if seed is None else seed, 2])
    out = {}
    for name, shape, _ in adapter_shapes(cfg, lora):
        if name.endswith("lora_A"):
            bound = 1.0 / np.sqrt(shape[1])
            out[name] = rng.uniform(-bound, bound, shape).astype(np.float32)
        else:
            out[name] = np.zeros(shape, np.float32)
    return out


def merged(params: dict, cfg: Config, lora: LoRA) -> dict:
    """The base weights with each adapter folded in (W + s (B A)^T, in float64, stored float32),
    the adapters dropped: a plain model that computes what the adapted one does."""
    out = {name: params[name] for name, _, _ in param_shapes(cfg)}
    for l in range(cfg.layers):
        for W in lora.targets:
            name = f"h{l}.{W}"
            A = params[adapter_name(l, W, "A")].astype(np.float64)
            B = params[adapter_name(l, W, "B")].astype(np.float64)
            out[name] = (out[name].astype(np.float64) + lora.scale * (B @ A).T).astype(np.float32)
    return out


def base_hash(params: dict, cfg: Config) -> str:
    """The base model's identity: sha256 of its weights, float32 little-endian, in the file's order."""
    h = hashlib.sha256()
    for name, shape, _ in param_shapes(cfg):
        h.update(np.ascontiguousarray(np.asarray(params[name], "<f4")).tobytes())
    return h.hexdigest()
