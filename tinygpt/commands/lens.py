"""`tinygpt inspect`: what a trained model attends to, and what each layer would predict.

Attention weights: the prompt runs once through the attention path that keeps them
(model.attention.inspection(): its softmax writes every entry of each head's P [T, T], zeros
outside what each query sees); the path hands back those buffers, which are read. Nothing is
read from a buffer the forward does not write (TinyGPT's inspector read the score buffer of a
fused path that never filled it).

Logit lens: the residual stream after each layer (the embeddings, then the output of every
block) goes through the final LayerNorm and the tied head, on the GPU, with the same kernels as
the model's own last layer; the top next-token guess and its probability at each position.
The last row is the model's prediction.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass

import numpy as np

from ..files import checkpoint as ckpt
from ..files.lora_files import model_params, peft_files
from ..core.config import Config, n_params
from ..core.errors import UsageError
from ..device.gpu import GPU, Tensor
from ..device.plan import KernelPlan
from ..device.planner import make_plan
from ..run.infer import tokenizer_of
from ..model.attention import inspection
from ..model.gpt import Model
from ..model import budget
from ..model.budget import device_limits
from ..model.layout import logit_chunks, padded_vocab, rows
from ..files.outputs import Outputs, is_our_png, save_png
from ..model.spec import RunSpec


@dataclass
class Inspection:
    tokens: list            # the prompt's token ids, T of them
    weights: np.ndarray     # [L, H, T, T] attention weights, rows over the keys each query sees
    lens_top: np.ndarray    # [L+1, T] top next-token id of each layer's residual stream
    lens_prob: np.ndarray   # [L+1, T] its probability


class Inspector:
    """A [1, T] forward of the model with the attention that keeps its weights, plus the lens dispatches."""

    def __init__(self, gpu: GPU, plan: KernelPlan, cfg: Config, T: int):
        self.cfg, self.T = cfg, T
        self.model = m = Model(gpu, plan, RunSpec(cfg, inspection(), B=1, T=T, training=False))
        C, VP = cfg.d_model, m.layout.VP
        self.ln, self.stats = gpu.tensor((T, C), name="lens.ln"), gpu.tensor((2, T), name="lens.stats")  # [T,C] [2,T]
        chunks = logit_chunks(T, VP, gpu.max_binding)  # bound a chunk of rows at a time when too large
        self.logits = Tensor(gpu.buffer(4 * T * VP, "lens.logits", binding=len(chunks) == 1), 0, (T, VP), "f32",
                             "lens.logits")                                                         # [T,VP]
        # one list of dispatches per residual stream x_0 .. x_L
        head = [d for r0, n in chunks for d in m.head.forward(rows(self.ln, r0, n), rows(self.logits, r0, n), n)]
        self.lens = [[m.kn.layernorm_forward(x, m.P["ln_f"], self.ln, self.stats, T, C)] + head for x in m.buf["x"]]

    def run(self, params: dict, ids) -> Inspection:
        m, gpu, cfg, T = self.model, self.model.gpu, self.cfg, self.T
        m.set_params(params)
        x = np.asarray(ids, np.uint32).reshape(1, T)
        m.forward(x)
        H = cfg.heads
        weights = np.zeros((cfg.layers, H, T, T), np.float32)
        for l, att in enumerate(m.att):
            for h0, nh, P in att.weights():
                weights[l, h0:h0 + nh] = gpu.read(P).reshape(nh, T, T)
        top = np.zeros((cfg.layers + 1, T), np.int64)
        prob = np.zeros((cfg.layers + 1, T), np.float32)
        for l, dispatches in enumerate(self.lens):
            gpu.run(dispatches)
            z = gpu.read(self.logits).reshape(T, -1)[:, :cfg.vocab].astype(np.float64)
            top[l] = z.argmax(1)
            e = np.exp(z - z.max(1, keepdims=True))
            prob[l] = (e.max(1) / e.sum(1)).astype(np.float32)
        return Inspection([int(i) for i in ids], weights, top, prob)


def shown(tok, i: int) -> str:
    """A token as a short label: spaces and line ends made visible."""
    s = tok.decode([i]).replace(" ", "\u2423").replace("\n", "\u23ce").replace("\t", "\u21e5")
    return "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in s) or "?"   # no glyph-less controls


def lens_table(ins: Inspection, tok) -> str:
    """The logit lens as text: one row per layer, one column per position."""
    labels = [shown(tok, i) for i in ins.tokens]
    names = ["embed"] + [f"layer {l + 1}" for l in range(len(ins.lens_top) - 1)]
    w = max(3, *(len(s) for s in labels))
    lines = [f"{'input':>8s}  " + " ".join(f"{s:>{w}s}" for s in labels)]
    for name, top in zip(names, ins.lens_top):
        lines.append(f"{name:>8s}  " + " ".join(f"{shown(tok, int(i)):>{w}s}" for i in top))
    return "\n".join(lines)


def plot(ins: Inspection, tok, path, title: str = ""):
    """Heat maps of every layer and head, then the logit lens, in one PNG."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    L, H, T, _ = ins.weights.shape
    labels = [shown(tok, i) for i in ins.tokens]
    step = max(1, T // 24)                       # at most ~24 tick labels per axis
    ticks = list(range(0, T, step))
    short = all(len(labels[t]) <= 2 for t in ticks)
    cell = 2.4 if T <= 32 else 3.2
    fig = plt.figure(figsize=(max(8.0, cell * H), cell * L + 0.28 * (L + 1) + 1.6), dpi=90)
    grid = fig.add_gridspec(L + 1, H, height_ratios=[cell] * L + [0.28 * (L + 1) + 0.6])
    for l in range(L):
        for h in range(H):
            ax = fig.add_subplot(grid[l, h])
            ax.imshow(ins.weights[l, h], cmap="Blues", vmin=0.0, vmax=1.0, interpolation="nearest")
            ax.set_title(f"layer {l + 1} head {h + 1}", fontsize=8)
            ax.set_xticks(ticks, [labels[t] for t in ticks], fontsize=6, rotation=0 if short else 90)
            ax.set_yticks(ticks, [labels[t] for t in ticks], fontsize=6)
            if h == 0:
                ax.set_ylabel("query", fontsize=7)
            if l == L - 1:
                ax.set_xlabel("key", fontsize=7)
    ax = fig.add_subplot(grid[L, :])
    ax.imshow(ins.lens_prob, cmap="Greens", vmin=0.0, vmax=1.0, aspect="auto", interpolation="nearest")
    if T <= 64:
        for l in range(L + 1):
            for t in range(T):
                ax.text(t, l, shown(tok, int(ins.lens_top[l, t])), ha="center", va="center", fontsize=6)
    ax.set_yticks(range(L + 1), ["embed"] + [f"layer {l + 1}" for l in range(L)], fontsize=7)
    ax.set_xticks(ticks, [labels[t] for t in ticks], fontsize=6)
    ax.set_title("logit lens: each layer's top next-token guess (shade: its probability)", fontsize=8)
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    save_png(fig, path, dpi=fig.dpi)
    return path


def inspect_model(gpu: GPU, plan: KernelPlan, cfg: Config, params: dict, ids) -> Inspection:
    return Inspector(gpu, plan, cfg, len(ids)).run(params, ids)


def inspect(o, gpu: GPU | None = None, err=None) -> tuple[Inspection, str]:
    """`tinygpt inspect`: the figure written to o.out, and the lens as text."""
    path = Outputs(o.force, {"model": o.model, "tokenizer_file": o.tokenizer_file,
                             "adapters": [o.adapters, *peft_files(o.adapters)] if o.adapters else None}) \
        .claim(o.out, "out", "inspection plot", is_our_png)
    ck = ckpt.load(o.model, f"{{opt:model}} {o.model}", moments=False)
    tok = tokenizer_of(ck, o.tokenizer_file)
    ids = [int(i) for i in tok.encode(o.prompt)]
    if not ids:
        raise UsageError("{opt:prompt} is empty; give some text to inspect")
    if len(ids) > ck.cfg.ctx:
        print(f"the prompt has {len(ids)} tokens, more than the model's context ({ck.cfg.ctx}); "
              f"inspecting its last {ck.cfg.ctx}", file=err or sys.stderr)
        ids = ids[-ck.cfg.ctx:]
    gpu = gpu or GPU()
    plan, limits = make_plan(gpu, o.kernels), device_limits(gpu)
    spec = RunSpec(ck.cfg, inspection(), B=1, T=len(ids), training=False)     # the Inspector's, and its logits:
    budget.check_use(budget.eval_bytes(spec, plan, limits) + 4 * len(ids) * padded_vocab(ck.cfg.vocab),
                     4 * n_params(ck.cfg), limits, f"inspecting a {len(ids):,}-token prompt",
                     "give a shorter {opt:prompt}")
    ins = inspect_model(gpu, plan, ck.cfg, model_params(ck, f"{{opt:model}} {o.model}", o.adapters), ids)
    plot(ins, tok, path, f"{o.model}: attention weights for a {len(ids)}-token prompt")
    return ins, lens_table(ins, tok)
