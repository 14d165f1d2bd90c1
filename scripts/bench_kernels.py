#!/usr/bin/env python3
"""The training kernels besides matmul and attention, in every variant this adapter runs,
at one preset's shapes: GPU ms, max error against the entry point's NumPy twin (the
reference function of the same name), and the speed-up over the scalar variant.

Variants: scalar (elementwise, layernorm, loss, grad_norm, optim, muon .wgsl), vec4 (elementwise,
layernorm, grad_norm, optim .wgsl at the vec4 width), sg (their sg sections' kernels; where
subgroups work) and bf16 (every activation with its pre-activation stored as bf16;
layernorm_forward bf16: the LayerNorm writing bf16; max_err against the twin's bf16 result, in float32 values);
rms: the LayerNorm kernels as RMSNorm (no centring, no bias).
decode.wgsl's kernels (sampling), one variant each, at a decode step of batch sequences over a
ctx-row cache; sample_tokens' max_err counts the sequences whose token differs from the twin's.
The bf16 casts (scalar, and x8: eight values an invocation) and the split head's block copy
(cast_bf16's max_err counts the words that differ from the twin's). With shader-f16, the f16
kernels (GELU, the LayerNorm writing f16, the casts) and the decode step's f16 cache; without it,
the bf16 cache (kv_append's error: the words that differ).
RoPE (rope.wgsl) on q as stored, float32 and bf16, at the preset's head size, and QK-norm with the
turn in one pass (qk_norm_rope, and its backward qk_norm_rope_dx, float32); RoPE's turned forms:
the q projection turning as it stores (matmul_rope, each matmul variant, beside that variant's
plain product) and the online backward turning dq, dk back (beside the plain dq, dkv kernels). The other parts of
the modern block: SwiGLU (glu.wgsl; float32 and bf16 gate and up, [rows, 4C]; the bf16 row's
max_err is what lies past one bf16 rounding of the float64 value), grouped-query
attention's kv_expand (bf16, as stored) and kv_reduce over the preset's heads sharing one key/value
head, and the logit soft-cap (loss.wgsl's softcap, in place over [rows, vocab]).
LoRA's scale (alpha / rank on a [rows, rank 8] product). The optimizers over the flat parameters
(each elementwise one of model.optimizers, its room's WGSL; scalar and vec4) and the loss scaler's
form of grad_sumsq (variant "scaled", f16's: gradients carrying a scale of 1024); Muon's kernels on
one [C, 4C] matrix, and its Newton-Schulz over all the preset's matrices (the plan's matmuls) one
matrix at a time against batched over the matrices of one shape, as Muon runs it: wall_ms beside the
GPU time, as the batch saves dispatches, which cost time between kernels too (scripts/bench_train.py
times a whole Muon step).
Matmuls: scripts/bench_matmul.py; attention: scripts/compare_attention.py.

    python scripts/bench_kernels.py                    # the small preset's shapes
    python scripts/bench_kernels.py --preset medium --json
"""
import argparse
import sys

import numpy as np

from tinygpt.core.activations import ACTIVATIONS
from tinygpt.device import kernels as K
from tinygpt.device.kernels import Kernels
from tinygpt.device.plan import PORTABLE
from tinygpt.device.planner import make_plan, subgroups_ok
from tinygpt.reference import attention as RA
from tinygpt.reference import kernels as R
from tinygpt.device.timing import time_dispatches
from tinygpt.commands.tables import emit
from tinygpt.core.config import n_params, param_shapes, preset
from tinygpt.model.optimizers import KINDS as OPTIMIZERS
from tinygpt.model.optimizers.base import ElementwiseOptimizer
from tinygpt.model.optimizers.muon import muon_ratio, ns_batches
from tinygpt.core.rope import rope_table
from tinygpt.device.gpu import GPU
from tinygpt.commands.argtypes import positive_int
from tinygpt.commands.cli import run_script


def cases(gpu, rows, C, M, V, n, rng):
    """(kernel, variant, shape, dispatch, check): check() -> max abs error of what the dispatch
    wrote against the twin, called after its first run."""
    f64 = lambda a: np.asarray(a, np.float64)
    up = gpu.upload
    kn = Kernels(gpu, PORTABLE)                 # each variant forced: the portable plan's sizes
    sg = ["sg"] if subgroups_ok(gpu) else []
    x, y = rng.standard_normal(rows * M).astype(np.float32), rng.standard_normal(rows * M).astype(np.float32)
    tx, ty, tout = up(x), up(y), gpu.tensor((rows * M,))
    for v in ("scalar", "vec4"):
        yield "add", v, f"n={rows * M}", kn.add(tx, ty, tout, rows * M, variant=v), \
            lambda: np.abs(gpu.read(tout) - (f64(x) + y)).max()
    n = rows * M
    xh, th = R.cast_bf16(x), gpu.tensor((n // 2,), "bf16")
    for act in ACTIVATIONS.values():            # every activation's room, float32 at both widths, then bf16
        for v in ("scalar", "vec4"):
            yield f"{act.name}_forward", v, f"n={n}", kn.act_forward(act, tx, tout, n, variant=v), \
                lambda a=act: np.abs(gpu.read(tout) - a.forward(f64(x))).max()
            yield f"{act.name}_backward", v, f"n={n}", kn.act_backward(act, tx, ty, tout, n, variant=v), \
                lambda a=act: np.abs(gpu.read(tout) - a.backward(f64(x), f64(y))).max()
        if n % 8 == 0:     # the pre-activation stored as bf16: the same entry points, the bf16 section
            yield f"{act.name}_forward", "bf16", f"n={n}", kn.act_forward(act, up(xh, dtype="bf16"), th, n), \
                lambda a=act: np.abs(R.cast_f32(gpu.read(th), n)
                                     - R.cast_f32(R.stored_forward(a.forward, xh, "bf16"), n)).max()
            yield f"{act.name}_backward", "bf16", f"n={n}", kn.act_backward(act, up(xh, dtype="bf16"), ty, tout, n), \
                lambda a=act: np.abs(gpu.read(tout) - R.stored_backward(a.backward, xh, f64(y), "bf16")).max()
    acc0 = rng.standard_normal(rows * M).astype(np.float32)
    for v in ("scalar", "vec4"):     # in place: checked after its first run, then timed adding on
        tacc = up(acc0)
        d = kn.accumulate(tx, tacc, rows * M, variant=v)
        yield "accumulate", v, f"n={rows * M}", d, \
            lambda t=tacc: np.abs(gpu.read(t) - R.accumulate(f64(x), f64(acc0))).max()
    n = rows * 8                     # LoRA's alpha / rank on a [rows, rank 8] product
    d = kn.scale(tx, tout, n, 2.0)
    yield "scale", "scalar", f"n={n}", d, lambda: np.abs(gpu.read(tout)[:n] - R.scale(f64(x[:n]), 2.0)).max()
    bg = gpu.tensor((M,))
    for v in ["scalar"] + sg:
        d = kn.bias_grad(ty, bg, rows, M, variant=v)
        yield "bias_grad", v, f"{rows}x{M}", d, lambda: np.abs(gpu.read(bg) - f64(y).reshape(rows, M).sum(0)).max()

    xl = (rng.standard_normal((rows, C)) * 2 + 1).astype(np.float32)
    g, b = rng.standard_normal(C).astype(np.float32), rng.standard_normal(C).astype(np.float32)
    dy = rng.standard_normal((rows, C)).astype(np.float32)
    ry, rm, rr = R.layernorm_forward(f64(xl), f64(g), f64(b))
    txl, tdy, ln_y, stats = up(xl), up(dy), gpu.tensor((rows, C)), up(np.stack([rm, rr]).astype(np.float32))
    dx, dgb = gpu.tensor((rows, C)), gpu.tensor((2, C))
    shape = f"{rows}x{C}"
    for v in ("scalar", "vec4"):
        # the forward writes stats too; the twin's own stats are what dx and dgb read below
        st = gpu.tensor((2, rows))
        d = kn.layernorm_forward(txl, up(np.stack([g, b])), ln_y, st, rows, C, variant=v)
        yield "layernorm_forward", v, shape, d, lambda w=ry: np.abs(gpu.read(ln_y) - w).max()
        d = kn.layernorm_dx(tdy, txl, up(g), stats, dx, rows, C, accumulate=False, variant=v)
        want = R.layernorm_dx(f64(dy), f64(xl), f64(g), rm, rr)
        yield "layernorm_dx", v, shape, d, lambda w=want: np.abs(gpu.read(dx) - w).max()
    for v in ["scalar"] + sg:
        d = kn.layernorm_dgb(tdy, txl, stats, dgb, rows, C, variant=v)
        want = np.stack(R.layernorm_dgb(f64(dy), f64(xl), rm, rr))
        yield "layernorm_dgb", v, shape, d, lambda w=want: np.abs(gpu.read(dgb) - w).max()
    # RMSNorm (the same entry points with rms: no centring, no bias); its dg is layernorm_dgb's first row
    rms_y, rms_mean, rms_rstd = R.layernorm_forward(f64(xl), f64(g), None, rms=True)
    rms_stats = up(np.stack([rms_mean, rms_rstd]).astype(np.float32))
    for v in ("scalar", "vec4"):
        st = gpu.tensor((2, rows))
        d = kn.layernorm_forward(txl, up(g), ln_y, st, rows, C, variant=v, rms=True)
        yield "layernorm_forward", v + " rms", shape, d, lambda w=rms_y: np.abs(gpu.read(ln_y) - w).max()
        d = kn.layernorm_dx(tdy, txl, up(g), rms_stats, dx, rows, C, accumulate=False, variant=v, rms=True)
        want = R.layernorm_dx(f64(dy), f64(xl), f64(g), rms_mean, rms_rstd, rms=True)
        yield "layernorm_dx", v + " rms", shape, d, lambda w=want: np.abs(gpu.read(dx) - w).max()

    if C % 4 == 0:     # a bf16 model's LayerNorm: its output written as bf16 (the file's bf16 section)
        yh, st = gpu.tensor((rows, C // 2), "bf16"), gpu.tensor((2, rows))
        d = kn.layernorm_forward(txl, up(np.stack([g, b])), yh, st, rows, C)
        want_h = R.stored_layernorm_forward(xl, g, b, "bf16")[0].reshape(-1)
        yield "layernorm_forward", "bf16", shape, d, lambda: np.abs(
            R.cast_f32(gpu.read(yh).reshape(-1), rows * C) - R.cast_f32(want_h, rows * C)).max()

    logits = (rng.standard_normal((rows, V)) * 3).astype(np.float32)
    tgt = rng.integers(0, V, rows).astype(np.uint32)
    rl, rd = R.cross_entropy(tgt, f64(logits), 1.0 / rows)
    for v in ["scalar"] + sg:
        tl, losses = up(logits), gpu.tensor((rows,))  # logits become dlogits: a copy per variant
        d = kn.losses.cross_entropy(up(tgt), tl, losses, rows, V, 1.0 / rows, variant=v)
        yield "cross_entropy", v, f"{rows}x{V}", d, lambda tl=tl, losses=losses: max(
            np.abs(gpu.read(losses) - rl).max(), np.abs(gpu.read(tl) - rd).max())

    gr = (rng.standard_normal(n) * 0.01).astype(np.float32)
    w0, m0, v0 = (rng.standard_normal(n).astype(np.float32) * s for s in (1.0, 0.01, 1e-4))
    v0 = np.abs(v0)
    tg, parts = up(gr), gpu.tensor((-(-n // K.CHUNK),))
    for v in ("scalar", "vec4"):
        d = kn.optim.grad_sumsq(tg, parts, n, variant=v)
        yield "grad_sumsq", v, f"n={n}", d, lambda: np.abs(gpu.read(parts) - R.grad_sumsq(f64(gr))).max()
    wd = np.full(-(-n // 256), 0.1, np.float32)
    lr = 1e-3
    gate = {"norm": 0.0, "factor": 1.0, "scale": 1.0, "skip": 0, "clean": 0, "skipped": 0, "taken": 1}
    words = lambda st: np.array([st[k] for k in sorted(K.GATE, key=K.GATE.get)] + [0.0] * (K.GATE_FLOATS - len(K.GATE)),
                                np.float32)
    tgate = up(words(gate))
    for room in OPTIMIZERS.values():       # each elementwise optimizer's entry point, its room's WGSL
        if not issubclass(room, ElementwiseOptimizer):
            continue
        consts = room.constants(room.settings())
        two = len(room.state_rows) > 1
        u = gpu.uniform(K.OPTIM_UNIFORM_BYTES)
        gpu.write_uniform(u, K.optim_uniform(n, lr, *consts))
        rw, rm_, rv = f64(w0), f64(m0), f64(v0)
        room.twin(f64(gr), 0.1, gate, rw, rm_, rv, lr, *consts)
        for v in ("scalar", "vec4"):
            tw = up(w0)  # updated in place: a copy per variant, checked after the first step only
            d = kn.optim.elementwise_optimizer(room.name, room.wgsl, tg, up(wd), tgate, tw, up(m0),
                                               up(v0) if two else None, n, u, variant=v)
            yield room.name, v, f"n={n}", d, lambda tw=tw, rw=rw: np.abs(gpu.read(tw) - rw).max()
    # the loss scaler's form of grad_sumsq (SCALED, f16's): gradients carrying a scale of 1024,
    # unscaled as they are squared (the scale read from the gate, kernels.GATE)
    gs = gr * np.float32(1024.0)
    tgs, scaled = up(gs), up(words(dict(gate, scale=1024.0)))
    for v in ("scalar", "vec4"):
        d = kn.optim.grad_sumsq(tgs, parts, n, variant=v, gate=scaled)
        yield "grad_sumsq", v + " scaled", f"n={n}", d, lambda: np.abs(
            gpu.read(parts) - R.grad_sumsq(f64(gs), gate={"scale": 1024.0})).max()
    yield from muon_cases(gpu, kn, up, tgate, gate, C, M, rng)


def muon_cases(gpu, kn, up, tgate, gate, C, M, rng):
    """Muon's kernels on one [C, M] matrix (the MLP's first): each checked against its twin after
    its first run."""
    f64 = lambda a: np.asarray(a, np.float64)
    n = C * M
    g, m, w = (rng.standard_normal((C, M)).astype(np.float32) for _ in range(3))
    tm, x, y = up(m), gpu.tensor((C, M)), gpu.tensor((C, M))
    rm, ru = f64(m), np.zeros((C, M))
    R.muon_momentum(f64(g), gate, rm, ru, 0.95, True)
    yield "muon_momentum", "scalar", f"{C}x{M}", kn.optim.muon_momentum(up(g), tgate, tm, x, n, 0.95), \
        lambda: np.abs(gpu.read(x) - ru).max()
    tx = up(g)
    yield "muon_normalize", "scalar", f"{C}x{M}", kn.optim.muon_normalize(tx, n, 1e-7), \
        lambda: np.abs(gpu.read(tx) - R.muon_normalize(f64(g), 1e-7)).max()
    yield "ns_mix", "scalar", f"{C}x{M}", kn.optim.ns_mix(up(g), up(m), y, n, 3.4445, 1.0), \
        lambda: np.abs(gpu.read(y) - R.ns_mix(f64(g), f64(m), 3.4445, 1.0)).max()
    u = gpu.uniform(16)
    gpu.write_uniform(u, K.pack_uniform((0, 1e-3, 0.1, 0)))
    tw, rw = up(w), f64(w)
    R.muon_update(f64(g), gate, rw, 1e-3, 0.1, muon_ratio((C, M)))
    yield "muon_update", "scalar", f"{C}x{M}", kn.optim.muon_update(up(g), tgate, tw, n, muon_ratio((C, M)), u), \
        lambda: np.abs(gpu.read(tw) - rw).max()


def newton_schulz_rows(gpu, kn, cfg, repeats, rng):
    """Newton-Schulz over every matrix Muon orthogonalises in the preset, one matrix at a time
    (variant "each") and batched over the matrices of one shape (model.optimizers.muon.ns_batches, as
    model.optimizers.muon.Muon runs it): GPU time (timestamps, where the adapter has them) and wall time of
    all the dispatches, the two timed in turn round after round (a machine's speed drifts),
    and the batched result's largest error against the twin."""
    from tinygpt.model.optimizers.muon import newton_schulz
    from tinygpt.model.optimizers.muon import newton_schulz_twin
    ns_twin = lambda x: newton_schulz_twin(R, x)
    batches = ns_batches(param_shapes(cfg))
    setups = {}
    for variant in ("each", "batched"):
        ds, outs = [], []
        for (K_, N), names in batches:
            groups = [[name] for name in names] if variant == "each" else [names]
            for group in groups:
                b, r = len(group), min(K_, N)
                x = rng.standard_normal((b, K_, N)).astype(np.float32)
                sx, sg = b * K.batch_stride(K_ * N), b * K.batch_stride(r * r)
                flat = np.zeros(sx, np.float32)
                for j in range(b):
                    flat[j * K.batch_stride(K_ * N):][:K_ * N] = x[j].reshape(-1)
                xs = [gpu.upload(flat), gpu.tensor((sx,))]
                ns, out = newton_schulz(kn, xs, gpu.tensor((sx,)), gpu.tensor((sg,)), gpu.tensor((sg,)),
                                        gpu.tensor((sg,)), K_, N, b)
                ds += ns
                outs.append((out, x, K_, N))
        setups[variant] = (ds, outs)
    err = {}
    for v, (ds, outs) in setups.items():   # one run from the inputs (the runs below iterate on in place)
        gpu.run(ds)
        err[v] = 0.0
        for out, x, K_, N in outs:
            got = gpu.read(out).reshape(-1)
            for j in range(len(x)):
                at = j * K.batch_stride(K_ * N)
                want = ns_twin(x[j].astype(np.float64))
                err[v] = max(err[v], float(np.abs(got[at:at + K_ * N].reshape(K_, N) - want).max()))
    ms = {v: [] for v in setups}
    wall = {v: [] for v in setups}
    for _ in range(repeats):
        for v, (ds, _) in setups.items():
            ms[v].append(time_dispatches(gpu, ds, 1)[0])
            wall[v].append(time_dispatches(gpu, ds, 1, "wall")[0])
    rows = []
    shapes = ", ".join(f"{len(n)}x{k}x{m}" for (k, m), n in batches)
    for v, (ds, outs) in setups.items():
        rows.append({"kernel": "newton_schulz", "variant": v, "entry": f"{len(ds)} dispatches", "shape": shapes,
                     "ms": float(np.median(ms[v])), "wall_ms": float(np.median(wall[v])),
                     "max_err": err[v],
                     "speedup": None if v == "each" else float(np.median(ms["each"]) / np.median(ms[v]))})
    return rows


def rope_cases(gpu, rows, T, C, H, rng):
    """RoPE on q as stored: float32 and bf16 (max_err in float32 values against the twin's result on
    the bf16 input, rounded to bf16 as the kernel rounds it)."""
    kn, hd = Kernels(gpu, PORTABLE), C // H
    if hd % 4:
        return
    x = rng.standard_normal((rows, C)).astype(np.float32)
    table = gpu.upload(rope_table(T, hd, 10000.0))
    exact = rope_table(T, hd, 10000.0, np.float64)
    for dtype, stored, seen, back in (("f32", x, x, lambda w: w),
                                      ("bf16", R.cast_bf16(x), R.cast_f32(R.cast_bf16(x), rows * C).reshape(rows, C),
                                       lambda w: R.cast_f32(w, rows * C).reshape(rows, C))):
        t = gpu.tensor(np.shape(stored), dtype, data=stored)
        d = kn.rope.rope_forward(table, t, rows, T, C, hd)
        want = R.rope_forward(exact, np.asarray(seen, np.float64), T, hd)
        want = back(R.cast_bf16(want)) if dtype == "bf16" else want
        # each run turns t again: the check reads the first run's result, before the timing's
        yield "rope_forward", dtype, f"{rows}x{C} hd {hd}", d, \
            lambda t=t, w=want, b=back: np.abs(b(gpu.read(t)) - w).max()
    gain = rng.standard_normal(hd).astype(np.float32)        # QK-norm with the turn, in one pass
    y, stats = gpu.tensor((rows, C)), gpu.tensor((2, rows * H))
    d = kn.rope.qk_norm_rope(table, gpu.upload(x), gpu.upload(gain), y, stats, rows, T, C, hd)
    want = R.qk_norm_rope(exact, x.astype(np.float64), gain.astype(np.float64), T, hd)[0]
    yield "qk_norm_rope", "f32", f"{rows}x{C} hd {hd}", d, lambda: np.abs(gpu.read(y) - want).max()
    dy, dx = rng.standard_normal((rows, C)).astype(np.float32), gpu.tensor((rows, C))   # its backward, g frozen
    gpu.run([d])
    d = kn.rope.qk_norm_rope_dx(table, gpu.upload(dy), gpu.upload(x), gpu.upload(gain), stats, dx, rows, T, C, hd)
    want_dx = R.qk_norm_rope_dx(exact, dy.astype(np.float64), x.astype(np.float64), gain.astype(np.float64),
                                gpu.read(stats).astype(np.float64), T, hd)
    yield "qk_norm_rope_dx", "f32", f"{rows}x{C} hd {hd}", d, lambda: np.abs(gpu.read(dx) - want_dx).max()
    yield from turned_cases(gpu, rows, T, C, H, x, table, exact, rng)


def turned_cases(gpu, rows, T, C, H, x, table, exact, rng):
    """RoPE where it meets its neighbours: the q projection (x W, [rows, C] by [C, C]) turning q as
    it stores it, in each matmul variant this adapter runs, beside the plain product of that variant
    (kernel "matmul"), so that the turn's cost is the difference, and beside rope_forward's own pass
    above; and the online backward turning dq, dk back as it stores them (dq_rope, dkv_rope) beside
    the plain kernels, at [batch, T, C], each checked against the float64 reference."""
    hd = C // H
    if hd % 8:
        return
    f64 = lambda a: np.asarray(a, np.float64)
    plan = make_plan(gpu)
    w = rng.standard_normal((C, C)).astype(np.float32)
    tx, tw = gpu.upload(x), gpu.upload(w)
    for variant in ("vec4", "sg", "tiled"):
        if variant == "sg" and plan.subgroups != "ok":
            continue
        kv = Kernels(gpu, plan.with_(matmul=variant))
        out, plain = gpu.tensor((rows, C)), gpu.tensor((rows, C))
        d = kv.matmul_turned("matmul", tx, tw, None, out, rows, C, C, False, table, T, hd)
        if d is None:
            continue
        want = R.matmul_rope_vec4(f64(x), f64(w), None, exact, T, hd)
        yield "matmul_rope", variant, f"{rows}x{C}x{C} hd {hd}", d, \
            lambda o=out, w_=want: np.abs(gpu.read(o) - w_).max()
        yield "matmul", variant, f"{rows}x{C}x{C}", kv.matmul(tx, tw, None, plain, rows, C, C, variant=variant), \
            lambda o=plain, w_=f64(x) @ f64(w): np.abs(gpu.read(o) - w_).max()
    from tinygpt.model import attention
    from tinygpt.model.block import Rotary
    B = rows // T
    q, k, v, do = (rng.standard_normal((B, T, C)).astype(np.float32) for _ in range(4))
    online = attention.path("online")
    att = attention.Attention(online, Kernels(gpu, plan), (B, T, C, H), online.own_scratch(gpu, B, T, H), 0)
    tq, tk, tv, tdo = (gpu.upload(a) for a in (q, k, v, do))
    o = gpu.tensor((B, T, C))
    gpu.run(att.forward(tq, tk, tv, o) + att.backward(tq, tk, tv, o, tdo, *(gpu.tensor((B, T, C)) for _ in range(3))))
    dq, dk, dv = (gpu.tensor((B, T, C)) for _ in range(3))
    rdq, rdk, _ = RA.attention_backward(f64(q), f64(k), f64(v), f64(do), H)
    back = lambda g: R.rope_backward(exact, g.reshape(rows, C), T, hd).reshape(B, T, C)
    ds = att.backward(tq, tk, tv, o, tdo, dq, dk, dv, rot=Rotary(table, T, hd))      # D, then dq, dkv turned
    plain = att.backward(tq, tk, tv, o, tdo, dq, dk, dv)
    shape = f"{B}x{T}x{C} hd {hd}"
    yield "attn_online_dq_rope", plan.attention, shape, ds[1], lambda: np.abs(gpu.read(dq) - back(rdq)).max()
    yield "attn_online_dkv_rope", plan.attention, shape, ds[2], lambda: np.abs(gpu.read(dk) - back(rdk)).max()
    yield "attn_online_dq", plan.attention, shape, plain[1], lambda: np.abs(gpu.read(dq) - rdq).max()
    yield "attn_online_dkv", plan.attention, shape, plain[2], lambda: np.abs(gpu.read(dk) - rdk).max()


def block_cases(gpu, rows, C, M, V, H, rng):
    """The modern block's other kernels: SwiGLU (float32, bf16), kv_expand (bf16 words) and
    kv_reduce with every query head on one key/value head, and the soft-cap, at the preset's shapes."""
    kn, n, hd = Kernels(gpu, PORTABLE), rows * M, C // H
    g, u, dy = (rng.standard_normal(n).astype(np.float32) for _ in range(3))
    for dtype, cast, back in (("f32", lambda a: a, lambda w: w),
                              ("bf16", R.cast_bf16, lambda w: R.cast_f32(w, n))):
        gs, us = (gpu.tensor(np.shape(cast(a)), dtype, data=cast(a)) for a in (g, u))
        out = gpu.tensor(np.shape(cast(g)), dtype)
        gv, uv = (back(cast(a)).astype(np.float64) for a in (g, u))
        want = R.swiglu_forward(gv, uv)
        # bf16: the error past one bf16 rounding of the float64 value (float32 arithmetic rounds
        # some values to the other side of a rounding edge, one bf16 step away)
        step = 2.0 ** -8 * np.abs(want) if dtype == "bf16" else 0.0
        yield "swiglu_forward", dtype, f"{rows}x{M}", kn.swiglu_forward(gs, us, out, n), \
            lambda o=out, w=want, b=back, s=step: np.maximum(np.abs(b(gpu.read(o)) - w) - s, 0.0).max()
        dg, du = gpu.tensor((n,)), gpu.tensor((n,))
        wg, wu = R.swiglu_backward(gv, uv, dy.astype(np.float64))
        yield "swiglu_backward", dtype, f"{rows}x{M}", kn.swiglu_backward(gs, us, gpu.upload(dy), dg, du, n), \
            lambda dg=dg, du=du, wg=wg, wu=wu: max(np.abs(gpu.read(dg) - wg).max(), np.abs(gpu.read(du) - wu).max())
    kv = R.cast_bf16(rng.standard_normal((rows, hd)).astype(np.float32)).reshape(rows, -1)
    src, dst = gpu.tensor(kv.shape, "bf16", data=kv), gpu.tensor((rows, C // 2), "bf16")
    yield "kv_expand", "bf16", f"{rows}x{H} heads from 1", kn.kv_expand(src, dst, rows, H, 1, hd), \
        lambda: float(np.sum(gpu.read(dst).view(np.uint32) != R.kv_expand(kv, H, 1).view(np.uint32)))
    dx = rng.standard_normal((rows, C)).astype(np.float32)
    red = gpu.tensor((rows, hd))
    yield "kv_reduce", "scalar", f"{rows}x{H} heads into 1", kn.kv_reduce(gpu.upload(dx), red, rows, H, 1, hd), \
        lambda: np.abs(gpu.read(red) - R.kv_reduce(dx.astype(np.float64), H, 1)).max()
    z = (rng.standard_normal((rows, V)) * 30).astype(np.float32)
    logits = gpu.upload(z)
    # each run caps the capped logits again: the check reads the first run's result, before the timing's
    yield "softcap", "scalar", f"{rows}x{V} at 15", kn.losses.softcap(logits, rows, V, 15.0), \
        lambda: np.abs(gpu.read(logits) - R.softcap(z.astype(np.float64), 15.0)).max()


def storage_cases(gpu, rows, M, V, rng):
    """The casts between float32 and bf16 (cast.wgsl) over [rows, M], and the split head's block copy
    (embed.wgsl's copy_block) of a [rows, V] block into the second half of [rows, 2V] logits; one variant each."""
    n = rows * M
    kn = Kernels(gpu, PORTABLE)
    x = rng.standard_normal(n).astype(np.float32)
    xh, back = gpu.tensor((n // 2,), "bf16"), gpu.tensor((n,))
    packed = R.cast_bf16(x)
    for v in ("scalar", "x8") if n % 8 == 0 else ("scalar",):
        d = kn.cast_bf16(gpu.upload(x), xh, n, v)
        yield "cast_bf16", v, f"n={n}", d, lambda: float(np.sum(gpu.read(xh) != packed))
        d = kn.cast_f32(gpu.upload(packed), back, n, v)
        yield "cast_f32", v, f"n={n}", d, lambda: np.abs(gpu.read(back) - R.cast_f32(packed, n)).max()
    blk = rng.standard_normal(rows * V).astype(np.float32)
    prev = np.zeros(rows * 2 * V, np.float32)
    out = gpu.upload(prev)
    d = kn.copy_block(gpu.upload(blk), out, rows, V, V, 0, 2 * V, V)
    want = R.copy_block(blk, prev, rows, V, V, 0, 2 * V, V)
    yield "copy_block", "scalar", f"{rows}x{V} into {rows}x{2 * V}", d, lambda: np.abs(gpu.read(out) - want).max()


def decode_cases(gpu, N, T, C, M, H, V, rng):
    """decode.wgsl's kernels at one decode step of N sequences at the last position of a T-row
    cache (one variant each, listed as scalar; attn_decode also a vec4 at a time where the head dim
    allows), attn_decode over a multi-query cache (grouped), and one sequence's products
    (rows_cases)."""
    f64 = lambda a: np.asarray(a, np.float64)
    up, pos = gpu.upload, T - 1
    kn = Kernels(gpu, PORTABLE)
    u = gpu.uniform(K.DECODE_UNIFORM_BYTES)
    gpu.queue.write_buffer(u, 0, K.decode_uniform(N, T, C, H, pos, 0, V, V, 40, 0, 1, 7, 0.8, 0.95))
    tok, pe = rng.standard_normal((V, C)).astype(np.float32), rng.standard_normal((T, C)).astype(np.float32)
    ids = rng.integers(0, V, N).astype(np.uint32)
    x = gpu.tensor((N, C))
    d = kn.decoding.embed_decode(gpu.tensor((N,), "u32", data=ids), up(tok), up(pe), x, N, C, u)
    yield "embed_decode", "scalar", f"{N}x{C}", d, lambda: np.abs(gpu.read(x) - R.embed_decode(ids, tok, pe, pos)).max()
    k, v, q = (rng.standard_normal((N, C)).astype(np.float32) for _ in range(3))
    kc0, vc0 = rng.standard_normal((N, T, C)).astype(np.float32), rng.standard_normal((N, T, C)).astype(np.float32)
    kc, vc = up(kc0), up(vc0)
    wk, wv = R.kv_append(k, v, kc0, vc0, pos)
    d = kn.decoding.kv_append(up(k), up(v), kc, vc, N, C, u)
    yield "kv_append", "scalar", f"{N}x{T}x{C}", d, lambda: max(np.abs(gpu.read(kc) - wk).max(),
                                                                np.abs(gpu.read(vc) - wv).max())
    out, scratch = gpu.tensor((N, C)), gpu.tensor((N, H, T))
    want = R.attn_decode(f64(q), f64(wk), f64(wv), pos, H)
    for variant in ("scalar", "vec4") if (C // H) % 4 == 0 else ("scalar",):
        d = kn.decoding.attn_decode(up(q), up(wk), up(wv), out, scratch, N, H, u, variant=variant)
        yield "attn_decode", variant, f"{N}x{H}x{T}", d, lambda: np.abs(gpu.read(out) - want).max()
    if H > 1:            # multi-query: every query head reads one key/value head's cache [N, T, hd]
        ug, hd = gpu.uniform(K.DECODE_UNIFORM_BYTES), C // H
        gpu.queue.write_buffer(ug, 0, K.decode_uniform(N, T, C, H, pos, 0, V, V, KV=1))
        kc1, vc1 = np.ascontiguousarray(wk[..., :hd]), np.ascontiguousarray(wv[..., :hd])
        outg = gpu.tensor((N, C))
        d = kn.decoding.attn_decode(up(q), up(kc1), up(vc1), outg, scratch, N, H, ug)
        want_g = R.attn_decode(f64(q), f64(kc1), f64(vc1), pos, H)
        yield "attn_decode", "grouped", f"{N}x{H}x{T}, 1 kv head", d, lambda: np.abs(gpu.read(outg) - want_g).max()
    logits = (rng.standard_normal((N, V)) * 3).astype(np.float32)
    tid = gpu.tensor((2 * N,), "u32")
    d = kn.decoding.sample_tokens(up(logits), tid, N, u)
    want_ids = R.sample_tokens(logits, 0.8, 40, 0.95, 7, 0)     # tokens: the error is how many differ
    yield "sample_tokens", "scalar", f"{N}x{V}", d, lambda: float(np.sum(gpu.read(tid)[:N] != want_ids))
    yield from rows_cases(gpu, kn, 1, C, M, V, rng)             # one sequence's step


def rows_cases(gpu, kn, N, C, M, V, rng):
    """A decode step's products of N rows (matmul_words.wgsl's matmul_rows, matmul_abt_rows): the
    MLP's up projection [C, M] as A @ B, and the tied head [V, C] as A @ B^T, float32 and bf16,
    beside the scalar template at the same shape (the speedup's baseline)."""
    a = rng.standard_normal((N, C)).astype(np.float32)
    forms = {"matmul": (rng.standard_normal((C, M)).astype(np.float32), M),
             "matmul_abt": (rng.standard_normal((V, C)).astype(np.float32), V)}
    pk = lambda x: R.cast_bf16(x).reshape(len(x), -1)
    up = lambda x: gpu.upload(x, dtype="bf16" if x.dtype == np.uint32 else None)
    for entry, (b, n) in forms.items():
        if not K.rows_ok(kn.plan, entry, N, n, C):
            continue
        out = gpu.tensor((N, n))
        launch = kn.matmul if entry == "matmul" else \
            lambda A, B, bias, o, *shape, **kw: kn.matmul_abt(A, B, o, *shape, **kw)
        for variant, (A, B) in (("scalar", (a, b)), ("f32", (a, b)), ("bf16", (pk(a), pk(b)))):
            d = launch(up(A), up(B), None, out, N, n, C, variant="scalar" if variant == "scalar" else "rows")
            want = (R.matmul_rows if entry == "matmul" else R.matmul_abt_rows)(A, B)
            yield f"{entry} {N} rows", variant, f"{N}x{n}x{C}", d, lambda w=want, o=out: np.abs(gpu.read(o) - w).max()


def half_cases(gpu, rows, C, M, N, T, H, rng):
    """With shader-f16, the f16 model's own kernels (variant f16): GELU both ways, the LayerNorm
    writing f16, the casts (listed as scalar); and the decode step's half cache (kv_append on its words,
    attn_decode's section of the type) in f16, or in bf16 without the feature."""
    up, n = gpu.upload, rows * M
    kn = Kernels(gpu, PORTABLE)
    f16 = "shader-f16" in gpu.features
    if f16:
        x, y = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
        xh = R.cast_f16(x)
        tx, th, tout = gpu.tensor((n // 2,), "f16", data=xh), gpu.tensor((n // 2,), "f16"), gpu.tensor((n,))
        for act in ACTIVATIONS.values():        # every activation's room, its f16 section
            yield f"{act.name}_forward", "f16", f"n={n}", kn.act_forward(act, tx, th, n), lambda a=act: np.abs(
                R.unpack_f16(gpu.read(th)) - R.unpack_f16(R.stored_forward(a.forward, xh, "f16"))).max()
            yield f"{act.name}_backward", "f16", f"n={n}", kn.act_backward(act, tx, up(y), tout, n), \
                lambda a=act: np.abs(gpu.read(tout) - R.stored_backward(a.backward, xh, y.astype(np.float64),
                                                                         "f16")).max()
        xl, gb = rng.standard_normal((rows, C)).astype(np.float32), rng.standard_normal((2, C)).astype(np.float32)
        yh, st = gpu.tensor((rows, C // 2), "f16"), gpu.tensor((2, rows))
        d = kn.layernorm_forward(up(xl), up(gb), yh, st, rows, C)
        want_h = R.stored_layernorm_forward(xl, gb[0], gb[1], "f16")[0]
        yield "layernorm_forward", "f16", f"{rows}x{C}", d, lambda: np.abs(
            R.unpack_f16(gpu.read(yh)) - R.unpack_f16(want_h)).max()
        back = gpu.tensor((n,))
        d = kn.cast_f16(up(x), th, n)
        yield "cast_f16", "scalar", f"n={n}", d, lambda: float(np.sum(gpu.read(th) != xh))
        d = kn.cast_f16_to_f32(gpu.tensor((n // 2,), "f16", data=xh), back, n)
        yield "cast_f16_to_f32", "scalar", f"n={n}", d, lambda: np.abs(gpu.read(back) - R.cast_f16_to_f32(xh, n)).max()
    half = "f16" if f16 else "bf16"
    cast = R.cast_f16 if f16 else R.cast_bf16
    pos = T - 1
    u = gpu.uniform(K.DECODE_UNIFORM_BYTES)
    gpu.queue.write_buffer(u, 0, K.decode_uniform(N, T, C, H, pos, 0, 1, 1))
    w = lambda *s: cast(rng.standard_normal(s).astype(np.float32)).reshape(*s[:-1], s[-1] // 2)
    k, v, q, kc0, vc0 = w(N, C), w(N, C), w(N, C), w(N, T, C), w(N, T, C)
    t = lambda a: gpu.tensor(a.shape, half, data=a)
    kc, vc = t(kc0), t(vc0)
    wk, wv = R.kv_append(k, v, kc0, vc0, pos)
    d = kn.decoding.kv_append(t(k), t(v), kc, vc, N, C, u)
    yield "kv_append", half, f"{N}x{T}x{C}", d, lambda: float(np.sum(gpu.read(kc) != wk) + np.sum(gpu.read(vc) != wv))
    out, scratch = gpu.tensor((N, C)), gpu.tensor((N, H, T))
    want = R.stored_attn_decode(q, wk, wv, pos, H, half)
    for variant in ("scalar", "vec4") if (C // H) % 8 == 0 else ("scalar",):     # vec4: 8 values a load
        d = kn.decoding.attn_decode(t(q), t(wk), t(wv), out, scratch, N, H, u, variant=variant)
        yield "attn_decode", "vec4 " * (variant == "vec4") + half, f"{N}x{H}x{T}", d, \
            lambda: np.abs(gpu.read(out) - want).max()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="small", help="shapes: rows = batch x ctx, C, 4C, vocab, parameters")
    ap.add_argument("--repeats", type=positive_int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    cfg = preset(args.preset)
    rows, C, M, V = cfg.batch * cfg.ctx, cfg.d_model, cfg.d_mlp, cfg.vocab
    n = -(-n_params(cfg) // 256) * 256
    gpu = GPU()
    print(f"adapter: {gpu.name} ({gpu.backend}); preset {args.preset}", file=sys.stderr)
    out, scalar_ms = [], {}
    rng = np.random.default_rng(0)
    for kernel, variant, shape, d, check in [*cases(gpu, rows, C, M, V, n, rng), *storage_cases(gpu, rows, M, V, rng),
                                             *rope_cases(gpu, rows, cfg.ctx, C, cfg.heads, rng),
                                             *block_cases(gpu, rows, C, M, V, cfg.heads, rng),
                                             *decode_cases(gpu, cfg.batch, cfg.ctx, C, M, cfg.heads, V, rng),
                                             *half_cases(gpu, rows, C, M, cfg.batch, cfg.ctx, cfg.heads, rng)]:
        room = OPTIMIZERS.get(d.kernel.name)      # an optimizer's entry point: its twin is in its room
        if not (hasattr(R, d.kernel.name) or hasattr(RA, d.kernel.name)) and getattr(room, "twin", None) is None:
            raise SystemExit(f"{d.kernel.name} has no NumPy twin in tinygpt.reference or its room")
        gpu.run([d])
        err = float(check())
        ms, method = time_dispatches(gpu, [d], args.repeats)
        if variant == "scalar":
            scalar_ms[kernel] = ms
        out.append({"kernel": kernel, "variant": variant, "entry": d.kernel.name, "shape": shape, "ms": ms,
                    "max_err": err, "speedup": scalar_ms[kernel] / ms if kernel in scalar_ms else None,
                    "timing": method})
        print(f"{d.kernel.name} {shape}: {ms:.3f} ms, max error {err:.2e}", file=sys.stderr)
    out += newton_schulz_rows(gpu, Kernels(gpu, make_plan(gpu)), cfg, max(args.repeats, 5), rng)
    if not args.json:
        print(f"# {gpu.name} ({gpu.backend}); preset {args.preset}; GPU time from {out[0]['timing']}, "
              f"median of {args.repeats}; speedup = the scalar variant's ms / this one's")
    emit(out, args.json, ["kernel", "variant", "entry", "shape", "ms", "wall_ms", "max_err", "speedup"])


if __name__ == "__main__":
    run_script("bench_kernels", main)
