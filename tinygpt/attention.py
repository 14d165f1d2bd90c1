"""naive / fused_sv / online causal attention behind one interface.

`Attention` records the dispatches of one attention call for fixed shapes and
owns its scratch (the stored weights, or the per-row logsumexp); the model
keeps one per layer. `forward` and `backward` below run it on NumPy arrays,
for tests and scripts.

Scratch per call (bytes, float32):
  naive, fused_sv   P [B,H,T,T] kept for the backward + dS [B,H,T,T]   O(B*H*T^2)
  online            L [B,H,T] kept for the backward + D [B,H,T]        O(B*H*T)
"""
from __future__ import annotations

import numpy as np

from . import kernels as K
from .errors import UsageError
from .gpu import GPU, LimitError
from .plan import KernelPlan, make_plan

IMPLS = ("naive", "fused_sv", "online")
FUSED_MAX_T = 1024  # attn_fused_sv keeps a row of scores in a 1024-entry private array
MAX_HEAD_DIM = 128


class AttentionError(UsageError):
    pass


def check(impl: str, T: int, C: int, H: int):
    if impl not in IMPLS:
        raise AttentionError(f"unknown {{opt:attention}} {impl!r}; choose one of {', '.join(IMPLS)}")
    if C % H:
        raise AttentionError(f"heads ({H}) must divide channels ({C})")
    if C // H > MAX_HEAD_DIM:
        raise AttentionError(f"head dim {C // H} exceeds {MAX_HEAD_DIM}; use more heads")
    if impl == "fused_sv" and T > FUSED_MAX_T:
        raise AttentionError(f"fused_sv handles sequences up to {FUSED_MAX_T} tokens, got T={T}; "
                             "use {opt:attention} online (any length) or a shorter {opt:ctx}")


def scratch_bytes(impl: str, B: int, T: int, H: int) -> int:
    if impl == "online":
        return 2 * 4 * B * H * T
    return 2 * 4 * B * H * T * T


def head_chunks(gpu: GPU, B: int, T: int, H: int):
    """Split heads so that one chunk's [B, nh, T, T] fits one binding."""
    per_head = 4 * B * T * T
    nh = min(H, gpu.max_binding // per_head)
    if nh < 1:
        raise LimitError(f"the score matrix of one head needs {per_head:,} bytes (B={B}, T={T}) but a binding "
                         f"allows {gpu.max_binding:,} (max-storage-buffer-binding-size); use {{opt:attention}} online")
    return [(h0, min(nh, H - h0)) for h0 in range(0, H, nh)]


class Attention:
    """One causal attention of shape [B, T, C] with H heads, recorded once."""

    def __init__(self, gpu: GPU, impl: str, B: int, T: int, C: int, H: int, shared: dict | None = None,
                 block=None, plan: KernelPlan | None = None):
        check(impl, T, C, H)
        self.gpu, self.impl, self.shape, self.block, self.plan = gpu, impl, (B, T, C, H), block, plan
        # whether q, k, v may be given as bf16 (a bf16 model's stored copies): the online kernels
        # with subgroups read them; the others take float32
        self.reads_bf16 = impl == "online" and K.online_variant(plan or K.PORTABLE, T, C // H) == "sg" \
            and (B * T * C) % 8 == 0
        shared = {} if shared is None else shared  # backward scratch, reusable across layers
        if impl == "online":
            self.L = gpu.tensor((B, H, T), name="attn.L")                       # [B,H,T]
            key = ("D", B, H, T)
            if key not in shared:
                shared[key] = gpu.tensor((B, H, T), name="attn.D")               # [B,H,T]
            self.D = shared[key]
        else:
            self.chunks = head_chunks(gpu, B, T, H)
            self.P = [gpu.tensor((B, nh, T, T), name=f"attn.P{h0}") for h0, nh in self.chunks]  # [B,nh,T,T]
            nmax = max(nh for _, nh in self.chunks)
            key = ("dS", B, nmax, T)
            if key not in shared:
                shared[key] = gpu.tensor((B, nmax, T, T), name="attn.dS")
            self.dS = shared[key]

    def forward(self, q, k, v, out, bf16: bool = False):
        """bf16: q, k, v hold bf16 (only where reads_bf16)."""
        B, T, C, H = self.shape
        g = self.gpu
        assert not bf16 or self.reads_bf16
        if self.impl == "online":
            return [K.attn_online_forward(g, q, k, v, out, self.L, B, T, C, H, self.block, plan=self.plan, bf16=bf16)]
        ds = []
        for (h0, nh), P in zip(self.chunks, self.P):
            if self.impl == "naive":
                ds += [K.attn_scores(g, q, k, P, B, T, C, H, h0, nh),
                       K.attn_softmax(g, P, B, T, C, H, h0, nh),
                       K.attn_value(g, P, v, out, B, T, C, H, h0, nh)]
            else:
                ds.append(K.attn_fused_sv(g, q, k, v, out, P, B, T, C, H, h0, nh))
        return ds

    def backward(self, q, k, v, out, dout, dq, dk, dv, bf16: bool = False):
        B, T, C, H = self.shape
        g = self.gpu
        assert not bf16 or self.reads_bf16
        if self.impl == "online":
            p = self.plan
            return [K.attn_online_d(g, dout, out, self.D, B, T, C, H, self.block, plan=p),
                    K.attn_online_dq(g, q, k, v, dout, self.L, self.D, dq, B, T, C, H, self.block, plan=p,
                                     bf16=bf16),
                    K.attn_online_dkv(g, q, k, v, dout, self.L, self.D, dk, dv, B, T, C, H, self.block, plan=p,
                                      bf16=bf16)]
        ds = []
        for (h0, nh), P in zip(self.chunks, self.P):
            ds += [K.attn_dscores(g, dout, v, P, self.dS, B, T, C, H, h0, nh),
                   K.attn_dq(g, self.dS, k, dq, B, T, C, H, h0, nh),
                   K.attn_dk(g, self.dS, q, dk, B, T, C, H, h0, nh),
                   K.attn_dvalue(g, P, dout, dv, B, T, C, H, h0, nh)]
        return ds


# ---- the NumPy-array API ----------------------------------------------------------------------
_GPU = None


def default_gpu() -> GPU:
    global _GPU
    if _GPU is None:
        _GPU = GPU()
    return _GPU


def _prepare(q, k, v, n_head, impl, gpu):
    q, k, v = (np.ascontiguousarray(x, np.float32) for x in (q, k, v))
    if q.ndim != 3 or q.shape != k.shape or q.shape != v.shape:
        raise AttentionError(f"q, k, v must share one shape [B, T, C], got {q.shape}, {k.shape}, {v.shape}")
    B, T, C = q.shape
    check(impl, T, C, n_head)
    gpu = gpu or default_gpu()
    return gpu, (B, T, C), [gpu.upload(x) for x in (q, k, v)]


def forward(q, k, v, n_head: int, impl: str = "online", gpu: GPU | None = None,
            plan: KernelPlan | None = None) -> np.ndarray:
    """Causal multi-head attention of [B, T, C] float32 arrays on the GPU -> out [B, T, C].
    plan: the kernel plan (default: this device's, from make_plan)."""
    gpu, (B, T, C), (tq, tk, tv) = _prepare(q, k, v, n_head, impl, gpu)
    att = Attention(gpu, impl, B, T, C, n_head, plan=plan or make_plan(gpu))
    out = gpu.tensor((B, T, C))
    gpu.run(att.forward(tq, tk, tv, out))
    return gpu.read(out)


def backward(q, k, v, dout, n_head: int, impl: str = "online", gpu: GPU | None = None,
             plan: KernelPlan | None = None):
    """Gradients (dq, dk, dv) of sum(out * dout), each [B, T, C]; runs the forward first."""
    gpu, (B, T, C), (tq, tk, tv) = _prepare(q, k, v, n_head, impl, gpu)
    tdo = gpu.upload(np.ascontiguousarray(dout, np.float32))
    att = Attention(gpu, impl, B, T, C, n_head, plan=plan or make_plan(gpu))
    out, dq, dk, dv = (gpu.tensor((B, T, C)) for _ in range(4))
    gpu.run(att.forward(tq, tk, tv, out) + att.backward(tq, tk, tv, out, tdo, dq, dk, dv))
    return gpu.read(dq), gpu.read(dk), gpu.read(dv)
