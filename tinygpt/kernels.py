"""One launcher per WGSL entry point: its bindings and its grid.

The only place that knows binding numbers. Each launcher builds its bind
group once and returns a Dispatch that the caller replays every step.
Arguments follow the reference: inputs in binding order, then outputs, then sizes.
None stands for an absent optional binding; gpu.dispatch binds a dummy there.
Which variant runs: `variant=` forces one; otherwise the kernel plan's choice for
the family (plan.py; PORTABLE when no plan is given), where the shape allows it.
"""
from __future__ import annotations

import math

from .config import ADAMW_BETA1, ADAMW_BETA2, ADAMW_EPS
from .gpu import Dispatch, grid1d
from .plan import PORTABLE, KernelPlan


# ---- matmul ----------------------------------------------------------------------------
MM_TILE = 4 * 8      # scalar kernels: rows (and cols) of output per workgroup, TM * WG
VEC_ROWS = 16        # rows per workgroup of the vec4 kernels (the sg ones: sg_tile)
SG_LANES = 8         # invocations per workgroup of the sg kernels (one subgroup)


def vec4_ok(entry, M, N, K) -> bool:
    """The vec4 and sg kernels need K and N (and M for A^T @ B) to be multiples of 4."""
    return N % 4 == 0 and K % 4 == 0 and (M % 4 == 0 or entry != "matmul_atb")


def subgroups_ok(gpu) -> bool:
    """Whether the sg kernels compute right on this device (plan.subgroup_verdict, asked once)."""
    from .plan import subgroup_verdict
    return subgroup_verdict(gpu) == "ok"


def check_subgroups(gpu) -> str:
    """"ok" if matmul_sg.wgsl's lane indexing holds on this device (subgroups of 8 or more
    lanes holding a workgroup), else why not: all three kernels against NumPy at ragged shapes."""
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
                return f"unusable (the sg matmul {d.kernel.name} disagrees with NumPy on this device)"
    except Exception as e:  # a compiler that refuses the kernels counts as no
        return f"unusable (the sg kernels do not build here: {str(e).splitlines()[0][:120]})"
    return "ok"


def sg_blocks(N, most=3) -> int:
    """Column blocks per lane of the sg kernels: 2 or 3 (about equally fast, both faster than 1:
    README, "How the subgroup matmul was shaped") unless that leaves over 1/8 of the lanes computing
    columns past N; 2 first, having fewer accumulators to spill. N = 96: 24 vec4 columns fill 1 workgroup of 3 blocks exactly."""
    n4 = N // 4
    for nc in (2, 3)[:most - 1]:
        if -(-n4 // (8 * nc)) * 8 * nc - n4 <= n4 // 8:
            return nc
    return 1


def sg_tile(M, N) -> tuple:
    """(rows per workgroup, column blocks per lane) of an sg matmul. 32 rows where M wastes at most
    1/8 of them (faster for all three products on lavapipe: README, "How the subgroup matmul was
    shaped"), with at most 2 column blocks (2 x 32 rows already spill); else 16."""
    if -(-M // 32) * 32 - M <= M // 8:
        return 32, sg_blocks(N, most=2)
    return 16, sg_blocks(N)


def tile_problem(gpu, tile) -> str | None:
    """Why matmul_tiled.wgsl cannot run with tile (WX, WY, TM, TV, BK) on this device, or None."""
    wx, wy, tm, tv, bk = tile
    lim = gpu.limits
    if not (1 <= tm <= 8 and 1 <= tv <= 2 and bk % 4 == 0 and bk > 0 and (wy * tm) % 4 == 0):
        return f"tile {tile}: TM 1-8, TV 1-2, BK and WY*TM multiples of 4"
    if wx * wy > int(lim.get("max-compute-invocations-per-workgroup", 256)):
        return f"{wx * wy} invocations per workgroup, over the device's {lim.get('max-compute-invocations-per-workgroup')}"
    if wx > int(lim.get("max-compute-workgroup-size-x", 256)) or wy > int(lim.get("max-compute-workgroup-size-y", 256)):
        return f"workgroup {wx} x {wy} over the device's size limits"
    shared = 4 * bk * (wy * tm + 4 * wx * tv)
    if shared > int(lim.get("max-compute-workgroup-storage-size", 16384)):
        return f"{shared:,} bytes of workgroup memory, over the device's {lim.get('max-compute-workgroup-storage-size'):,}"
    return None


def mm_variant(plan: KernelPlan, entry, M, N, K) -> str:
    """The plan's matmul variant where the shape allows it (sg and vec4 need whole vec4), else scalar."""
    return plan.matmul if vec4_ok(entry, M, N, K) else "scalar"


def _mm(gpu, entry, a, b, bias, out, M, N, K, accumulate, variant=None, plan=None, bf16=None):
    """bf16: the bf16 override constants of matmul_tiled.wgsl (_mm_bf16 passes them)."""
    plan = plan or PORTABLE
    variant = variant or mm_variant(plan, entry, M, N, K)
    if variant == "sg":
        tm, nc = sg_tile(M, N)
        k = gpu.kernel("matmul_sg.wgsl", entry + "_sg", "urrrw", {"NC": nc, "TM": tm})
        grid = (-(-N // (4 * SG_LANES * nc)), -(-M // tm))
        return gpu.dispatch(k, (M, N, K, bias is not None, accumulate), [a, b, bias, out], grid)
    if variant == "tiled":   # matmul_tiled.wgsl: workgroup tiles of BM x BN, TM x 4TV per invocation
        wx, wy, tm, tv, bk = plan.matmul_tile
        k = gpu.kernel("matmul_tiled.wgsl", entry + "_tiled", "urrrw",
                       {"WX": wx, "WY": wy, "TM": tm, "TV": tv, "BK": bk, **(bf16 or {})})
        grid = (-(-N // (4 * wx * tv)), -(-M // (wy * tm)))
        return gpu.dispatch(k, (M, N, K, bias is not None, accumulate), [a, b, bias, out], grid)
    if variant == "vec4":
        wx = plan.matmul_wx
        k = gpu.kernel("matmul_vec4.wgsl", entry + "_vec4", "urrrw", {"WX": wx})
        grid = (-(-N // (4 * wx)), -(-M // VEC_ROWS))
        return gpu.dispatch(k, (M, N, K, bias is not None, accumulate), [a, b, bias, out], grid)
    k = gpu.kernel("matmul.wgsl", entry, "urrrw")
    grid = (-(-N // MM_TILE), -(-M // MM_TILE))
    has_bias = bias is not None
    return gpu.dispatch(k, (M, N, K, has_bias, accumulate), [a, b, bias, out], grid)


def matmul(gpu, a, b, bias, out, M, N, K, accumulate=False, variant=None, plan=None) -> Dispatch:
    """out[M,N] = a[M,K] @ b[K,N] + bias[N]"""
    return _mm(gpu, "matmul", a, b, bias, out, M, N, K, accumulate, variant, plan)


def matmul_abt(gpu, a, b, out, M, N, K, accumulate=False, variant=None, plan=None) -> Dispatch:
    """out[M,N] = a[M,K] @ b[N,K]^T"""
    return _mm(gpu, "matmul_abt", a, b, None, out, M, N, K, accumulate, variant, plan)


def matmul_atb(gpu, a, b, out, M, N, K, accumulate=False, variant=None, plan=None) -> Dispatch:
    """out[M,N] = a[K,M]^T @ b[K,N]"""
    return _mm(gpu, "matmul_atb", a, b, None, out, M, N, K, accumulate, variant, plan)


# ---- bf16 (bf16.wgsl, matmul_bf16_sg.wgsl) ------------------------------------------------
def cast_bf16(gpu, x, out, n, variant=None):
    """out (u32 [ceil(n/2)]) = x (f32 [n]) as bf16, two to a word, rounded to nearest even.
    variant: "x8" (bf16x8.wgsl, 8 values an invocation) where n is a multiple of 8, else "scalar"."""
    if (variant or ("x8" if n % 8 == 0 else "scalar")) == "x8":
        k = gpu.kernel("bf16x8.wgsl", "cast_bf16x8", "urrww")
        return gpu.dispatch(k, (n,), [x, None, out, None], grid1d(-(-n // (8 * 64))))
    k = gpu.kernel("bf16.wgsl", "cast_bf16", "urrww")
    return gpu.dispatch(k, (n,), [x, None, out, None], grid1d(-(-n // 128)))


def cast_f32(gpu, xh, out, n, variant=None):
    """out (f32 [n]) = the bf16 values of xh; "x8" where n is a multiple of 8, as cast_bf16."""
    if (variant or ("x8" if n % 8 == 0 else "scalar")) == "x8":
        k = gpu.kernel("bf16x8.wgsl", "cast_f32x8", "urrww")
        return gpu.dispatch(k, (n,), [None, xh, None, out], grid1d(-(-n // (8 * 64))))
    k = gpu.kernel("bf16.wgsl", "cast_f32", "urrww")
    return gpu.dispatch(k, (n,), [None, xh, None, out], grid1d(-(-n // 64)))


def gelu_forward_bf16(gpu, xh, outh, n):
    """outh = bf16(gelu(xh)): n values, a multiple of 8, two to a u32 on both sides."""
    assert n % 8 == 0, n
    k = gpu.kernel("elementwise_bf16.wgsl", "gelu_forward_bf16", "urrww")
    return gpu.dispatch(k, (n, 0), [xh, None, outh, None], grid1d(-(-n // (8 * 64 * 2))))


def gelu_backward_bf16(gpu, xh, dy, out, n):
    """out (f32) = dy * gelu'(xh), xh bf16 (the saved pre-activation), n a multiple of 8."""
    assert n % 8 == 0, n
    k = gpu.kernel("elementwise_bf16.wgsl", "gelu_backward_bf16", "urrww")
    return gpu.dispatch(k, (n, 0), [xh, dy, None, out], grid1d(-(-n // (8 * 64 * 2))))


def bf16_ok(entry, M, N, K) -> bool:
    """matmul_bf16_sg.wgsl reads 8 bf16 at a time: K and N multiples of 8 (and M for A^T @ B)."""
    return N % 8 == 0 and K % 8 == 0 and (M % 8 == 0 or entry != "matmul_atb")


def bf16_variant(plan: KernelPlan, entry, M, N, K) -> str:
    """The bf16 form of the plan's matmul family: tiled (matmul_tiled.wgsl with bf16 tile loads) for
    tiled, matmul_bf16_sg.wgsl for sg (and vec4, which has no bf16 form, where subgroups work),
    matmul_bf16.wgsl ("plain") otherwise and for shapes the 8-wide kernels cannot take."""
    if not bf16_ok(entry, M, N, K):
        return "plain"
    if plan.matmul == "tiled":
        return "tiled"
    if plan.matmul in ("sg", "vec4") and plan.subgroups == "ok":
        return "sg"
    return "plain"


def bf16_blocks(N) -> int:
    """Column blocks of 4 per lane of matmul_bf16_sg.wgsl: 2 (64-column workgroups) unless that
    leaves over 1/8 of the lanes past N, as N = 96 does; then 1 (32 columns: 96 in 3 exactly)."""
    n8 = N // 8
    return 2 if -(-n8 // 8) * 8 - n8 <= n8 // 8 else 1


def bf16_rows(M) -> int:
    """Rows per workgroup of matmul_bf16_sg.wgsl's A @ B and A @ B^T: 64 (each B word loaded for
    twice the rows) unless that leaves over 1/8 of the rows past M; then 32."""
    return 64 if -(-M // 64) * 64 - M <= M // 8 else 32


def _mm_bf16(gpu, entry, a, b, bias, out, M, N, K, accumulate, variant=None, plan=None, nb=None, tm=None):
    """variant: the plan's (bf16_variant): "tiled", "sg" (matmul_bf16_sg.wgsl) or "plain"
    (matmul_bf16.wgsl: any shape; a bf16 tensor is packed flat, element e in half e & 1 of word e/2).
    Each tensor's dtype says its storage: a "u32" operand holds bf16, an "f32" one float32 (the
    backward's float32 gradients; any operand but B of A @ B^T); a "u32" out is written as bf16."""
    plan = plan or PORTABLE
    variant = variant or bf16_variant(plan, entry, M, N, K)
    if variant == "tiled":   # matmul_tiled.wgsl, its tile loads reading bf16 (A_BF16, B_BF16)
        assert bf16_ok(entry, M, N, K), (entry, M, N, K)
        assert not (accumulate and out.dtype == "u32"), entry
        consts = {n: True for n, on in (("A_BF16", a.dtype == "u32"), ("B_BF16", b.dtype == "u32"),
                                        ("OUT_BF16", out.dtype == "u32")) if on}
        return _mm(gpu, entry, a, b, bias, out, M, N, K, accumulate, "tiled", plan, consts)
    consts = {n: True for n, on in (("A_F32", a.dtype == "f32"), ("B_F32", b.dtype == "f32"),
                                    ("OUT_BF16", out.dtype == "u32")) if on}
    assert not (entry == "matmul_abt" and "B_F32" in consts), (entry, consts)
    assert not (accumulate and "OUT_BF16" in consts) and (N % 2 == 0 or "OUT_BF16" not in consts), (entry, consts)
    params = (M, N, K, bias is not None, accumulate)
    if variant == "sg":
        assert bf16_ok(entry, M, N, K), (entry, M, N, K)
        nb = bf16_blocks(N) if nb is None else nb
        tm = tm or bf16_rows(M)
        k = gpu.kernel("matmul_bf16_sg.wgsl", entry + "_bf16_sg", "urrrw", {**consts, "NB": nb, "TM": tm})
        return gpu.dispatch(k, params, [a, b, bias, out], (-(-N // (4 * nb * SG_LANES)), -(-M // tm)))
    k = gpu.kernel("matmul_bf16.wgsl", entry + "_bf16", "urrrw", consts)
    return gpu.dispatch(k, params, [a, b, bias, out], (-(-N // 32), -(-M // 32)))


def matmul_bf16(gpu, a, b, bias, out, M, N, K, accumulate=False, variant=None, plan=None, nb=None, tm=None):
    """out[M,N] (f32) = a[M,K] @ b[K,N] (+ bias[N]); a and b bf16, as u32 tensors of half the floats;
    float32 sums. Either operand may be float32 instead, and out bf16 (_mm_bf16). nb, tm: the sg
    kernel's column blocks per lane and rows per workgroup (bf16_blocks(N), bf16_rows(M) if None)."""
    return _mm_bf16(gpu, "matmul", a, b, bias, out, M, N, K, accumulate, variant, plan, nb, tm)


def matmul_abt_bf16(gpu, a, b, out, M, N, K, accumulate=False, variant=None, plan=None, nb=None, tm=None):
    """out[M,N] = a[M,K] @ b[N,K]^T, b bf16, a bf16 or float32"""
    return _mm_bf16(gpu, "matmul_abt", a, b, None, out, M, N, K, accumulate, variant, plan, nb, tm)


def matmul_atb_bf16(gpu, a, b, out, M, N, K, accumulate=False, variant=None, plan=None, nb=None, tm=None):
    """out[M,N] = a[K,M]^T @ b[K,N], a and b each bf16 or float32"""
    return _mm_bf16(gpu, "matmul_atb", a, b, None, out, M, N, K, accumulate, variant, plan, nb, tm)


# ---- elementwise -------------------------------------------------------------------------
# variant=None takes the plan's choice where the shape allows; "scalar", "vec4" or "sg" forces
# one (scripts/bench_kernels.py compares them; the caller answers for the shape).
def _ew(gpu, entry, x, y, out, n, cols=0, groups=None, variant=None, plan=None):
    variant = variant or ("vec4" if (plan or PORTABLE).elementwise == "vec4" and n % 4 == 0 and groups is None
                          else "scalar")
    if variant == "vec4":  # elementwise4.wgsl: 16 floats per invocation as 4 vec4
        k = gpu.kernel("elementwise4.wgsl", entry + "4", "urrw")
        return gpu.dispatch(k, (n, cols), [x, y, out], grid1d(-(-n // (64 * 16))))
    k = gpu.kernel("elementwise.wgsl", entry, "urrw")
    return gpu.dispatch(k, (n, cols), [x, y, out], grid1d(groups or -(-n // 64)))


def add(gpu, x, y, out, n, variant=None, plan=None):
    return _ew(gpu, "add", x, y, out, n, variant=variant, plan=plan)


def accumulate(gpu, x, out, n, variant=None, plan=None):
    """out += x (out is read and written: a buffer other than x)."""
    return _ew(gpu, "accumulate", x, None, out, n, variant=variant, plan=plan)


def gelu_forward(gpu, x, out, n, variant=None, plan=None):
    return _ew(gpu, "gelu_forward", x, None, out, n, variant=variant, plan=plan)


def gelu_backward(gpu, x, dy, out, n, variant=None, plan=None):
    return _ew(gpu, "gelu_backward", x, dy, out, n, variant=variant, plan=plan)


def bias_grad(gpu, dy, out, rows, cols, variant=None, plan=None):
    variant = variant or ("sg" if cols % 4 == 0 and (plan or PORTABLE).reduce == "sg" else "scalar")
    if variant == "sg":  # one 8-lane subgroup per 4 columns
        k = gpu.kernel("elementwise_sg.wgsl", "bias_grad_sg", "urrw")
        return gpu.dispatch(k, (rows, cols), [dy, None, out], grid1d(cols // 4))
    return _ew(gpu, "bias_grad", dy, None, out, rows, cols, groups=-(-cols // 64))


# ---- layernorm ---------------------------------------------------------------------------
def _ln_file(entry, C, variant=None, plan=None):
    """layernorm4.wgsl (rows read as vec4) where C is a multiple of 4."""
    variant = variant or ("vec4" if (plan or PORTABLE).elementwise == "vec4" and C % 4 == 0 else "scalar")
    return ("layernorm4.wgsl", entry + "4") if variant == "vec4" else ("layernorm.wgsl", entry)


def layernorm_forward(gpu, x, gb, y, stats, rows, C, eps=1e-5, variant=None, plan=None):
    """gb = [g | b] packed [2, C]; stats = [mean | rstd] packed [2, rows]."""
    k = gpu.kernel(*_ln_file("layernorm_forward", C, variant, plan), "urrrww")
    return gpu.dispatch(k, (rows, C, float(eps), 0), [x, gb, None, y, stats], (-(-rows // 64),))


def layernorm_forward_bf16(gpu, x, gb, yh, stats, rows, C, eps=1e-5):
    """layernorm_forward with y written as bf16 (u32 [rows, C/2]); C a multiple of 8."""
    assert C % 8 == 0, C
    k = gpu.kernel("layernorm_bf16.wgsl", "layernorm_forward_bf16", "urrww")
    return gpu.dispatch(k, (rows, C, float(eps), 0), [x, gb, yh, stats], (-(-rows // 64),))


def layernorm_dx(gpu, dy, x, g, stats, dx, rows, C, accumulate=True, variant=None, plan=None):
    k = gpu.kernel(*_ln_file("layernorm_dx", C, variant, plan), "urrrww")
    return gpu.dispatch(k, (rows, C, 0.0, accumulate), [dy, x, g, dx, stats], (-(-rows // 64),))


def layernorm_dgb(gpu, dy, x, stats, dgb, rows, C, variant=None, plan=None):
    variant = variant or ("sg" if C % 4 == 0 and (plan or PORTABLE).reduce == "sg" else "scalar")
    if variant == "sg":  # one 8-lane subgroup per 4 channels
        k = gpu.kernel("layernorm_sg.wgsl", "layernorm_dgb_sg", "urrrww")
        return gpu.dispatch(k, (rows, C, 0.0, 0), [dy, x, stats, dgb, None], grid1d(C // 4))
    k = gpu.kernel("layernorm.wgsl", "layernorm_dgb", "urrrww")
    return gpu.dispatch(k, (rows, C, 0.0, 0), [dy, x, stats, dgb, None], (-(-C // 64),))


# ---- embedding ---------------------------------------------------------------------------
def embed_forward(gpu, tokens, tok, pos, out, B, T, C, v0=0, n=None):
    """tok: the token table's rows v0 .. v0+n-1 (all of it by default); only the positions whose
    token lies there are written, so one dispatch per chunk of rows writes every position once."""
    n = tok.shape[0] if n is None else n
    k = gpu.kernel("embed.wgsl", "embed_forward", "urrrw")
    return gpu.dispatch(k, (B, T, C, 0, 0, v0, n), [tokens, tok, pos, out], grid1d(-(-B * T * C // 64)))


def embed_tok_grad(gpu, buckets, dout, dtok, B, T, C, V, accumulate=True, v0=0, n=None):
    """buckets = [offsets (V+1) | positions (B*T)] as u32; dtok: rows v0 .. v0+n-1 (all V by default)."""
    n = V if n is None else n
    k = gpu.kernel("embed.wgsl", "embed_tok_grad", "urrrw")
    return gpu.dispatch(k, (B, T, C, V, accumulate, v0, n), [buckets, dout, None, dtok], grid1d(-(-n * C // 64)))


def embed_pos_grad(gpu, dout, dpos, B, T, C):
    k = gpu.kernel("embed.wgsl", "embed_pos_grad", "urrrw")
    return gpu.dispatch(k, (B, T, C, 0, 0, 0, 0), [None, dout, None, dpos], grid1d(-(-T * C // 64)))


def copy_block(gpu, src, out, rows, cols, src_stride, src_col, out_stride, out_col):
    """out[r, out_col + c] = src[r, src_col + c] (head.wgsl): a column block of the logits."""
    k = gpu.kernel("head.wgsl", "copy_block", "urw")
    return gpu.dispatch(k, (rows, cols, src_stride, src_col, out_stride, out_col), [src, out],
                        grid1d(-(-rows * cols // 64)))


# ---- loss --------------------------------------------------------------------------------
def cross_entropy(gpu, targets, logits, losses, rows, V, scale, write_grad=True, row0=0, stride=None,
                  variant=None, plan=None):
    """stride: floats between logit rows (>= V; the padded vocabulary). loss_sg.wgsl (one 8-lane
    subgroup per row, no barriers) where rows are whole vec4 and the plan chose sg."""
    stride = stride or V
    variant = variant or ("sg" if stride % 4 == 0 and (plan or PORTABLE).loss == "sg" else "scalar")
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
NO_CLIP = 3.0e38                                        # a clip threshold no norm reaches


def adamw_uniform(n: int, clip: float, lr: float, t: int) -> bytes:
    """optim(4).wgsl's Params for step t (1-based): n, clip (0 = never), lr, beta1, beta2, eps and the
    bias corrections 1 - beta^t, computed in float64 and stored as float32."""
    import numpy as np
    u = np.array([0, clip if clip > 0 else NO_CLIP, lr, ADAMW_BETA1, ADAMW_BETA2, ADAMW_EPS,
                  1 - ADAMW_BETA1 ** t, 1 - ADAMW_BETA2 ** t], np.float32).view(np.uint32)
    u[0] = n
    return u.tobytes()


def _opt(gpu, entry):
    return gpu.kernel("optim.wgsl", entry, "urrwwww")


def _opt4(gpu, entry, n, variant=None, plan=None):
    """optim4.wgsl (vec4) where n is a multiple of 4, as the model's flat buffers always are."""
    variant = variant or ("vec4" if (plan or PORTABLE).elementwise == "vec4" and n % 4 == 0 else "scalar")
    return gpu.kernel("optim4.wgsl", entry + "4", "urrwwww") if variant == "vec4" else _opt(gpu, entry)


def grad_sumsq(gpu, g, partials, n, variant=None, plan=None):
    return gpu.dispatch(_opt4(gpu, "grad_sumsq", n, variant, plan), (n,) + (0.0,) * 7, [g, None, partials, None, None, None],
                        grid1d(-(-n // CHUNK)))


def grad_clip(gpu, partials, stats, n_partials, clip):
    return gpu.dispatch(_opt(gpu, "grad_clip"), (n_partials, float(clip)) + (0.0,) * 6,
                        [None, partials, stats, None, None, None], (1,))


def adamw(gpu, g, wd_table, stats, w, m, v, n, step_uniform, variant=None, plan=None):
    """step_uniform: adamw_uniform(...) in a uniform buffer, rewritten each step."""
    return gpu.dispatch_with(_opt4(gpu, "adamw", n, variant, plan), step_uniform, [g, wd_table, stats, w, m, v], grid1d(-(-n // 256)))


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


def online_tiles(gpu, hd, T=None, plan=None):
    """(BQ, BK): BK key rows whose two [BK, hd] tiles (hd padded, + L, D) fit workgroup memory, at most 32;
    BQ query rows share each tile: 128 by default (fastest of 32, 64, 128 on lavapipe: README), or
    the plan's online_block. Neither exceeds T rounded up to a power of two: at T=64 a 128-row
    workgroup would leave half its lanes idle."""
    limit = int(gpu.limits.get("max-compute-workgroup-storage-size", 16384))
    hd4 = -(-hd // 32) * 8
    tuned = (plan or PORTABLE).online_block
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


def online_variant(plan: KernelPlan, T=0, hd=0) -> str:
    """The plan's online attention variant; sg also has to stay under llvmpipe's loop cap, where
    a lane makes up to 6 * ceil(hd / 32) + 2 loop trips per block of 8 rows (T up to ~20,000
    at hd = 128); past it, the tiles."""
    trips = -(-T // SG_LANES) * (6 * -(-hd // 32) + 2)
    fits = plan.loop_cap is None or trips <= plan.loop_cap
    return "sg" if plan.attention == "sg" and fits else "tiles"


def _online(gpu, entry, ins, o1, o2, B, T, C, H, groups, block=None, plan=None):
    hd = C // H
    bq, bk = block or online_tiles(gpu, hd, T, plan)
    k = gpu.kernel("online.wgsl", entry, "urrrrrrww", {"HD": hd, "HD4": -(-hd // 32) * 8, "BQ": bq, "BK": bk})
    ins = list(ins) + [None] * (6 - len(ins))
    return gpu.dispatch(k, (B, T, C, H, 1.0 / math.sqrt(hd)), ins + [o1, o2], groups)


def _online_sg(gpu, entry, ins, o1, o2, B, T, C, H, bf16=False):
    """One workgroup (a subgroup of 8 lanes) per 8 rows of each (b, h). bf16: q, k, v hold bf16
    (u32 tensors of half the floats; B*T*C a multiple of 8)."""
    hd = C // H
    consts = {"HD": hd, "HD4": -(-hd // 32) * 8, "ALIGNED": hd % 4 == 0 and C % 4 == 0, "BF16": bool(bf16)}
    k = gpu.kernel("online_sg.wgsl", entry + "_sg", "urrrrrrww", consts)
    ins = list(ins) + [None] * (6 - len(ins))
    return gpu.dispatch(k, (B, T, C, H, 1.0 / math.sqrt(hd)), ins + [o1, o2], (B * H * -(-T // SG_LANES),))


def _sg_attn(plan, variant, T, C, H) -> bool:
    return (variant or online_variant(plan or PORTABLE, T, C // H)) == "sg"


def attn_online_forward(gpu, q, k, v, out, L, B, T, C, H, block=None, variant=None, plan=None, bf16=False):
    """bf16: q, k, v hold bf16 (online_sg.wgsl only)."""
    if _sg_attn(plan, variant, T, C, H):
        return _online_sg(gpu, "attn_online_forward", [q, k, v], out, L, B, T, C, H, bf16)
    assert not bf16, "bf16 q, k, v need online_sg.wgsl"
    bq, _ = block or online_tiles(gpu, C // H, T, plan)
    return _online(gpu, "attn_online_forward", [q, k, v], out, L, B, T, C, H, (B * H * -(-T // bq),), block, plan)


def attn_online_d(gpu, dout, out, D, B, T, C, H, block=None, plan=None):
    return _online(gpu, "attn_online_d", [dout, out], D, None, B, T, C, H, grid1d(-(-B * H * T // 64)), block,
                   plan)


def attn_online_dq(gpu, q, k, v, dout, L, D, dq, B, T, C, H, block=None, variant=None, plan=None, bf16=False):
    if _sg_attn(plan, variant, T, C, H):
        return _online_sg(gpu, "attn_online_dq", [q, k, v, dout, L, D], dq, None, B, T, C, H, bf16)
    assert not bf16, "bf16 q, k, v need online_sg.wgsl"
    bq, _ = block or online_tiles(gpu, C // H, T, plan)
    return _online(gpu, "attn_online_dq", [q, k, v, dout, L, D], dq, None, B, T, C, H, (B * H * -(-T // bq),),
                   block, plan)


def attn_online_dkv(gpu, q, k, v, dout, L, D, dk, dv, B, T, C, H, block=None, variant=None, plan=None, bf16=False):
    if _sg_attn(plan, variant, T, C, H):
        return _online_sg(gpu, "attn_online_dkv", [q, k, v, dout, L, D], dk, dv, B, T, C, H, bf16)
    assert not bf16, "bf16 q, k, v need online_sg.wgsl"
    _, bk = block or online_tiles(gpu, C // H, T, plan)
    return _online(gpu, "attn_online_dkv", [q, k, v, dout, L, D], dk, dv, B, T, C, H, (B * H * -(-T // bk),),
                   block, plan)


# ---- decoding from a key/value cache, and sampling (decode.wgsl) ---------------------------------
# Every decode kernel reads one uniform buffer (decode_uniform), rewritten before each token.
DECODE_ACCESS = "urrrrwww"     # params | a b c ids_in | o1 o2 ids_out


DECODE_UNIFORM_BYTES = 80


def decode_uniform(N, T, C, H, pos, step, V, VP, top_k=0, row0=0, row_stride=1, seed=0, temperature=0.0,
                   top_p=1.0, v0=0, vn=None) -> bytes:
    """v0, vn: the token rows embed_decode's table binding holds (all VP by default)."""
    from .gpu import pack_params
    seed = int(seed) & (2 ** 64 - 1)
    return pack_params((N, T, C, H, pos, step, V, VP, int(top_k or 0), row0, row_stride, seed & 0xFFFFFFFF,
                        seed >> 32, float(temperature), float(top_p), 1.0 / math.sqrt(C // H),
                        v0, VP if vn is None else vn))


def _decode(gpu, entry, uniform, a, b, c, ids_in, o1, o2, ids_out, grid):
    k = gpu.kernel("decode.wgsl", entry, DECODE_ACCESS)
    return gpu.dispatch_with(k, uniform, [a, b, c, ids_in, o1, o2, ids_out], grid)


def embed_decode(gpu, ids, tok, pos, out, N, C, uniform):
    """out[n] = tok[ids[n]] + pos[p.pos], for the ids within rows p.v0 .. p.v0+p.vn-1 that tok holds"""
    return _decode(gpu, "embed_decode", uniform, tok, pos, None, ids, out, None, None, grid1d(-(-N * C // 64)))


def kv_append(gpu, k, v, kc, vc, N, C, uniform):
    """kc[n, p.pos] = k[n]; vc[n, p.pos] = v[n] (caches [N, T, C])"""
    return _decode(gpu, "kv_append", uniform, k, v, None, None, kc, vc, None, grid1d(-(-N * C // 64)))


def attn_decode(gpu, q, kc, vc, out, scratch, N, H, uniform):
    """out[n] = attention of q[n] over cache rows 0..p.pos, per head; scratch [N, H, T]."""
    return _decode(gpu, "attn_decode", uniform, q, kc, vc, None, out, scratch, None, grid1d(N * H))


def sample_tokens(gpu, logits, ids, N, uniform):
    """ids[n] (and ids[N + step*N + n]) = the token drawn from logits row p.row0 + n * p.row_stride."""
    return _decode(gpu, "sample_tokens", uniform, logits, None, None, None, None, None, ids, (N,))
