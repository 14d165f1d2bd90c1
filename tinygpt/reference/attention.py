"""NumPy twins of the attention kernels, beside the plain reference.

q, k, v, out are [B, T, C] with H heads interleaved in C (head h owns channels
h*hd .. h*hd+hd-1), scale 1/sqrt(hd), causal (t2 <= t1). Every function takes
`window`: a sliding window W > 0 also masks t1 - t2 >= W (a query sees its
last W positions, itself included); 0 or None, or W >= T, is plain causal. `docs`
last: packed windows, several records to a window, docs [B, T] each row's position
in its record: a query sees only the keys of its own record (t2 >= t1 - docs[b, t1]).

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

from .kernels import rope_backward


def heads(x, H):                          # [B,T,C] -> [B,H,T,hd]
    B, T, C = x.shape
    return x.reshape(B, T, H, C // H).transpose(0, 2, 1, 3)


def merge(x):                             # [B,H,T,hd] -> [B,T,C]
    B, H, T, hd = x.shape
    return x.transpose(0, 2, 1, 3).reshape(B, T, H * hd)


def causal_mask(T, window=None):
    """[T, T], True where query t1 sees key t2."""
    t = np.arange(T)
    d = t[:, None] - t[None, :]
    return (d >= 0) & (d < (window or T))


def oldest(t, window):                   # the oldest key query t sees
    return max(0, t + 1 - window) if window else 0


def mask(T, window=None, docs=None):
    """causal_mask [T, T], or with docs [B, T] the packed windows' [B, 1, T, T]: each query sees
    the keys of its own record alone."""
    m = causal_mask(T, window)
    if docs is None:
        return m
    t = np.arange(T)
    first = t[None, :] - np.asarray(docs, np.int64).reshape(-1, T)        # [B, T]: each row's record's first row
    return (m[None] & (t[None, None, :] >= first[:, :, None]))[:, None]


# ---- the plain reference -----------------------------------------------------------------
def attention_forward(q, k, v, H, window=None, docs=None):
    qh, kh, vh = heads(q, H), heads(k, H), heads(v, H)
    s = qh @ kh.transpose(0, 1, 3, 2) / math.sqrt(qh.shape[-1])
    s = np.where(mask(q.shape[1], window, docs), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return merge(p @ vh)


def attention_backward(q, k, v, dout, H, out=None, window=None, docs=None):
    """out: the forward's output as the backward reads it (a bf16 model reads it back rounded):
    D = rowsum(dO * O), which equals rowsum(P * dP) for the exact O."""
    qh, kh, vh, doh = heads(q, H), heads(k, H), heads(v, H), heads(dout, H)
    scale = 1.0 / math.sqrt(qh.shape[-1])
    s = np.where(mask(q.shape[1], window, docs), qh @ kh.transpose(0, 1, 3, 2) * scale, -np.inf)
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


def attn_scores(q, k, H, window=None, docs=None):    # -> S [B,H,T,T], masked entries = MASKED
    qh, kh = heads(q, H), heads(k, H)
    s = qh @ kh.transpose(0, 1, 3, 2) / math.sqrt(qh.shape[-1])
    return np.where(mask(q.shape[1], window, docs), s, np.asarray(MASKED, s.dtype))


def attn_softmax(s, window=None, docs=None):         # S -> P, rows over the keys each query sees
    seen = mask(s.shape[-1], window, docs)
    m = np.where(seen, s, -np.inf).max(-1, keepdims=True)
    e = np.where(seen, np.exp(np.minimum(s - m, 0)), 0)
    return (e / e.sum(-1, keepdims=True)).astype(s.dtype)


# The products with P or dS read the entries each query sees alone, as the kernels' loops do
# (the rest of the stored matrix is written 0 by the kernels and the twins, so a product over it
# all would agree; the mask keeps the twins honest where a test plants values there).
def attn_value(p, v, H, window=None, docs=None):     # P [B,H,T,T], v [B,T,C] -> [B,T,C]
    return merge(np.where(mask(p.shape[-1], window, docs), p, 0) @ heads(v, H))


def attn_fused_sv(q, k, v, H, window=None, docs=None):   # -> out [B,T,C], P [B,H,T,T]
    p = attn_softmax(attn_scores(q, k, H, window, docs), window, docs)
    return attn_value(p, v, H, window, docs), p


def attn_dscores(dout, v, p, H, window=None, docs=None):   # -> dS [B,H,T,T] (scaled by 1/sqrt(hd))
    doh, vh = heads(dout, H), heads(v, H)
    seen = mask(p.shape[-1], window, docs)
    p = np.where(seen, p, 0)
    dp = doh @ vh.transpose(0, 1, 3, 2)
    ds = p * (dp - (p * dp).sum(-1, keepdims=True)) / math.sqrt(vh.shape[-1])
    return np.where(seen, ds, 0).astype(p.dtype)


def attn_dq(ds, k, H, window=None, docs=None):
    return merge(np.where(mask(ds.shape[-1], window, docs), ds, 0) @ heads(k, H))


def attn_dk(ds, q, H, window=None, docs=None):
    return merge(np.where(mask(ds.shape[-1], window, docs), ds, 0).transpose(0, 1, 3, 2) @ heads(q, H))


def attn_dvalue(p, dout, H, window=None, docs=None):
    return merge(np.where(mask(p.shape[-1], window, docs), p, 0).transpose(0, 1, 3, 2) @ heads(dout, H))


# ---- online (FlashAttention-2 style), tile by tile -------------------------------------------
def attn_online_forward(q, k, v, H, BQ=32, BK=32, window=None, docs=None):
    """-> out [B,T,C], L [B,H,T] (logsumexp of each row's scaled scores).

    Each (b, h, query tile) walks the key tiles from the one holding its first row's oldest key
    (0 without a window) up to the diagonal; each row
    keeps m (running max), l (running sum) and o (unnormalised output) and
    rescales them by exp(m_old - m_new) when a tile raises the max."""
    qh, kh, vh = heads(q, H), heads(k, H), heads(v, H)
    B, _, T, hd = qh.shape
    scale = 1.0 / math.sqrt(hd)
    out = np.zeros_like(qh)
    L = np.zeros((B, H, T), q.dtype)
    first = firsts(docs, B, T)
    for b in range(B):
        for h in range(H):
            for q0 in range(0, T, BQ):
                rows = np.arange(q0, min(q0 + BQ, T))
                m = np.full(len(rows), -np.inf, q.dtype)
                l = np.zeros(len(rows), q.dtype)
                o = np.zeros((len(rows), hd), q.dtype)
                for k0 in key_tiles(q0, rows[-1], BK, window):   # tiles above the diagonal skipped
                    cols = np.arange(k0, min(k0 + BK, T))
                    seen = sees(rows, cols, window, first[b])
                    s = qh[b, h, rows] @ kh[b, h, cols].T * scale          # [rows, cols]
                    s = np.where(seen, s, -np.inf)
                    m_new = np.maximum(m, s.max(-1))
                    with np.errstate(invalid="ignore"):                    # -inf - -inf: no key yet
                        alpha = np.where(m_new == -np.inf, 1.0, np.exp(m - m_new))
                        pt = np.where(seen, np.exp(s - m_new[:, None]), 0)
                    l = l * alpha + pt.sum(-1)
                    o = o * alpha[:, None] + pt @ vh[b, h, cols]
                    m = m_new
                out[b, h, rows] = o / l[:, None]
                L[b, h, rows] = m + np.log(l)
    return merge(out), L


def key_tiles(q0, last, BK, window):
    """The key tiles (their first rows) a query tile of rows q0..last walks: from the tile holding
    the oldest key its first row sees to the diagonal."""
    return range(oldest(q0, window) // BK * BK, last + 1, BK)


def query_tiles(k0, kl, T, BQ, window):
    """The query tiles a key tile k0..kl walks: from the tile holding k0 to the last query whose
    window holds one of its keys."""
    end = min(T, kl + window) if window else T
    return range((k0 // BQ) * BQ, end, BQ)


def sees(rows, cols, window, first=None):   # [len(rows), len(cols)]: query row sees key col
    """first: each row of the window's record's first row (packed windows), or None."""
    d = rows[:, None] - cols[None, :]
    seen = (d >= 0) & (d < window) if window else d >= 0
    return seen if first is None else seen & (cols[None, :] >= first[rows][:, None])


def firsts(docs, B, T):                   # -> per window, each row's record's first row (None: no docs)
    if docs is None:
        return [None] * B
    return list(np.arange(T)[None, :] - np.asarray(docs, np.int64).reshape(B, T))


def attn_online_d(dout, out, H):          # D [B,H,T] = rowsum(dO * O) per head
    return (heads(dout, H) * heads(out, H)).sum(-1)


def attn_online_dq(q, k, v, dout, L, D, H, BQ=32, BK=32, window=None, docs=None):
    """dQ rebuilt tile by tile: P = exp(S - L), dS = P * (dO.V^T - D)."""
    qh, kh, vh, doh = heads(q, H), heads(k, H), heads(v, H), heads(dout, H)
    B, _, T, hd = qh.shape
    scale = 1.0 / math.sqrt(hd)
    dq = np.zeros_like(qh)
    first = firsts(docs, B, T)
    for b in range(B):
        for h in range(H):
            for q0 in range(0, T, BQ):
                rows = np.arange(q0, min(q0 + BQ, T))
                for k0 in key_tiles(q0, rows[-1], BK, window):
                    cols = np.arange(k0, min(k0 + BK, T))
                    s = qh[b, h, rows] @ kh[b, h, cols].T * scale
                    p = np.where(sees(rows, cols, window, first[b]), np.exp(s - L[b, h, rows, None]), 0)
                    dp = doh[b, h, rows] @ vh[b, h, cols].T
                    ds = p * (dp - D[b, h, rows, None]) * scale
                    dq[b, h, rows] += ds @ kh[b, h, cols]
    return merge(dq)


def attn_online_dkv(q, k, v, dout, L, D, H, BQ=32, BK=32, window=None, docs=None):
    """dK, dV: each key tile walks the query tiles from its diagonal to the end (or to the last
    query whose window holds one of its keys)."""
    qh, kh, vh, doh = heads(q, H), heads(k, H), heads(v, H), heads(dout, H)
    B, _, T, hd = qh.shape
    scale = 1.0 / math.sqrt(hd)
    dk = np.zeros_like(kh)
    dv = np.zeros_like(vh)
    first = firsts(docs, B, T)
    for b in range(B):
        for h in range(H):
            for k0 in range(0, T, BK):
                cols = np.arange(k0, min(k0 + BK, T))
                for q0 in query_tiles(k0, cols[-1], T, BQ, window):
                    rows = np.arange(q0, min(q0 + BQ, T))
                    s = qh[b, h, rows] @ kh[b, h, cols].T * scale
                    p = np.where(sees(rows, cols, window, first[b]), np.exp(s - L[b, h, rows, None]), 0)
                    dv[b, h, cols] += p.T @ doh[b, h, rows]
                    dp = doh[b, h, rows] @ vh[b, h, cols].T
                    ds = p * (dp - D[b, h, rows, None]) * scale
                    dk[b, h, cols] += ds.T @ qh[b, h, rows]
    return merge(dk), merge(dv)


# online_sg.wgsl walks the same way with 8-row tiles on both sides (one subgroup of 8 lanes per tile)
def attn_online_forward_sg(q, k, v, H, window=None, docs=None):
    return attn_online_forward(q, k, v, H, BQ=8, BK=8, window=window, docs=docs)


def attn_online_dq_sg(q, k, v, dout, L, D, H, window=None, docs=None):
    return attn_online_dq(q, k, v, dout, L, D, H, BQ=8, BK=8, window=window, docs=docs)


def attn_online_dkv_sg(q, k, v, dout, L, D, H, window=None, docs=None):
    return attn_online_dkv(q, k, v, dout, L, D, H, BQ=8, BK=8, window=window, docs=docs)


# a rotary model's dq and dk turned back as they are stored (cs: RoPE's (cos, sin) [T, hd/2, 2];
# q, k, dout [B, T, C], the rows' positions 0..T-1): rope_backward of the plain ones
def _turned_back(cs, g):
    B, T, C = g.shape
    return rope_backward(cs, g.reshape(B * T, C), T, 2 * cs.shape[1]).reshape(B, T, C)


def attn_online_dq_rope(q, k, v, dout, L, D, H, cs, BQ=32, BK=32, window=None):
    return _turned_back(cs, attn_online_dq(q, k, v, dout, L, D, H, BQ, BK, window=window))


def attn_online_dkv_rope(q, k, v, dout, L, D, H, cs, BQ=32, BK=32, window=None):
    dk, dv = attn_online_dkv(q, k, v, dout, L, D, H, BQ, BK, window=window)
    return _turned_back(cs, dk), dv


def attn_online_dq_rope_sg(q, k, v, dout, L, D, H, cs, window=None):
    return _turned_back(cs, attn_online_dq_sg(q, k, v, dout, L, D, H, window))


def attn_online_dkv_rope_sg(q, k, v, dout, L, D, H, cs, window=None):
    dk, dv = attn_online_dkv_sg(q, k, v, dout, L, D, H, window)
    return _turned_back(cs, dk), dv
