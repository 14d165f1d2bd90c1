"""naive / fused_sv / online causal attention behind one interface.

`Attention` records the dispatches of one attention call for fixed shapes, on scratch its caller
allocates from the buffer table (model.buffers: the stored weights P, or the per-row logsumexp
L); the model keeps one per layer. `forward` and `backward` below run it on NumPy arrays, for
tests and scripts.

Scratch per call (bytes, float32):
  naive, fused_sv   P [B,H,T,T] kept for the backward + dS [B,H,T,T]   O(B*H*T^2)
  online            L [B,H,T] kept for the backward + D [B,H,T]        O(B*H*T)
"""
from __future__ import annotations

import numpy as np

from ..core.errors import UsageError
from ..device.gpu import GPU, LimitError
from ..device.kernels import Kernels, online_variant
from ..device.plan import KernelPlan
from .layout import head_chunks

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


def check_scores_fit(B: int, T: int, max_binding: int):
    """The score matrix of one head must fit one binding (the naive and fused_sv paths)."""
    per_head = 4 * B * T * T
    if per_head > max_binding:
        raise LimitError(f"the score matrix of one head needs {per_head:,} bytes (B={B}, T={T}) but a binding "
                         f"allows {max_binding:,} (max-storage-buffer-binding-size); use {{opt:attention}} online")


def reads(dtype: str, plan: KernelPlan, impl: str, B: int, T: int, C: int, H: int) -> bool:
    """Whether this attention's kernels read q, k, v stored in `dtype`: every kernel reads float32;
    the online kernels also read bf16 and f16 (BF16 and F16 of online.wgsl, by element, and of
    online_sg.wgsl, by whole words: B*T*C a multiple of 8). Where they do not (naive, fused_sv),
    the model gives them float32 copies."""
    if dtype == "f32":
        return True
    if dtype not in ("bf16", "f16") or impl != "online":
        return False
    return online_variant(plan, T, C // H) != "sg" or (B * T * C) % 8 == 0


def scratch_bytes(impl: str, B: int, T: int, H: int) -> int:
    if impl == "online":
        return 2 * 4 * B * H * T
    return 2 * 4 * B * H * T * T


class Attention:
    """One causal attention of shape [B, T, C] with H heads, recorded once.

    scratch: online {"L": [B,H,T] this call's, "D": [B,H,T] shared}; otherwise {"P": one [B,nh,T,T]
    per head chunk (layout.head_chunks), "dS": [B,nmax,T,T] shared}."""

    def __init__(self, kn: Kernels, impl: str, B: int, T: int, C: int, H: int, scratch: dict, block=None):
        check(impl, T, C, H)
        self.kn, self.impl, self.shape, self.block = kn, impl, (B, T, C, H), block
        if impl == "online":
            self.L, self.D = scratch["L"], scratch["D"]
        else:
            check_scores_fit(B, T, kn.gpu.max_binding)
            self.chunks = head_chunks(B, T, H, kn.gpu.max_binding)
            self.P, self.dS = scratch["P"], scratch["dS"]

    def forward(self, q, k, v, out) -> list:
        """q, k, v as stored where reads() says so, else float32; out float32."""
        B, T, C, H = self.shape
        kn = self.kn
        if self.impl == "online":
            return [kn.attn_online_forward(q, k, v, out, self.L, B, T, C, H, self.block)]
        ds = []
        for (h0, nh), P in zip(self.chunks, self.P):
            if self.impl == "naive":
                ds += [kn.attn_scores(q, k, P, B, T, C, H, h0, nh),
                       kn.attn_softmax(P, B, T, C, H, h0, nh),
                       kn.attn_value(P, v, out, B, T, C, H, h0, nh)]
            else:
                ds.append(kn.attn_fused_sv(q, k, v, out, P, B, T, C, H, h0, nh))
        return ds

    def backward(self, q, k, v, out, dout, dq, dk, dv) -> list:
        B, T, C, H = self.shape
        kn = self.kn
        if self.impl == "online":
            return [kn.attn_online_d(dout, out, self.D, B, T, C, H, self.block),
                    kn.attn_online_dq(q, k, v, dout, self.L, self.D, dq, B, T, C, H, self.block),
                    kn.attn_online_dkv(q, k, v, dout, self.L, self.D, dk, dv, B, T, C, H, self.block)]
        ds = []
        for (h0, nh), P in zip(self.chunks, self.P):
            ds += [kn.attn_dscores(dout, v, P, self.dS, B, T, C, H, h0, nh),
                   kn.attn_dq(self.dS, k, dq, B, T, C, H, h0, nh),
                   kn.attn_dk(self.dS, q, dk, B, T, C, H, h0, nh),
                   kn.attn_dvalue(P, dout, dv, B, T, C, H, h0, nh)]
        return ds


def own_scratch(gpu: GPU, impl: str, B: int, T: int, H: int) -> dict:
    """Scratch for one standalone Attention (the NumPy-array API below; the model's comes from its table)."""
    if impl == "online":
        return {"L": gpu.tensor((B, H, T), name="attn L"), "D": gpu.tensor((B, H, T), name="attn D")}
    check_scores_fit(B, T, gpu.max_binding)
    chunks = head_chunks(B, T, H, gpu.max_binding)
    nmax = max(nh for _, nh in chunks)
    return {"P": [gpu.tensor((B, nh, T, T), name="attn P") for _, nh in chunks],
            "dS": gpu.tensor((B, nmax, T, T), name="attn dS")}


# ---- the NumPy-array API ----------------------------------------------------------------------
def _prepare(kn: Kernels, q, k, v, n_head, impl):
    q, k, v = (np.ascontiguousarray(x, np.float32) for x in (q, k, v))
    if q.ndim != 3 or q.shape != k.shape or q.shape != v.shape:
        raise AttentionError(f"q, k, v must share one shape [B, T, C], got {q.shape}, {k.shape}, {v.shape}")
    B, T, C = q.shape
    check(impl, T, C, n_head)
    gpu = kn.gpu
    att = Attention(kn, impl, B, T, C, n_head, own_scratch(gpu, impl, B, T, n_head))
    return gpu, (B, T, C), att, [gpu.upload(x) for x in (q, k, v)]


def forward(kn: Kernels, q, k, v, n_head: int, impl: str = "online") -> np.ndarray:
    """Causal multi-head attention of [B, T, C] float32 arrays on the device of kn -> out [B, T, C]."""
    gpu, (B, T, C), att, (tq, tk, tv) = _prepare(kn, q, k, v, n_head, impl)
    out = gpu.tensor((B, T, C))
    gpu.run(att.forward(tq, tk, tv, out))
    return gpu.read(out)


def backward(kn: Kernels, q, k, v, dout, n_head: int, impl: str = "online"):
    """Gradients (dq, dk, dv) of sum(out * dout), each [B, T, C]; runs the forward first."""
    gpu, (B, T, C), att, (tq, tk, tv) = _prepare(kn, q, k, v, n_head, impl)
    tdo = gpu.upload(np.ascontiguousarray(dout, np.float32))
    out, dq, dk, dv = (gpu.tensor((B, T, C)) for _ in range(4))
    gpu.run(att.forward(tq, tk, tv, out) + att.backward(tq, tk, tv, out, tdo, dq, dk, dv))
    return gpu.read(dq), gpu.read(dk), gpu.read(dv)
