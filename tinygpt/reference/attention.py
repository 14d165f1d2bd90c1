"""NumPy twins of the attention kernels, beside the plain reference.

q, k, v, out are [B, T, C] with H heads interleaved in C (head h owns channels
h*hd .. h*hd+hd-1), scale 1/sqrt(hd), causal (t2 <= t1).

  attention_forward / attention_backward    the plain float64 judge
  attn_scores, attn_softmax, attn_value     the naive score-matrix path
  attn_fused_sv                             TinyGPT's fused softmax + P@V
  attn_dscores, attn_dq, attn_dk, attn_dvalue   backward of both, from stored weights
  attn_online_forward, attn_online_d, attn_online_dq, attn_online_dkv
                                            the tiled online path, walking the
                                            same tiles in the same order as the WGSL
"""
from __future__ import annotations

import math

import numpy as np


def heads(x, H):                          # [B,T,C] -> [B,H,T,hd]
    B, T, C = x.shape
    return x.reshape(B, T, H, C // H).transpose(0, 2, 1, 3)


def merge(x):                             # [B,H,T,hd] -> [B,T,C]
    B, H, T, hd = x.shape
    return x.transpose(0, 2, 1, 3).reshape(B, T, H * hd)


def causal_mask(T):
    return np.tril(np.ones((T, T), bool))


# ---- the plain reference -----------------------------------------------------------------
def attention_forward(q, k, v, H):
    qh, kh, vh = heads(q, H), heads(k, H), heads(v, H)
    s = qh @ kh.transpose(0, 1, 3, 2) / math.sqrt(qh.shape[-1])
    s = np.where(causal_mask(q.shape[1]), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return merge(p @ vh)


def attention_backward(q, k, v, dout, H, out=None):
    """out: the forward's output as the backward reads it (a bf16 model reads it back rounded):
    D = rowsum(dO * O), which equals rowsum(P * dP) for the exact O."""
    qh, kh, vh, doh = heads(q, H), heads(k, H), heads(v, H), heads(dout, H)
    scale = 1.0 / math.sqrt(qh.shape[-1])
    s = np.where(causal_mask(q.shape[1]), qh @ kh.transpose(0, 1, 3, 2) * scale, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    dv = p.transpose(0, 1, 3, 2) @ doh
    dp = doh @ vh.transpose(0, 1, 3, 2)
    D = (p * dp).sum(-1, keepdims=True) if out is None else (doh * heads(out, H)).sum(-1, keepdims=True)
    ds = p * (dp - D) * scale
    return merge(ds @ kh), merge(ds.transpose(0, 1, 3, 2) @ qh), merge(dv)


# ---- naive: scores, softmax, value ----------------------------------------------------------
# what the kernels write above the diagonal: -FLT_MAX (WGSL has no -inf literal; the shaders
# spell it -0x1.fffffep+127f, exactly an f32, as Tint requires: it refuses -3.4028235e38)
MASKED = -3.4028235e38


def attn_scores(q, k, H):                 # -> S [B,H,T,T], masked entries = MASKED
    qh, kh = heads(q, H), heads(k, H)
    s = qh @ kh.transpose(0, 1, 3, 2) / math.sqrt(qh.shape[-1])
    return np.where(causal_mask(q.shape[1]), s, np.asarray(MASKED, s.dtype))


def attn_softmax(s):                      # S -> P, rows over t2 <= t1
    T = s.shape[-1]
    m = np.where(causal_mask(T), s, -np.inf).max(-1, keepdims=True)
    e = np.where(causal_mask(T), np.exp(np.minimum(s - m, 0)), 0)
    return (e / e.sum(-1, keepdims=True)).astype(s.dtype)


def attn_value(p, v, H):                  # P [B,H,T,T], v [B,T,C] -> [B,T,C]
    return merge(p @ heads(v, H))


def attn_fused_sv(q, k, v, H):            # -> out [B,T,C], P [B,H,T,T]
    p = attn_softmax(attn_scores(q, k, H))
    return attn_value(p, v, H), p


def attn_dscores(dout, v, p, H):          # -> dS [B,H,T,T] (scaled by 1/sqrt(hd))
    doh, vh = heads(dout, H), heads(v, H)
    dp = doh @ vh.transpose(0, 1, 3, 2)
    ds = p * (dp - (p * dp).sum(-1, keepdims=True)) / math.sqrt(vh.shape[-1])
    return np.where(causal_mask(p.shape[-1]), ds, 0).astype(p.dtype)


def attn_dq(ds, k, H):
    return merge(ds @ heads(k, H))


def attn_dk(ds, q, H):
    return merge(ds.transpose(0, 1, 3, 2) @ heads(q, H))


def attn_dvalue(p, dout, H):
    return merge(p.transpose(0, 1, 3, 2) @ heads(dout, H))


# ---- online (FlashAttention-2 style), tile by tile -------------------------------------------
def attn_online_forward(q, k, v, H, BQ=32, BK=32):
    """-> out [B,T,C], L [B,H,T] (logsumexp of each row's scaled scores).

    Each (b, h, query tile) walks key tiles 0.. up to the diagonal; each row
    keeps m (running max), l (running sum) and o (unnormalised output) and
    rescales them by exp(m_old - m_new) when a tile raises the max."""
    qh, kh, vh = heads(q, H), heads(k, H), heads(v, H)
    B, _, T, hd = qh.shape
    scale = 1.0 / math.sqrt(hd)
    out = np.zeros_like(qh)
    L = np.zeros((B, H, T), q.dtype)
    for b in range(B):
        for h in range(H):
            for q0 in range(0, T, BQ):
                rows = np.arange(q0, min(q0 + BQ, T))
                m = np.full(len(rows), -np.inf, q.dtype)
                l = np.zeros(len(rows), q.dtype)
                o = np.zeros((len(rows), hd), q.dtype)
                for k0 in range(0, rows[-1] + 1, BK):   # tiles above the diagonal skipped
                    cols = np.arange(k0, min(k0 + BK, T))
                    s = qh[b, h, rows] @ kh[b, h, cols].T * scale          # [rows, cols]
                    s = np.where(cols[None, :] <= rows[:, None], s, -np.inf)
                    m_new = np.maximum(m, s.max(-1))
                    alpha = np.exp(m - m_new)
                    pt = np.exp(s - m_new[:, None])
                    l = l * alpha + pt.sum(-1)
                    o = o * alpha[:, None] + pt @ vh[b, h, cols]
                    m = m_new
                out[b, h, rows] = o / l[:, None]
                L[b, h, rows] = m + np.log(l)
    return merge(out), L


def attn_online_d(dout, out, H):          # D [B,H,T] = rowsum(dO * O) per head
    return (heads(dout, H) * heads(out, H)).sum(-1)


def attn_online_dq(q, k, v, dout, L, D, H, BQ=32, BK=32):
    """dQ rebuilt tile by tile: P = exp(S - L), dS = P * (dO.V^T - D)."""
    qh, kh, vh, doh = heads(q, H), heads(k, H), heads(v, H), heads(dout, H)
    B, _, T, hd = qh.shape
    scale = 1.0 / math.sqrt(hd)
    dq = np.zeros_like(qh)
    for b in range(B):
        for h in range(H):
            for q0 in range(0, T, BQ):
                rows = np.arange(q0, min(q0 + BQ, T))
                for k0 in range(0, rows[-1] + 1, BK):
                    cols = np.arange(k0, min(k0 + BK, T))
                    s = qh[b, h, rows] @ kh[b, h, cols].T * scale
                    p = np.where(cols[None, :] <= rows[:, None], np.exp(s - L[b, h, rows, None]), 0)
                    dp = doh[b, h, rows] @ vh[b, h, cols].T
                    ds = p * (dp - D[b, h, rows, None]) * scale
                    dq[b, h, rows] += ds @ kh[b, h, cols]
    return merge(dq)


def attn_online_dkv(q, k, v, dout, L, D, H, BQ=32, BK=32):
    """dK, dV: each key tile walks the query tiles from its diagonal to the end."""
    qh, kh, vh, doh = heads(q, H), heads(k, H), heads(v, H), heads(dout, H)
    B, _, T, hd = qh.shape
    scale = 1.0 / math.sqrt(hd)
    dk = np.zeros_like(kh)
    dv = np.zeros_like(vh)
    for b in range(B):
        for h in range(H):
            for k0 in range(0, T, BK):
                cols = np.arange(k0, min(k0 + BK, T))
                for q0 in range((k0 // BQ) * BQ, T, BQ):
                    rows = np.arange(q0, min(q0 + BQ, T))
                    s = qh[b, h, rows] @ kh[b, h, cols].T * scale
                    p = np.where(cols[None, :] <= rows[:, None], np.exp(s - L[b, h, rows, None]), 0)
                    dv[b, h, cols] += p.T @ doh[b, h, rows]
                    dp = doh[b, h, rows] @ vh[b, h, cols].T
                    ds = p * (dp - D[b, h, rows, None]) * scale
                    dk[b, h, cols] += ds.T @ qh[b, h, rows]
    return merge(dk), merge(dv)


# online_sg.wgsl walks the same way with 8-row tiles on both sides (one subgroup of 8 lanes per tile)
def attn_online_forward_sg(q, k, v, H):
    return attn_online_forward(q, k, v, H, BQ=8, BK=8)


def attn_online_dq_sg(q, k, v, dout, L, D, H):
    return attn_online_dq(q, k, v, dout, L, D, H, BQ=8, BK=8)


def attn_online_dkv_sg(q, k, v, dout, L, D, H):
    return attn_online_dkv(q, k, v, dout, L, D, H, BQ=8, BK=8)
