"""The attention component: naive, fused_sv and online causal attention, each one object.

Each path is made once from its name (`path`) and answers every question the rest of the
package asks of attention, as the optimizer (model.optim) does for the optimizer:
  (a) what it cannot take (`check`, `check_fits`), before anything is allocated;
  (b) its scratch's rows in the buffer table (`rows`), so the memory budget and the
      allocation keep agreeing, and whether its kernels read q, k, v as a precision stores
      them (`reads`), which decides the table's float32 copies;
  (c) its dispatches for one call of fixed shape, on the scratch its layer was given (`bind` ->
      Attention: `forward`, `backward`), with the model's sliding window, if any;
  (d) the attention weights of a forward where it keeps them (`keeps_weights`, Attention.weights:
      `tinygpt inspect` draws them through the path that does, `inspection()`).
No module outside this one compares attention names. The decode step's attention (decode.wgsl,
over the key/value cache) is the same for every path: it reads the window from the model.

A sliding window W (Config.window, upstream's slidingWindow; 0: none) lets each query see its
last W positions, itself included; every path computes only those (the online path skips the
tiles wholly outside every query's window, so its cost falls with W). Packed windows (docs: each
row's position in its record, u32 [B*T]) hold several records, each query seeing its own alone:
every path masks the keys of other records (the kernels' DOCS sections).

Scratch per call (bytes, float32):
  naive, fused_sv   P [B,H,T,T] kept for the backward + dS [B,H,T,T]   O(B*H*T^2)
  online            L [B,H,T] kept for the backward + D [B,H,T]        O(B*H*T)
`forward` and `backward` at the end run a path on NumPy arrays, for tests and scripts.
"""
from __future__ import annotations

import numpy as np

from ..core.errors import UsageError
from ..device.gpu import DTYPES, GPU, LimitError
from ..device.kernels import Kernels, online_variant
from ..device.plan import KernelPlan
from .buffers import Buffer
from .layout import head_chunks

MAX_HEAD_DIM = 128
AT = "attention scratch"    # the memory budget's group of every path's scratch


class AttentionError(UsageError):
    pass


def check_scores_fit(B: int, T: int, max_binding: int):
    """The score matrix of one head must fit one binding (the naive and fused_sv paths)."""
    per_head = 4 * B * T * T
    if per_head > max_binding:
        raise LimitError(f"the score matrix of one head needs {per_head:,} bytes (B={B}, T={T}) but a binding "
                         f"allows {max_binding:,} (max-storage-buffer-binding-size); use {{opt:attention}} online")


class AttentionPath:
    """One attention path: what it refuses, its scratch, its dispatches."""
    name = ""
    keeps_weights = False       # whether its forward leaves every head's P [T, T] in its scratch

    def check(self, T: int, C: int, H: int):
        if C % H:
            raise AttentionError(f"heads ({H}) must divide channels ({C})")
        if C // H > MAX_HEAD_DIM:
            raise AttentionError(f"head dim {C // H} exceeds {MAX_HEAD_DIM}; use more heads")

    def check_fits(self, B: int, T: int, gpu: GPU):
        pass

    def reads(self, dtype: str, plan: KernelPlan, B: int, T: int, C: int, H: int) -> bool:
        """Whether its kernels read q, k, v stored in `dtype` (else the model gives them float32
        copies): every kernel reads float32."""
        return not DTYPES[dtype].packed

    def rows(self) -> tuple:
        raise NotImplementedError

    def scratch_bytes(self, B: int, T: int, H: int) -> int:
        raise NotImplementedError

    def scratch(self, buf: dict, size: dict, l: int) -> dict:
        """Layer l's scratch from the model's buffers (this path's rows, allocated; size: the
        table's sizes)."""
        raise NotImplementedError

    def own_scratch(self, gpu: GPU, B: int, T: int, H: int) -> dict:
        """Scratch for one standalone call (the NumPy-array API below; a model's comes from its table)."""
        raise NotImplementedError

    def bind(self, kn: Kernels, B: int, T: int, C: int, H: int, scratch: dict, window: int = 0,
             block=None, docs=None) -> "Attention":
        self.check(T, C, H)
        return Attention(self, kn, (B, T, C, H), scratch, window, block, docs)  # W >= T: plain (kernels.windowed)

    def forward(self, a: "Attention", q, k, v, out) -> list:
        raise NotImplementedError

    def backward(self, a: "Attention", q, k, v, out, dout, dq, dk, dv, rot=None) -> list:
        """rot: a rotary model's Rotary, where turns_back said the path turns dq and dk back."""
        raise NotImplementedError

    def turns_back(self, a: "Attention", rot) -> bool:
        """Whether the backward turns a rotary model's dq and dk back where it stores them (else the
        block runs rope_backward's pass)."""
        return False


class Attention:
    """One path's attention of shape [B, T, C] with H heads, bound to its scratch: the model
    keeps one per layer."""

    def __init__(self, path: AttentionPath, kn: Kernels, shape: tuple, scratch: dict, window: int, block=None,
                 docs=None):
        self.path, self.kn, self.shape, self.scratch, self.window, self.block, self.docs = \
            path, kn, shape, scratch, window, block, docs

    def forward(self, q, k, v, out) -> list:
        """q, k, v as stored where path.reads says so, else float32; out float32."""
        return self.path.forward(self, q, k, v, out)

    def backward(self, q, k, v, out, dout, dq, dk, dv, rot=None) -> list:
        return self.path.backward(self, q, k, v, out, dout, dq, dk, dv, rot)

    def turns_back(self, rot) -> bool:
        return self.path.turns_back(self, rot)

    def weights(self) -> list:
        """[(first head, heads, P [B, heads, T, T])] after a forward, where the path keeps them."""
        assert self.path.keeps_weights, self.path.name
        return [(h0, nh, P) for (h0, nh), P in zip(self.scratch["chunks"], self.scratch["P"])]


class _ScoreMatrix(AttentionPath):
    """naive and fused_sv: each head's weights P [T, T] kept for the backward, split by heads
    into chunks that fit a binding (layout.head_chunks)."""
    keeps_weights = True
    row_passes = 3              # the most passes over a row's T keys that one invocation makes

    def check_fits(self, B, T, gpu):
        check_scores_fit(B, T, gpu.max_binding)
        # llvmpipe stops an invocation's loops silently after GPU.LOOP_CAP iterations in all
        gpu.check_loop(self.row_passes * T, f"{self.name}'s loops over a row's keys ({self.row_passes} x ctx)",
                       "{opt:attention} online or a shorter {opt:ctx}")

    def rows(self):
        return (Buffer("attn P", ("B", "NH", "T", "T"), "f32", "per layer, per head chunk", AT),
                Buffer("attn dS", ("B", "NHmax", "T", "T"), "f32", "shared", AT))

    def scratch_bytes(self, B, T, H):
        return 2 * 4 * B * H * T * T

    def scratch(self, buf, size, l):
        return {"P": buf["attn P"][l], "dS": buf["attn dS"], "chunks": size["head_chunks"]}

    def own_scratch(self, gpu, B, T, H):
        self.check_fits(B, T, gpu)
        chunks = head_chunks(B, T, H, gpu.max_binding)
        nmax = max(nh for _, nh in chunks)
        return {"P": [gpu.tensor((B, nh, T, T), name="attn P") for _, nh in chunks],
                "dS": gpu.tensor((B, nmax, T, T), name="attn dS"), "chunks": chunks}

    def backward(self, a, q, k, v, out, dout, dq, dk, dv, rot=None):
        B, T, C, H = a.shape
        kn, w, s, d = a.kn, a.window, a.scratch, a.docs
        ds = []
        for (h0, nh), P in zip(s["chunks"], s["P"]):
            ds += [kn.attention.attn_dscores(dout, v, P, s["dS"], B, T, C, H, h0, nh, w, d),
                   kn.attention.attn_dq(s["dS"], k, dq, B, T, C, H, h0, nh, w, d),
                   kn.attention.attn_dk(s["dS"], q, dk, B, T, C, H, h0, nh, w, d),
                   kn.attention.attn_dvalue(P, dout, dv, B, T, C, H, h0, nh, w, d)]
        return ds


class Naive(_ScoreMatrix):
    """Scores, softmax and P @ V as three kernels."""
    name = "naive"

    def forward(self, a, q, k, v, out):
        B, T, C, H = a.shape
        kn, w, s, d = a.kn, a.window, a.scratch, a.docs
        ds = []
        for (h0, nh), P in zip(s["chunks"], s["P"]):
            ds += [kn.attention.attn_scores(q, k, P, B, T, C, H, h0, nh, w, d),
                   kn.attention.attn_softmax(P, B, T, C, H, h0, nh, w, d),
                   kn.attention.attn_value(P, v, out, B, T, C, H, h0, nh, w, d)]
        return ds


class FusedSV(_ScoreMatrix):
    """TinyGPT's attn_fused_sv: a row's scores, softmax and P @ V in one invocation, the scores
    parked in the row of P they become (the original's private array capped T at 1024)."""
    name = "fused_sv"
    row_passes = 4              # scores, exponentials, weights (the whole row), P @ V

    def forward(self, a, q, k, v, out):
        B, T, C, H = a.shape
        kn, s = a.kn, a.scratch
        return [kn.attention.attn_fused_sv(q, k, v, out, P, B, T, C, H, h0, nh, a.window, a.docs)
                for (h0, nh), P in zip(s["chunks"], s["P"])]


class Online(AttentionPath):
    """Tiled online softmax (FlashAttention-2 style) with a recomputing backward: no T x T buffer."""
    name = "online"

    def reads(self, dtype, plan, B, T, C, H):
        """The online kernels also read bf16 and f16 (BF16 and F16 of online.wgsl, by element, and
        of online_sg.wgsl, by whole words: B*T*C a multiple of 8)."""
        if not DTYPES[dtype].packed:
            return True
        if not DTYPES[dtype].flag:           # a 16-bit type the kernels take through their BF16 / F16 constant
            return False
        return online_variant(plan, T, C // H) != "sg" or (B * T * C) % 8 == 0

    def rows(self):
        return (Buffer("attn L", ("B", "H", "T"), "f32", "per layer", AT),
                Buffer("attn D", ("B", "H", "T"), "f32", "shared", AT))

    def scratch_bytes(self, B, T, H):
        return 2 * 4 * B * H * T

    def scratch(self, buf, size, l):
        return {"L": buf["attn L"][l], "D": buf["attn D"]}

    def own_scratch(self, gpu, B, T, H):
        return {"L": gpu.tensor((B, H, T), name="attn L"), "D": gpu.tensor((B, H, T), name="attn D")}

    def forward(self, a, q, k, v, out):
        B, T, C, H = a.shape
        return [a.kn.attention.attn_online_forward(q, k, v, out, a.scratch["L"], B, T, C, H, a.block, window=a.window,
                                         docs=a.docs)]

    def backward(self, a, q, k, v, out, dout, dq, dk, dv, rot=None):
        B, T, C, H = a.shape
        kn, L, D, blk, w = a.kn, a.scratch["L"], a.scratch["D"], a.block, a.window
        cs = rot.cs if rot is not None else None
        return [kn.attention.attn_online_d(dout, out, D, B, T, C, H, blk),
                kn.attention.attn_online_dq(q, k, v, dout, L, D, dq, B, T, C, H, blk, window=w, cs=cs, docs=a.docs),
                kn.attention.attn_online_dkv(q, k, v, dout, L, D, dk, dv, B, T, C, H, blk, window=w, cs=cs,
                                             docs=a.docs)]

    def turns_back(self, a, rot):
        """Its kernels do (AttentionKernels.turns_back), for training's rows: positions 0..T-1 (not a packed
        window's, whose positions restart at each record)."""
        B, T, C, H = a.shape
        return rot.offset == 0 and rot.T == T and rot.docs is None and a.kn.attention.turns_back(T, C, H)


PATHS = {p.name: p for p in (Naive(), FusedSV(), Online())}
IMPLS = tuple(PATHS)
DEFAULT = "online"          # any length, O(T) scratch: the CLI's and the API's default


def path(name) -> AttentionPath:
    """The path of that name (a AttentionPath is returned as it is), or a usage error listing them."""
    if isinstance(name, AttentionPath):
        return name
    if name not in PATHS:
        raise AttentionError(f"unknown {{opt:attention}} {name!r}; choose one of {', '.join(IMPLS)}")
    return PATHS[name]


def plainest() -> AttentionPath:
    """The path of the fewest moving parts (scores, softmax and P @ V as three kernels): where a run
    whose kernels disagree with the reference is tried again (model.twincheck)."""
    return PATHS["naive"]


def inspection() -> AttentionPath:
    """The path `tinygpt inspect` draws weights through: the naive one, whose softmax writes every
    entry of each head's P (a fused path's kernel writes P too, but inspect keeps one path)."""
    return PATHS["naive"]


# ---- the NumPy-array API ----------------------------------------------------------------------
def _prepare(kn: Kernels, q, k, v, n_head, impl, window, docs=None):
    q, k, v = (np.ascontiguousarray(x, np.float32) for x in (q, k, v))
    if q.ndim != 3 or q.shape != k.shape or q.shape != v.shape:
        raise AttentionError(f"q, k, v must share one shape [B, T, C], got {q.shape}, {k.shape}, {v.shape}")
    B, T, C = q.shape
    p, gpu = path(impl), kn.gpu
    p.check(T, C, n_head)
    tdocs = None if docs is None else gpu.upload(np.ascontiguousarray(docs, np.uint32).reshape(B * T))
    att = p.bind(kn, B, T, C, n_head, p.own_scratch(gpu, B, T, n_head), window, docs=tdocs)
    return gpu, (B, T, C), att, [gpu.upload(x) for x in (q, k, v)]


def forward(kn: Kernels, q, k, v, n_head: int, impl: str = DEFAULT, window: int = 0, docs=None) -> np.ndarray:
    """Causal multi-head attention of [B, T, C] float32 arrays on the device of kn -> out [B, T, C].
    docs [B, T]: packed windows' positions of each row in its record (each query sees its record's keys)."""
    gpu, (B, T, C), att, (tq, tk, tv) = _prepare(kn, q, k, v, n_head, impl, window, docs)
    out = gpu.tensor((B, T, C))
    gpu.run(att.forward(tq, tk, tv, out))
    return gpu.read(out)


def backward(kn: Kernels, q, k, v, dout, n_head: int, impl: str = DEFAULT, window: int = 0, docs=None):
    """Gradients (dq, dk, dv) of sum(out * dout), each [B, T, C]; runs the forward first."""
    gpu, (B, T, C), att, (tq, tk, tv) = _prepare(kn, q, k, v, n_head, impl, window, docs)
    tdo = gpu.upload(np.ascontiguousarray(dout, np.float32))
    out, dq, dk, dv = (gpu.tensor((B, T, C)) for _ in range(4))
    gpu.run(att.forward(tq, tk, tv, out) + att.backward(tq, tk, tv, out, tdo, dq, dk, dv))
    return gpu.read(dq), gpu.read(dk), gpu.read(dv)
