"""The NumPy reference: what TinyGPT's C++ reference computes, op by op.

One function per WGSL entry point, with the same name and the kernel's inputs
in binding order; outputs are returned. Every function works in the dtype of
its inputs (float32 to mirror the GPU, float64 to judge it). Forward sits
beside backward. The attention family lives in attention.py, the whole model
(forward, backward, the optimizer step) in gpt.py.

Shapes: B batch, T time, C channels, V vocab, M MLP width, BT = B*T rows.
"""
from __future__ import annotations

import math

import numpy as np

from ..core.config import UNSCORED

from ..core.activations import (erf, gelu_backward, gelu_forward, gelu_tanh_backward,  # noqa: F401  the rooms' twins
                               gelu_tanh_forward, relu2_backward, relu2_forward)


# ---- matmul (weights [in, out]) -------------------------------------------------------
def matmul(a, b, bias=None):            # a [M,K], b [K,N], bias [N] -> [M,N]
    out = a @ b
    return out + bias if bias is not None else out


def matmul_abt(a, b, bias=None):         # a [M,K], b [N,K], bias [N] -> [M,N]
    out = a @ np.swapaxes(b, -1, -2)
    return out + bias if bias is not None else out


def matmul_atb(a, b):                    # a [K,M], b [K,N] -> [M,N]
    return np.swapaxes(a, -1, -2) @ b


# batched (the launchers' batch): a leading axis on every operand, the products side by side


# the vec4 kernels (matmul_vec4.wgsl) compute the same products; only the reads differ
matmul_vec4, matmul_abt_vec4, matmul_atb_vec4 = matmul, matmul_abt, matmul_atb
# and so do the subgroup kernels (matmul_vec4.wgsl's sg section)
matmul_sg, matmul_abt_sg, matmul_atb_sg = matmul, matmul_abt, matmul_atb
# and the workgroup-tiled ones (matmul_tiled.wgsl), which sum k in slices of BK
matmul_tiled, matmul_abt_tiled, matmul_atb_tiled = matmul, matmul_abt, matmul_atb


# ---- bf16 storage (cast.wgsl; common.wgsl's bf16_* helpers) -------------------------------
def bf16_round(x):                       # float32 -> the nearest bf16 values (ties to even), as float32
    # In uint32, in place: one array besides x's float32 bits, where the first form's uint64
    # temporaries took 1.3 GB for a 49,152-token table (the start check of SmolLM2 in bf16).
    # Only a NaN's bits can wrap past 2^32 when rounded, and NaNs are set apart below.
    b = np.ascontiguousarray(x, np.float32).view(np.uint32)
    r = (b >> 16) & 1
    r += 0x7FFF
    r += b
    r >>= 16
    nan = np.isnan(b.view(np.float32))
    if nan.any():
        r[nan] = (b[nan] >> 16) | 0x40
    r <<= 16
    return r.view(np.float32).reshape(np.shape(x))


def cast_bf16(x):                        # float32 [n] -> u32 [ceil(n/2)]: element 2i low, 2i+1 high
    h = (bf16_round(np.ravel(x)).view(np.uint32) >> 16).astype(np.uint32)
    if len(h) % 2:
        h = np.append(h, np.uint32(0))
    return h[0::2] | (h[1::2] << 16)


def cast_f32(xh, n):                     # u32 words -> float32 [n]
    w = np.asarray(xh, np.uint32)
    v = np.stack([w << 16, w & 0xFFFF0000], -1).reshape(-1)[:n]
    return v.astype(np.uint32).view(np.float32)


def unpack_bf16(x):                      # packed u32 [..., n/2] -> float64 [..., n]
    x = np.asarray(x, np.uint32)
    return cast_f32(x, 2 * x.size).reshape(*x.shape[:-1], -1).astype(np.float64)


cast_bf16x8, cast_f32x8 = cast_bf16, cast_f32   # cast.wgsl's x8: the same casts, 8 values an invocation


def _operand(x):                         # packed u32 -> its bf16 values; float32 (A_F32, B_F32) as it is
    return unpack_bf16(x) if np.asarray(x).dtype == np.uint32 else np.asarray(x, np.float64)


def _out(y, out_bf16):                   # OUT_BF16: the float32 result rounded, packed [M, N/2]
    return cast_bf16(np.asarray(y, np.float32)).reshape(len(y), -1) if out_bf16 else y


def matmul_words_sg(a, b, bias=None, out_bf16=False):   # a [M,K/2], b [K,N/2] packed bf16 (or float32) -> [M,N]
    return _out(matmul(_operand(a), _operand(b), bias), out_bf16)


def matmul_abt_words_sg(a, b, out_bf16=False):   # a [M,K/2] (or float32 [M,K]), b [N,K/2] packed -> [M,N]
    return _out(matmul_abt(_operand(a), _operand(b)), out_bf16)


def matmul_atb_words_sg(a, b, out_bf16=False):   # a [K,M/2], b [K,N/2] packed (or float32 [K,N]) -> [M,N]
    return _out(matmul_atb(_operand(a), _operand(b)), out_bf16)


def matmul_rows(a, b, bias=None, out_bf16=False):   # a [M,K], b [K,N]: float32, or packed bf16 [.., /2] -> [M,N]
    return _out(matmul(_operand(a), _operand(b), bias), out_bf16)


def matmul_abt_rows(a, b, bias=None, out_bf16=False):   # a [M,K], b [N,K]: float32, or packed bf16 -> [M,N]
    return _out(matmul_abt(_operand(a), _operand(b), bias), out_bf16)


# the matmul.wgsl template reading bf16 (products.wgsl's float32 products; A_HALF, B_HALF, OUT_HALF), named with the
# dtype it reads: the same products, summed one k at a time
matmul_bf16, matmul_abt_bf16, matmul_atb_bf16 = matmul_words_sg, matmul_abt_words_sg, matmul_atb_words_sg
# the matmul_tiled.wgsl template takes float32 or bf16 operands alike and may write bf16
matmul_tiled, matmul_abt_tiled, matmul_atb_tiled = matmul_words_sg, matmul_abt_words_sg, matmul_atb_words_sg
# so does matmul_quad.wgsl with float32 products (vec4 and sg): the same products of bf16 values
matmul_quad_vec4, matmul_abt_quad_vec4, matmul_atb_quad_vec4 = matmul_words_sg, matmul_abt_words_sg, matmul_atb_words_sg
matmul_quad_sg, matmul_abt_quad_sg, matmul_atb_quad_sg = matmul_words_sg, matmul_abt_words_sg, matmul_atb_words_sg


# ---- f16 storage and arithmetic (the f16 sections of cast, layernorm, elementwise .wgsl; the matmul templates)
def f16_round(x):                        # float32 -> the nearest f16 values (ties to even, inf past 65504), as float32
    with np.errstate(over="ignore"):
        return np.asarray(x, np.float32).astype(np.float16).astype(np.float32)


def cast_f16(x):                         # float32 [n] -> u32 [ceil(n/2)]: element 2i low, 2i+1 high
    with np.errstate(over="ignore"):
        h = np.ravel(np.asarray(x, np.float32)).astype(np.float16)
    if len(h) % 2:
        h = np.append(h, np.float16(0))
    return h.view(np.uint32).copy()


def cast_f16_to_f32(xh, n):              # u32 words -> float32 [n], exact
    return np.ascontiguousarray(xh, np.uint32).view(np.float16)[:n].astype(np.float32)


def unpack_f16(x):                       # packed u32 [..., n/2] -> float64 [..., n]
    x = np.ascontiguousarray(x, np.uint32)
    return x.view(np.float16).reshape(*x.shape[:-1], -1).astype(np.float64)


def _half(x):                            # an f16 operand (packed u32), or float32 rounded to f16 as it is read
    x = np.asarray(x)
    return unpack_f16(x) if x.dtype == np.uint32 else f16_round(x).astype(np.float64)


def _f16_products(a, b):                 # a [M,K] @ b [K,N], each product rounded to f16, the sum in float64
    out = np.zeros((a.shape[0], b.shape[1]))
    a16, b16 = a.astype(np.float32), b.astype(np.float32)   # f16 values: their products are exact in float32
    step = max(1, (1 << 22) // max(1, a.shape[0] * b.shape[1]))
    with np.errstate(over="ignore", invalid="ignore"):
        for k0 in range(0, a.shape[1], step):
            p = a16[:, k0:k0 + step, None] * b16[None, k0:k0 + step, :]
            out += p.astype(np.float16).astype(np.float64).sum(axis=1)
    return out


def _out16(y, out_f16):                  # OUT_F16: the float32 result rounded to f16, packed [M, N/2]
    return cast_f16(y).reshape(len(y), -1) if out_f16 else y


# the matmul.wgsl template completed with f16 products (products.wgsl's f16 section), named as the gate names it
def matmul_f16(a, b, bias=None, out_f16=False):   # a [M,K], b [K,N]: f16 (packed u32) or float32
    y = _f16_products(_half(a), _half(b))
    return _out16(y + (0 if bias is None else np.asarray(bias, np.float64)), out_f16)


def matmul_abt_f16(a, b, out_f16=False):          # a [M,K], b [N,K] -> [M,N]
    return _out16(_f16_products(_half(a), _half(b).T), out_f16)


def matmul_atb_f16(a, b, out_f16=False):          # a [K,M], b [K,N] -> [M,N]
    return _out16(_f16_products(_half(a).T, _half(b)), out_f16)


# the matmul_quad.wgsl template (vec4, and its sg section) and the tiled one with f16 products: the same
# f16 products, summed in other float32 orders
matmul_f16_quad_vec4, matmul_abt_f16_quad_vec4, matmul_atb_f16_quad_vec4 = matmul_f16, matmul_abt_f16, matmul_atb_f16
matmul_f16_tiled, matmul_abt_f16_tiled, matmul_atb_f16_tiled = matmul_f16, matmul_abt_f16, matmul_atb_f16
matmul_f16_quad_sg, matmul_abt_f16_quad_sg, matmul_atb_f16_quad_sg = matmul_f16, matmul_abt_f16, matmul_atb_f16


# ---- an activation stored in 16 bits (elementwise.wgsl's {{ACT}}_forward, _backward with bf16 or f16) ----------
def stored_forward(forward, xh, dtype):  # packed x (bf16 or f16 words) -> packed forward(x), one rounding
    if dtype == "bf16":                  # computed in x's float32 values, as the kernel does
        return cast_bf16(forward(cast_f32(xh, 2 * np.size(xh))))
    return cast_f16(forward(unpack_f16(np.ravel(xh))))


def stored_backward(backward, xh, dy, dtype):   # packed x, dy -> d(x) in dy's precision
    x = unpack_bf16(np.ravel(xh)[None])[0] if dtype == "bf16" else unpack_f16(np.ravel(xh))
    return backward(x.astype(np.asarray(dy).dtype), dy)


def stored_layernorm_forward(x, g, b, dtype, eps=1e-5, rms=False):   # float32 x -> y packed [rows, C/2], mean, rstd
    y, mean, rstd = layernorm_forward(x, g, b, eps, rms)   # (layernorm.wgsl's forward with a bf16 or f16 section)
    return (cast_bf16 if dtype == "bf16" else cast_f16)(y).reshape(len(x), -1), mean, rstd


# ---- elementwise ----------------------------------------------------------------------
def add(x, y):
    return x + y


def scale(x, s):                          # -> x * s (LoRA's alpha / rank), rounded to float32 as stored
    return x * np.float32(s) if np.asarray(x).dtype == np.float32 else x * s


def accumulate(x, out):                   # -> out + x (the kernel writes it into out)
    return out + x


# elementwise.wgsl at the vec4 width: the same, read as vec4
add4, gelu_forward4, gelu_backward4, accumulate4 = add, gelu_forward, gelu_backward, accumulate
relu2_forward4, relu2_backward4 = relu2_forward, relu2_backward


def bias_grad(dy):                       # dy [rows, N] -> [N]
    return dy.sum(axis=0)


bias_grad_sg = bias_grad                 # elementwise.wgsl's sg section: summed by subgroups, in another order


# ---- layernorm ------------------------------------------------------------------------
def layernorm_forward(x, g, b, eps=1e-5, rms=False):  # x [rows,C] -> y [rows,C], mean [rows], rstd [rows]
    """rms: RMSNorm (no centring, no bias: b unread), its mean 0."""
    mean = np.zeros(len(x), x.dtype) if rms else x.mean(axis=-1)
    var = ((x - mean[:, None]) ** 2).mean(axis=-1)
    rstd = 1.0 / np.sqrt(var + eps)
    y = (x - mean[:, None]) * rstd[:, None] * g + (0.0 if rms else b)
    return y, mean, rstd


def layernorm_dx(dy, x, g, mean, rstd, rms=False):
    xhat = (x - mean[:, None]) * rstd[:, None]
    dxhat = dy * g
    centre = 0.0 if rms else dxhat.mean(-1, keepdims=True)
    return rstd[:, None] * (dxhat - centre - xhat * (dxhat * xhat).mean(-1, keepdims=True))


# layernorm.wgsl at the vec4 width: the same, rows read as vec4
layernorm_forward4, layernorm_dx4 = layernorm_forward, layernorm_dx


def layernorm_dgb(dy, x, mean, rstd, rms=False):    # -> dg [C], db [C] (RMSNorm's: dg, None)
    xhat = (x - mean[:, None]) * rstd[:, None]
    return (dy * xhat).sum(0), None if rms else dy.sum(0)


layernorm_dgb_sg = layernorm_dgb         # layernorm.wgsl's sg section: summed by subgroups, in another order


# ---- rotary position embedding (rope.wgsl) ----------------------------------------------
def _turn(cs, x, T, hd, offset, sign, docs=None):
    rows, C = x.shape
    pos = np.arange(rows) % T + offset if docs is None else np.asarray(docs, np.int64).reshape(rows)
    c, s = cs[pos, :, 0][:, None, :], sign * cs[pos, :, 1][:, None, :]
    h = x.reshape(rows, C // hd, hd)
    x1, x2 = h[..., :hd // 2], h[..., hd // 2:]
    return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], -1).reshape(rows, C)


# docs: packed windows' positions of each row in its record [rows], in place of r % T + offset
def rope_forward(cs, x, T, hd, offset=0, docs=None):     # x [rows, C] -> x turned by its rows' positions
    return _turn(cs, x, T, hd, offset, 1.0, docs)


def rope_backward(cs, dy, T, hd, offset=0, docs=None):   # d(out) -> d(in): the turn by minus the angle
    return _turn(cs, dy, T, hd, offset, -1.0, docs)


def matmul_rope_vec4(a, b, bias, cs, T, hd, offset=0):   # (a @ b + bias) turned: a rotary model's q or k
    return rope_forward(cs, matmul(a, b, bias), T, hd, offset)


def matmul_abt_rope_vec4(a, b, cs, T, hd, offset=0, acc=None):   # (acc + a @ b^T) turned (a LoRA's last product)
    return rope_forward(cs, matmul_abt(a, b) + (0.0 if acc is None else acc), T, hd, offset)


# the same turned products with the sg kernels' walk (matmul_vec4.wgsl's sg section), and in
# workgroup tiles (matmul_tiled.wgsl)
matmul_rope_sg, matmul_abt_rope_sg = matmul_rope_vec4, matmul_abt_rope_vec4
matmul_rope_tiled, matmul_abt_rope_tiled = matmul_rope_vec4, matmul_abt_rope_vec4


def qk_norm_rope(cs, xr, g, T, hd, offset=0, eps=1e-5, docs=None):   # -> (x turned after RMSNorm, stats [2, heads])
    rows, C = xr.shape
    y, mean, rstd = layernorm_forward(xr.reshape(-1, hd), g, None, eps, rms=True)
    return rope_forward(cs, y.reshape(rows, C), T, hd, offset, docs), np.stack([mean, rstd])


def qk_norm_rope_dx(cs, dy, xr, g, stats, T, hd, offset=0, docs=None):   # qk_norm_rope's gradient to xr (g frozen)
    rows, C = dy.shape
    dyt = rope_backward(cs, dy, T, hd, offset, docs).reshape(-1, hd)
    return layernorm_dx(dyt, xr.reshape(-1, hd), g, stats[0], stats[1], rms=True).reshape(rows, C)


# ---- the gated MLP's activation (glu.wgsl) ----------------------------------------------
def swiglu_forward(gate, up):            # -> silu(gate) * up
    return gate / (1.0 + np.exp(-gate)) * up


def swiglu_backward(gate, up, dy):       # -> (dgate, dup)
    s = 1.0 / (1.0 + np.exp(-gate))
    return dy * up * s * (1.0 + gate * (1.0 - s)), dy * gate * s


# ---- grouped-query attention (heads.wgsl) -----------------------------------------------
def kv_expand(x, H, KV):                 # x [rows, KV*hd] -> [rows, H*hd]: query head h takes kv head h // (H/KV)
    rows, hd = len(x), x.shape[1] // KV
    return np.repeat(x.reshape(rows, KV, hd), H // KV, axis=1).reshape(rows, H * hd)


def kv_reduce(dx, H, KV):                # dx [rows, H*hd] -> [rows, KV*hd]: kv_expand's gradient
    rows, hd = len(dx), dx.shape[1] // H
    return dx.reshape(rows, KV, H // KV, hd).sum(2).reshape(rows, KV * hd)


# ---- embedding ------------------------------------------------------------------------
def embed_forward(tokens, tok, pos, v0=0, out=None, docs=None):  # tokens [B,T] -> [B,T,C]
    """tok holds rows v0 .. v0+n-1 of the table; positions whose token lies elsewhere keep out's.
    pos None: no position table (a rotary model's). docs [B,T]: packed windows' positions of each
    row in its record, the rows of pos added (else t)."""
    T = tokens.shape[1]
    if out is None:
        out = np.zeros(tokens.shape + tok.shape[1:], tok.dtype)
    out = out.copy()
    mine = (tokens >= v0) & (tokens < v0 + len(tok))
    at = 0.0 if pos is None else pos[None, :T] if docs is None else \
        pos[np.asarray(docs, np.int64).reshape(tokens.shape)]
    out[mine] = (tok[np.where(mine, tokens - v0, 0)] + at)[mine]
    return out


def embed_tok_grad(offsets, positions, dout, v0=0, n=None):  # dout [BT,C] -> dtok rows v0 .. v0+n-1 [n,C]
    V = len(offsets) - 1
    n = V - v0 if n is None else n
    out = np.zeros((n, dout.shape[-1]), dout.dtype)
    for v in range(v0, v0 + n):
        sel = positions[offsets[v]:offsets[v + 1]]
        if len(sel):
            out[v - v0] = dout[sel].sum(0)
    return out


def embed_pos_grad(dout):                # dout [B,T,C] -> dpos [T,C]
    return dout.sum(0)


# ---- the tied head, split over bindings (embed.wgsl's copy_block) -----------------------------------
def copy_block(src, out, rows, cols, src_stride, src_col, out_stride, out_col):  # flat arrays -> out
    out = out.copy()
    for r in range(rows):
        out[r * out_stride + out_col:][:cols] = src[r * src_stride + src_col:][:cols]
    return out


# ---- loss -----------------------------------------------------------------------------
def cross_entropy(targets, logits, scale, softcap=0.0):  # logits [rows,V] -> losses [rows], dlogits [rows,V]
    """softcap: the logits were capped at it (softcap): dlogits are the uncapped logits'. A target
    of UNSCORED scores nothing: its row's loss and gradient are 0."""
    targets = np.asarray(targets, np.int64)
    scored = targets != UNSCORED
    tg = np.where(scored, targets, 0)
    m = logits.max(-1, keepdims=True)
    e = np.exp(logits - m)
    s = e.sum(-1, keepdims=True)
    rows = np.arange(len(targets))
    losses = np.where(scored, (m[:, 0] + np.log(s[:, 0])) - logits[rows, tg], 0.0).astype(logits.dtype)
    d = e / s
    d[rows, tg] -= 1.0
    if softcap:
        d = d * (1.0 - (logits / softcap) ** 2)
    return losses, d * scale * scored[:, None]


def softcap(logits, cap):               # -> cap * tanh(logits / cap): nanochat's logit soft-cap
    return cap * np.tanh(logits / cap)


cross_entropy_sg = cross_entropy         # loss.wgsl's sg section: the same, one subgroup per row


def loss_reduce(losses, scale):
    return losses.sum() * scale


# ---- preference (DPO) -----------------------------------------------------------------
def dpo(refs, losses, pairs, T, beta, wscale, lscale):  # -> (weights [2 pairs], loss)
    """Window 2i the chosen completion, 2i+1 the rejected; a window's log-probability is minus the
    sum of its T rows' losses; refs the reference's (the shader reads their float32 bits)."""
    lp = -np.asarray(losses)[:2 * pairs * T].reshape(2 * pairs, T).sum(1)
    refs = np.asarray(refs, lp.dtype)[:2 * pairs]
    z = beta * ((lp[0::2] - refs[0::2]) - (lp[1::2] - refs[1::2]))
    g = beta * (1.0 - 1.0 / (1.0 + np.exp(-z))) * wscale
    weights = np.empty(2 * pairs, lp.dtype)
    weights[0::2], weights[1::2] = g, -g
    return weights, np.logaddexp(0.0, -z).sum() * lscale


def scale_rows(weights, logits, rows, stride, T, row0=0):   # dlogits [rows, stride] * each window's weight
    w = np.asarray(weights)[(row0 + np.arange(rows)) // T]
    return np.asarray(logits).reshape(rows, stride) * w[:, None]


# ---- optimizer ------------------------------------------------------------------------
def grad_sumsq(g, chunk=4096, gate=None):   # g flat -> partial sums of squares per chunk
    """gate (SCALED: the gate of a loss scaler, kernels.GATE's names): g carries its scale, which
    is divided out as g is squared; a chunk holding an inf or NaN sums to -1."""
    n = -(-len(g) // chunk)
    if gate is None:
        return np.array([np.sum(g[i * chunk:(i + 1) * chunk] ** 2) for i in range(n)], g.dtype)
    inv = 1.0 / gate["scale"]
    parts = [g[i * chunk:(i + 1) * chunk] for i in range(n)]
    return np.array([np.sum((c * inv) ** 2) if np.all(np.isfinite(c)) else -1.0 for c in parts], g.dtype)


def grad_clip(partials, clip, gate=None, growth=None):   # -> (norm, factor)
    """The gate (updated in place where given): norm, factor, skip 0, one more step taken. With
    growth, the loss scaler's rules (GradScaler's): a -1 partial skips the step (factor 0), halves
    the scale and zeroes the clean count; else the factor unscales too, and `growth` clean steps in
    a row double the scale. The norm of a skipped step: the last one's."""
    if growth is None:
        norm = math.sqrt(float(np.sum(partials)))
        factor = clip / (norm + 1e-6) if norm > clip else 1.0
        if gate is not None:
            gate.update(norm=norm, factor=factor, skip=0, taken=gate["taken"] + 1)
        return norm, factor
    if np.any(np.asarray(partials) < 0):
        gate.update(factor=0.0, scale=gate["scale"] * 0.5, skip=1, clean=0, skipped=gate["skipped"] + 1)
        return gate["norm"], 0.0
    norm = math.sqrt(float(np.sum(partials)))
    factor = (clip / (norm + 1e-6) if norm > clip else 1.0) / gate["scale"]
    clean = gate["clean"] + 1
    grow = clean >= growth
    gate.update(norm=norm, factor=factor, scale=gate["scale"] * (2.0 if grow else 1.0), skip=0,
                clean=0 if grow else clean, taken=gate["taken"] + 1)
    return norm, factor


# optim.wgsl's elementwise optimizers (adamw, lion, sgd) have their twins in their rooms
# (model.optimizers), beside the WGSL they write; grad_sumsq4 (grad_norm.wgsl at the vec4 width)
# reads grad_sumsq's as vec4
# (grad_sumsq4 adds each chunk in another order)
grad_sumsq4 = grad_sumsq


def muon_momentum(g, gate, m, u, beta, nesterov=True):
    """m = beta m + (1 - beta) g (in place), and the update direction into u: (1 - beta) g + beta m
    with Nesterov, else m; nothing where the gate skips."""
    if gate["skip"]:
        return
    g = g * gate["factor"]
    m[...] = beta * m + (1 - beta) * g
    u[...] = (1 - beta) * g + beta * m if nesterov else m


def muon_normalize(x, eps):
    """x / max(|x|_F, eps); batched (x [batch, K, N]), each matrix by its own norm"""
    norm = np.sqrt(np.sum(np.asarray(x, np.float64) ** 2, axis=(-2, -1), keepdims=True))
    return x / np.maximum(norm, eps)


def ns_mix(x, y, a, b):
    return a * x + b * y


def muon_update(x, gate, w, lr, wd, ratio):
    """w -= lr (ratio x + wd w), in place; nothing where the gate skips."""
    if not gate["skip"]:
        w[...] = w - lr * (ratio * x + wd * w)


# ---- decoding from a key/value cache, and sampling (decode.wgsl) ---------------------------------
def embed_decode(ids, tok, pos, at, v0=0, out=None):  # ids [N] -> x [N,C]: token rows + position row `at`
    """tok holds rows v0 .. v0+n-1 of the table; sequences whose token lies elsewhere keep out's."""
    out = np.zeros((len(ids), tok.shape[1]), tok.dtype) if out is None else out.copy()
    mine = (ids >= v0) & (ids < v0 + len(tok))
    out[mine] = tok[ids[mine] - v0] + (0.0 if pos is None else pos[at])
    return out


def kv_append(k, v, kc, vc, at):          # k, v [N,W] -> caches [N,T,W] with row `at` written (words: any dtype)
    kc, vc = kc.copy(), vc.copy()
    kc[:, at], vc[:, at] = k, v
    return kc, vc


def attn_decode(q, kc, vc, at, H, window=None):   # q [N,C], caches [N,T,KV*hd] -> [N,C] over rows 0..at
    N, C = q.shape                                 # (with a window W, over the last W of them)
    hd = C // H
    KV = kc.shape[-1] // hd                        # each key/value head serves H / KV query heads
    lo = max(0, at + 1 - window) if window else 0
    n = at + 1 - lo
    rows = lambda c: kv_expand(c[:, lo:at + 1].reshape(N * n, KV * hd), H, KV).reshape(N, n, H, hd)
    qh = q.reshape(N, H, 1, hd)
    kh = rows(kc).transpose(0, 2, 3, 1)                                   # [N,H,hd,rows]
    vh = rows(vc).transpose(0, 2, 1, 3)                                   # [N,H,rows,hd]
    s = (qh @ kh)[:, :, 0] / math.sqrt(hd)                                 # [N,H,rows]
    w = np.exp(s - s.max(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)
    return (w[:, :, None] @ vh)[:, :, 0].reshape(N, C)


attn_decode4 = attn_decode                # q, k and v read a vec4 at a time: the same attention


def stored_attn_decode(q, kc, vc, at, H, dtype, window=None):   # packed [N,C/2], [N,T,W/2] -> [N,C]
    unpack = unpack_f16 if dtype == "f16" else unpack_bf16   # (attn_decode with decode.wgsl's bf16 or f16 section)
    return attn_decode(unpack(q), unpack(kc), unpack(vc), at, H, window)


def pcg(v):                               # PCG-RXS-M-XS on uint32 (as decode.wgsl)
    s = (int(v) * 747796405 + 2891336453) & 0xFFFFFFFF
    w = (((s >> ((s >> 28) + 4)) ^ s) * 277803737) & 0xFFFFFFFF
    return (w >> 22) ^ w


def draw(seed, n, step):                  # u in [0, 1) for sequence n's token `step`
    lo, hi = int(seed) & 0xFFFFFFFF, (int(seed) >> 32) & 0xFFFFFFFF
    return (pcg(pcg(pcg(pcg(lo) ^ hi) ^ n) ^ step) >> 8) / 16777216.0


def sample_tokens(logits, temperature, top_k, top_p, seed, step):  # logits [N,V] -> ids [N]
    """Greedy at temperature 0; else top-k (ties kept), then top-p (the largest logits whose
    softmax mass reaches top_p, ties kept), then the first index whose running sum of
    exp(z - max) over the eligible tokens passes draw() times their total."""
    out = []
    for n, row in enumerate(np.asarray(logits, np.float32)):
        if temperature <= 0:
            out.append(int(np.argmax(row)))
            continue
        z = (row / np.float32(temperature)).astype(np.float64)
        keep = np.ones(len(z), bool)
        if top_k and top_k < len(z):
            keep = z >= np.partition(z, -top_k)[-top_k]
        e = np.exp(z - z.max())
        if top_p < 1:
            vals = np.sort(z[keep])[::-1]
            mass = np.cumsum(np.exp(vals - z.max()))
            cut = vals[min(int(np.searchsorted(mass, top_p * e[keep].sum())), len(vals) - 1)]
            keep &= z >= cut
        w = np.where(keep, e, 0.0)
        cum = np.cumsum(w)
        i = int(np.searchsorted(cum, draw(seed, n, step) * cum[-1], side="right"))
        out.append(i if i < len(z) and keep[i] else int(np.flatnonzero(keep)[-1]))
    return np.asarray(out, np.uint32)


# ---- adapter probes (scripts/probe_adapter.py): what they compute, to validate before timing ------------
def probe_fma(iters, n):                  # -> [n, 4]: 8 chains x <- x*0.999 + 0.001 from gid+k, summed
    x0 = np.arange(n, dtype=np.float64)[:, None] + np.arange(8)[None, :]
    xn = (x0 - 1.0) * 0.999 ** iters + 1.0  # the fixed point of x*0.999 + 0.001 is 1
    return np.repeat(xn.sum(1, keepdims=True), 4, axis=1)


def probe_load_lane(src4, iters, n):      # src4 [n4, 4] -> [n, 4]
    idx = (np.arange(n)[:, None] + 64 * np.arange(iters)[None, :]) % len(src4)
    return src4[idx].sum(1)


def probe_load_wg(src4, iters, n):
    idx = ((np.arange(n) // 64)[:, None] + 64 * np.arange(iters)[None, :]) % len(src4)
    return src4[idx].sum(1)


def probe_load_shared(src4, iters, n):
    idx = ((np.arange(n) % 64)[:, None] + 7 * np.arange(iters)[None, :]) & 1023
    return src4[:1024][idx].sum(1)


def probe_broadcast(iters, n):            # -> [n, 4]: sum over steps t of chain k of lane k, k < 8
    base = (np.arange(n) // 8) * 8        # the subgroup's lane 0
    r = 0.999
    geo = r * (1 - r ** iters) / (1 - r)  # sum of r^t, t = 1..iters
    x0 = base[:, None] + 2.0 * np.arange(8)[None, :]  # chain k of lane k starts at (base + k) + k
    total = ((x0 - 1.0) * geo + iters).sum(1)
    return np.repeat(total[:, None], 4, axis=1)
