"""One launcher per WGSL entry point: its bindings and its grid.

The only place that knows binding numbers. Each launcher builds its bind
group once and returns a Dispatch that the caller replays every step.
Arguments follow the reference: inputs in binding order, then outputs, then sizes.
None stands for an absent optional binding; gpu.dispatch binds a dummy there.
"""
from __future__ import annotations

import math

from .gpu import Dispatch, grid1d


# ---- matmul ----------------------------------------------------------------------------
MM_TILE = 4 * 8      # scalar kernels: rows (and cols) of output per workgroup, TM * WG
VEC_WX = 8           # invocations per workgroup of the vec4 kernels (4 columns each); `tinygpt tune` may pick another
VEC_ROWS = 16        # rows per workgroup of the vec4 kernels (the sg ones: sg_tile)
SG_LANES = 8         # invocations per workgroup of the sg kernels (one subgroup)


def vec4_ok(entry, M, N, K) -> bool:
    """The vec4 and sg kernels need K and N (and M for A^T @ B) to be multiples of 4."""
    return N % 4 == 0 and K % 4 == 0 and (M % 4 == 0 or entry != "matmul_atb")


def subgroups_ok(gpu) -> bool:
    """Whether matmul_sg.wgsl computes right on this device: the subgroup feature is on and
    its lane indexing holds (subgroups of 8 or more lanes holding a workgroup). Asked once:
    all three kernels against NumPy at shapes with ragged edges."""
    if gpu.sg_checked is None:
        gpu.sg_checked = "subgroup" in gpu.features and _sg_agrees(gpu)
    return gpu.sg_checked


def _sg_agrees(gpu) -> bool:
    import numpy as np
    M, N, Kd = 60, 60, 12  # 32-row tiles, 2 column blocks, the last of each partly past M and N
    r = np.random.default_rng(7)
    a, b, bias = r.standard_normal((M, Kd)), r.standard_normal((Kd, N)), r.standard_normal(N)
    at, bt = r.standard_normal((Kd + 1, M)), r.standard_normal((Kd + 1, N))  # odd K for A^T @ B
    up = lambda x: gpu.upload(x.astype(np.float32))
    out = gpu.tensor((M, N))
    try:
        for d, want in ((_mm(gpu, "matmul", up(a), up(b), up(bias), out, M, N, Kd, False, "sg"), a @ b + bias),
                        (_mm(gpu, "matmul_abt", up(a), up(b.T), None, out, M, N, Kd, False, "sg"), a @ b),
                        (_mm(gpu, "matmul_atb", up(at), up(bt), None, out, M, N, Kd + 1, False, "sg"), at.T @ bt)):
            gpu.run([d])
            if not np.allclose(gpu.read(out), want, rtol=1e-4, atol=1e-4):
                return False
    except Exception:  # a compiler that refuses the kernels counts as no
        return False
    return True


def sg_blocks(N, most=3) -> int:
    """Column blocks per lane of the sg kernels: 2 or 3 (about equally fast, 1.27x faster than 1)
    unless that leaves over 1/8 of the lanes computing columns past N; 2 first, having fewer
    accumulators to spill. N = 96: 24 vec4 columns fill 1 workgroup of 3 blocks exactly."""
    n4 = N // 4
    for nc in (2, 3)[:most - 1]:
        if -(-n4 // (8 * nc)) * 8 * nc - n4 <= n4 // 8:
            return nc
    return 1


def sg_tile(M, N) -> tuple:
    """(rows per workgroup, column blocks per lane) of an sg matmul. 32 rows where M wastes at most
    1/8 of them (lavapipe, A @ B: 42 -> 46 GFLOP/s at 1024^3, 22 -> 40 at 1024x96x384; A^T @ B:
    21.6 -> 18.6 ms per small-preset step), with at most 2 column blocks (2 x 32 rows already
    spill); else 16."""
    if -(-M // 32) * 32 - M <= M // 8:
        return 32, sg_blocks(N, most=2)
    return 16, sg_blocks(N)


def use_sg(gpu, key) -> bool:
    """Whether to take a subgroup kernel: by default on CPU adapters, where they measured fastest
    (see each sg file), elsewhere when `tinygpt tune` chose "sg" for `key`; only where they work."""
    want = gpu.tuning.get(key) or ("sg" if gpu.is_cpu else "")
    return want == "sg" and subgroups_ok(gpu)


def mm_variant(gpu, entry, M, N, K) -> str:
    """sg where subgroups work (default on CPU adapters, where it measured fastest; elsewhere
    when `tinygpt tune` chose it), else vec4 where the shape allows, else scalar."""
    if not vec4_ok(entry, M, N, K):
        return "scalar"
    return "sg" if use_sg(gpu, "matmul_variant") else "vec4"


def _mm(gpu, entry, a, b, bias, out, M, N, K, accumulate, variant=None):
    variant = variant or mm_variant(gpu, entry, M, N, K)
    if variant == "sg":
        tm, nc = sg_tile(M, N)
        k = gpu.kernel("matmul_sg.wgsl", entry + "_sg", "urrrw", {"NC": nc, "TM": tm})
        grid = (-(-N // (4 * SG_LANES * nc)), -(-M // tm))
        return gpu.dispatch(k, (M, N, K, bias is not None, accumulate), [a, b, bias, out], grid)
    if variant == "vec4":
        wx = int(gpu.tuning.get("matmul_wx", VEC_WX))
        k = gpu.kernel("matmul_vec4.wgsl", entry + "_vec4", "urrrw", {"WX": wx})
        grid = (-(-N // (4 * wx)), -(-M // VEC_ROWS))
        return gpu.dispatch(k, (M, N, K, bias is not None, accumulate), [a, b, bias, out], grid)
    k = gpu.kernel("matmul.wgsl", entry, "urrrw")
    grid = (-(-N // MM_TILE), -(-M // MM_TILE))
    has_bias = bias is not None
    return gpu.dispatch(k, (M, N, K, has_bias, accumulate), [a, b, bias, out], grid)


def matmul(gpu, a, b, bias, out, M, N, K, accumulate=False, variant=None) -> Dispatch:  # out = a[M,K] @ b[K,N] + bias
    return _mm(gpu, "matmul", a, b, bias, out, M, N, K, accumulate, variant)


def matmul_abt(gpu, a, b, out, M, N, K, accumulate=False, variant=None) -> Dispatch:    # out = a[M,K] @ b[N,K]^T
    return _mm(gpu, "matmul_abt", a, b, None, out, M, N, K, accumulate, variant)


def matmul_atb(gpu, a, b, out, M, N, K, accumulate=False, variant=None) -> Dispatch:    # out = a[K,M]^T @ b[K,N]
    return _mm(gpu, "matmul_atb", a, b, None, out, M, N, K, accumulate, variant)


# ---- elementwise -------------------------------------------------------------------------
# variant=None picks the fastest set the shape and adapter allow; "scalar", "vec4" or "sg" forces
# one (scripts/bench_kernels.py compares them; the caller answers for the shape).
def _ew(gpu, entry, x, y, out, n, cols=0, groups=None, variant=None):
    variant = variant or ("vec4" if n % 4 == 0 and groups is None else "scalar")
    if variant == "vec4":  # elementwise4.wgsl: 16 floats per invocation as 4 vec4
        k = gpu.kernel("elementwise4.wgsl", entry + "4", "urrw")
        return gpu.dispatch(k, (n, cols), [x, y, out], grid1d(-(-n // (64 * 16))))
    k = gpu.kernel("elementwise.wgsl", entry, "urrw")
    return gpu.dispatch(k, (n, cols), [x, y, out], grid1d(groups or -(-n // 64)))


def add(gpu, x, y, out, n, variant=None):
    return _ew(gpu, "add", x, y, out, n, variant=variant)


def gelu_forward(gpu, x, out, n, variant=None):
    return _ew(gpu, "gelu_forward", x, None, out, n, variant=variant)


def gelu_backward(gpu, x, dy, out, n, variant=None):
    return _ew(gpu, "gelu_backward", x, dy, out, n, variant=variant)


def bias_grad(gpu, dy, out, rows, cols, variant=None):
    variant = variant or ("sg" if cols % 4 == 0 and use_sg(gpu, "reduce_variant") else "scalar")
    if variant == "sg":  # one 8-lane subgroup per 4 columns
        k = gpu.kernel("elementwise_sg.wgsl", "bias_grad_sg", "urrw")
        return gpu.dispatch(k, (rows, cols), [dy, None, out], grid1d(cols // 4))
    return _ew(gpu, "bias_grad", dy, None, out, rows, cols, groups=-(-cols // 64))


# ---- layernorm ---------------------------------------------------------------------------
def _ln_file(entry, C, variant=None):
    """layernorm4.wgsl (rows read as vec4) where C is a multiple of 4."""
    variant = variant or ("vec4" if C % 4 == 0 else "scalar")
    return ("layernorm4.wgsl", entry + "4") if variant == "vec4" else ("layernorm.wgsl", entry)


def layernorm_forward(gpu, x, gb, y, stats, rows, C, eps=1e-5, variant=None):
    """gb = [g | b] packed [2, C]; stats = [mean | rstd] packed [2, rows]."""
    k = gpu.kernel(*_ln_file("layernorm_forward", C, variant), "urrrww")
    return gpu.dispatch(k, (rows, C, float(eps), 0), [x, gb, None, y, stats], (-(-rows // 64),))


def layernorm_dx(gpu, dy, x, g, stats, dx, rows, C, accumulate=True, variant=None):
    k = gpu.kernel(*_ln_file("layernorm_dx", C, variant), "urrrww")
    return gpu.dispatch(k, (rows, C, 0.0, accumulate), [dy, x, g, dx, stats], (-(-rows // 64),))


def layernorm_dgb(gpu, dy, x, stats, dgb, rows, C, variant=None):
    variant = variant or ("sg" if C % 4 == 0 and use_sg(gpu, "reduce_variant") else "scalar")
    if variant == "sg":  # one 8-lane subgroup per 4 channels
        k = gpu.kernel("layernorm_sg.wgsl", "layernorm_dgb_sg", "urrrww")
        return gpu.dispatch(k, (rows, C, 0.0, 0), [dy, x, stats, dgb, None], grid1d(C // 4))
    k = gpu.kernel("layernorm.wgsl", "layernorm_dgb", "urrrww")
    return gpu.dispatch(k, (rows, C, 0.0, 0), [dy, x, stats, dgb, None], (-(-C // 64),))


# ---- embedding ---------------------------------------------------------------------------
def embed_forward(gpu, tokens, tok, pos, out, B, T, C):
    k = gpu.kernel("embed.wgsl", "embed_forward", "urrrw")
    return gpu.dispatch(k, (B, T, C, 0, 0), [tokens, tok, pos, out], grid1d(-(-B * T * C // 64)))


def embed_tok_grad(gpu, buckets, dout, dtok, B, T, C, V, accumulate=True):
    """buckets = [offsets (V+1) | positions (B*T)] as u32."""
    k = gpu.kernel("embed.wgsl", "embed_tok_grad", "urrrw")
    return gpu.dispatch(k, (B, T, C, V, accumulate), [buckets, dout, None, dtok], grid1d(-(-V * C // 64)))


def embed_pos_grad(gpu, dout, dpos, B, T, C):
    k = gpu.kernel("embed.wgsl", "embed_pos_grad", "urrrw")
    return gpu.dispatch(k, (B, T, C, 0, 0), [None, dout, None, dpos], grid1d(-(-T * C // 64)))


# ---- loss --------------------------------------------------------------------------------
def cross_entropy(gpu, targets, logits, losses, rows, V, scale, write_grad=True, row0=0, stride=None,
                  variant=None):
    """stride: floats between logit rows (>= V; the padded vocabulary). loss_sg.wgsl (one 8-lane
    subgroup per row, no barriers) where rows are whole vec4 and the sg kernels are in use."""
    stride = stride or V
    variant = variant or ("sg" if stride % 4 == 0 and use_sg(gpu, "loss_variant") else "scalar")
    if variant == "sg":
        k = gpu.kernel("loss_sg.wgsl", "cross_entropy_sg", "urww")
        return gpu.dispatch(k, (rows, V, float(scale), write_grad, row0, stride), [targets, logits, losses],
                            grid1d(rows))
    k = gpu.kernel("loss.wgsl", "cross_entropy", "urww")
    return gpu.dispatch(k, (rows, V, float(scale), write_grad, row0, stride), [targets, logits, losses],
                        grid1d(rows))


def loss_reduce(gpu, losses, loss, rows, scale):
    k = gpu.kernel("loss.wgsl", "loss_reduce", "urww")
    return gpu.dispatch(k, (rows, 0, float(scale), 0, 0, 0), [None, loss, losses], (1,))


# ---- optimizer ---------------------------------------------------------------------------
CHUNK = 4096


def _opt(gpu, entry):
    return gpu.kernel("optim.wgsl", entry, "urrwwww")


def _opt4(gpu, entry, n, variant=None):
    """optim4.wgsl (vec4) where n is a multiple of 4, as the model's flat buffers always are."""
    variant = variant or ("vec4" if n % 4 == 0 else "scalar")
    return gpu.kernel("optim4.wgsl", entry + "4", "urrwwww") if variant == "vec4" else _opt(gpu, entry)


def grad_sumsq(gpu, g, partials, n, variant=None):
    return gpu.dispatch(_opt4(gpu, "grad_sumsq", n, variant), (n,) + (0.0,) * 7, [g, None, partials, None, None, None],
                        grid1d(-(-n // CHUNK)))


def grad_clip(gpu, partials, stats, n_partials, clip):
    return gpu.dispatch(_opt(gpu, "grad_clip"), (n_partials, float(clip)) + (0.0,) * 6,
                        [None, partials, stats, None, None, None], (1,))


def adamw(gpu, g, wd_table, stats, w, m, v, n, step_uniform, variant=None):
    """step_uniform: a uniform buffer holding (n, clip, lr, beta1, beta2, eps, bc1, bc2), rewritten each step."""
    return gpu.dispatch_with(_opt4(gpu, "adamw", n, variant), step_uniform, [g, wd_table, stats, w, m, v], grid1d(-(-n // 256)))


# ---- attention ---------------------------------------------------------------------------
def _attn(gpu, entry, x1, x2, x3, o1, o2, B, T, C, H, h0, nh, n_inv):
    hd = C // H
    k = gpu.kernel("attention.wgsl", entry, "urrrww", {"HD4": -(-hd // 32) * 8})
    return gpu.dispatch(k, (B, T, C, hd, h0, nh, 1.0 / math.sqrt(hd)),
                        [x1, x2, x3, o1, o2], grid1d(-(-n_inv // 64)))


def attn_scores(gpu, q, k, S, B, T, C, H, h0=0, nh=None):
    nh = nh or H
    return _attn(gpu, "attn_scores", q, k, None, S, None, B, T, C, H, h0, nh, B * nh * T * T)


def attn_softmax(gpu, S, B, T, C, H, h0=0, nh=None):
    nh = nh or H
    return _attn(gpu, "attn_softmax", None, None, None, S, None, B, T, C, H, h0, nh, B * nh * T)


def attn_value(gpu, P, v, out, B, T, C, H, h0=0, nh=None):
    nh = nh or H
    return _attn(gpu, "attn_value", P, v, None, out, None, B, T, C, H, h0, nh, B * T * nh * (C // H))


def attn_fused_sv(gpu, q, k, v, out, P, B, T, C, H, h0=0, nh=None):
    nh = nh or H
    return _attn(gpu, "attn_fused_sv", q, k, v, out, P, B, T, C, H, h0, nh, B * nh * T)


def attn_dscores(gpu, dout, v, P, dS, B, T, C, H, h0=0, nh=None):
    nh = nh or H
    return _attn(gpu, "attn_dscores", dout, v, P, dS, None, B, T, C, H, h0, nh, B * nh * T)


def attn_dq(gpu, dS, k, dq, B, T, C, H, h0=0, nh=None):
    nh = nh or H
    return _attn(gpu, "attn_dq", dS, k, None, dq, None, B, T, C, H, h0, nh, B * T * nh * (C // H))


def attn_dk(gpu, dS, q, dk, B, T, C, H, h0=0, nh=None):
    nh = nh or H
    return _attn(gpu, "attn_dk", dS, q, None, dk, None, B, T, C, H, h0, nh, B * T * nh * (C // H))


def attn_dvalue(gpu, P, dout, dv, B, T, C, H, h0=0, nh=None):
    nh = nh or H
    return _attn(gpu, "attn_dvalue", P, dout, None, dv, None, B, T, C, H, h0, nh, B * T * nh * (C // H))


def online_tiles(gpu, hd, T=None):
    """(BQ, BK): BK key rows whose two [BK, hd] tiles (hd padded, + L, D) fit workgroup memory, at most 32;
    BQ query rows share each tile: 128 by default (lavapipe, T=2048, hd=64, fwd / dq ms: BQ 32: 342 / 344,
    64: 301 / 320, 128: 289 / 294), or what `tinygpt tune` chose. Neither exceeds T rounded up to a
    power of two: at T=64 a 128-row workgroup would leave half its lanes idle (forward 28 -> 48 ms)."""
    limit = int(gpu.limits.get("max-compute-workgroup-storage-size", 16384))
    hd4 = -(-hd // 32) * 8
    tuned = gpu.tuning.get("online_block")
    if tuned and online_fits(gpu, hd, *tuned):
        bq, bk = tuned
    else:
        bk = 32
        while bk > 1 and (2 * bk * 4 * hd4 + 2 * bk) * 4 > limit:
            bk //= 2
        bq = min(128, int(gpu.limits.get("max-compute-invocations-per-workgroup", 256)))
    if T:
        p2 = 1 << max(0, int(T) - 1).bit_length()
        bq, bk = min(bq, p2), min(bk, p2)
    return int(bq), int(bk)


def online_fits(gpu, hd, bq, bk) -> bool:
    limit = int(gpu.limits.get("max-compute-workgroup-storage-size", 16384))
    inv = int(gpu.limits.get("max-compute-invocations-per-workgroup", 256))
    return bq <= inv and bk <= min(inv, 64) and (2 * bk * 4 * (-(-hd // 32) * 8) + 2 * bk) * 4 <= limit


def online_variant(gpu, T=0, hd=0) -> str:
    """sg (online_sg.wgsl) where subgroups work: by default on CPU adapters, where it measured
    fastest, elsewhere when `tinygpt tune` chose it; else the workgroup-memory tiles (online.wgsl).
    On a CPU adapter sg also has to stay under llvmpipe's loop cap: a lane makes up to
    6 * ceil(hd / 32) + 2 loop trips per block of 8 rows (T up to ~20,000 at hd = 128)."""
    trips = -(-T // SG_LANES) * (6 * -(-hd // 32) + 2)
    fits = not gpu.is_cpu or trips <= gpu.LOOP_CAP
    return "sg" if fits and use_sg(gpu, "online_variant") else "tiles"


def _online(gpu, entry, ins, o1, o2, B, T, C, H, groups, block=None):
    hd = C // H
    bq, bk = block or online_tiles(gpu, hd, T)
    k = gpu.kernel("online.wgsl", entry, "urrrrrrww", {"HD": hd, "HD4": -(-hd // 32) * 8, "BQ": bq, "BK": bk})
    ins = list(ins) + [None] * (6 - len(ins))
    return gpu.dispatch(k, (B, T, C, H, 1.0 / math.sqrt(hd)), ins + [o1, o2], groups)


def _online_sg(gpu, entry, ins, o1, o2, B, T, C, H):
    """One workgroup (a subgroup of 8 lanes) per 8 rows of each (b, h)."""
    hd = C // H
    consts = {"HD": hd, "HD4": -(-hd // 32) * 8, "ALIGNED": hd % 4 == 0 and C % 4 == 0}
    k = gpu.kernel("online_sg.wgsl", entry + "_sg", "urrrrrrww", consts)
    ins = list(ins) + [None] * (6 - len(ins))
    return gpu.dispatch(k, (B, T, C, H, 1.0 / math.sqrt(hd)), ins + [o1, o2], (B * H * -(-T // SG_LANES),))


def attn_online_forward(gpu, q, k, v, out, L, B, T, C, H, block=None, variant=None):
    if (variant or online_variant(gpu, T, C // H)) == "sg":
        return _online_sg(gpu, "attn_online_forward", [q, k, v], out, L, B, T, C, H)
    bq, _ = block or online_tiles(gpu, C // H, T)
    return _online(gpu, "attn_online_forward", [q, k, v], out, L, B, T, C, H, (B * H * -(-T // bq),), block)


def attn_online_d(gpu, dout, out, D, B, T, C, H, block=None):
    return _online(gpu, "attn_online_d", [dout, out], D, None, B, T, C, H, grid1d(-(-B * H * T // 64)), block)


def attn_online_dq(gpu, q, k, v, dout, L, D, dq, B, T, C, H, block=None, variant=None):
    if (variant or online_variant(gpu, T, C // H)) == "sg":
        return _online_sg(gpu, "attn_online_dq", [q, k, v, dout, L, D], dq, None, B, T, C, H)
    bq, _ = block or online_tiles(gpu, C // H, T)
    return _online(gpu, "attn_online_dq", [q, k, v, dout, L, D], dq, None, B, T, C, H, (B * H * -(-T // bq),), block)


def attn_online_dkv(gpu, q, k, v, dout, L, D, dk, dv, B, T, C, H, block=None, variant=None):
    if (variant or online_variant(gpu, T, C // H)) == "sg":
        return _online_sg(gpu, "attn_online_dkv", [q, k, v, dout, L, D], dk, dv, B, T, C, H)
    _, bk = block or online_tiles(gpu, C // H, T)
    return _online(gpu, "attn_online_dkv", [q, k, v, dout, L, D], dk, dv, B, T, C, H, (B * H * -(-T // bk),), block)
