"""`tinygpt tune`: measure the kernel variants on this adapter and cache the fastest.

Variants: the vec4 matmuls' workgroup width (WX lanes x 4 columns), the tiled matmuls' tile
(WX x WY invocations of TM rows x TV vec4 columns, BK per slice of k; those the device's
limits allow) and the online attention's tiles (BQ query rows per workgroup, BK keys per tile);
where subgroups work, also the subgroup kernels (matmul_vec4.wgsl's sg section, online_sg.wgsl). The fastest
of the matmul variants sets the matmul family, the faster attention the attention family. Each
candidate is validated against NumPy before it is timed; the winners are written to
~/.cache/tinygpt/tuning.json (TINYGPT_CACHE_DIR overrides) under the adapter's name,
backend and driver, and every later run on that adapter uses them. Different tiles
sum in a different order, so losses can differ in the last bits after tuning.
"""
from __future__ import annotations

import numpy as np

from ..reference import attention as RA      # the one runtime module that imports the judge:
from ..reference import kernels as R         # every candidate is checked against it before it is timed
from .gpu import GPU
from .kernels import Kernels
from .plan import PORTABLE, online_fits, tile_problem
from .planner import subgroup_verdict
from .timing import time_dispatches
from .tuning import read_tuning, save_tuning

WX_CANDIDATES = (8, 16, 32, 64)
# (WX, WY, TM, TV, BK): tiles of 64x64, 64x128, 128x64, 128x128, 32x64, 64x64 with BK 32, and
# 128x128 from 512 invocations (where the device allows that many: WebGPU's default is 256)
TILE_CANDIDATES = ((16, 16, 4, 1, 16), (16, 16, 4, 2, 16), (16, 16, 8, 1, 16), (16, 16, 8, 2, 8), (8, 8, 4, 2, 16),
                   (16, 16, 4, 1, 32), (16, 32, 4, 2, 16))
BLOCK_CANDIDATES = ((32, 32), (64, 32), (128, 32), (64, 16), (128, 16), (256, 32))


def _matmul_ms(gpu, wx, shapes, repeats, variant="vec4", tile=None):
    """wx: the vec4 kernels' width (None for the others); tile: the tiled kernels'."""
    kn = Kernels(gpu, PORTABLE.with_(matmul_wx=wx or 8, matmul_tile=tile or PORTABLE.matmul_tile))
    total = 0.0
    for M, N, Kd in shapes:
        r = np.random.default_rng(M + N + Kd)
        a = r.standard_normal((M, Kd)).astype(np.float32)
        b = r.standard_normal((Kd, N)).astype(np.float32)
        out = gpu.tensor((M, N))
        d = kn.matmul(gpu.upload(a), gpu.upload(b), None, out, M, N, Kd, variant=variant)
        gpu.run([d])
        err = np.abs(gpu.read(out) - a.astype(np.float64) @ b).max()
        if err > 1e-3 * np.sqrt(Kd):
            what = f"{variant} WX={wx}" if wx else f"{variant} {tile}" if tile else variant
            raise RuntimeError(f"matmul {what} gave a wrong result ({err:.2e}); not tuning")
        total += time_dispatches(gpu, [d], repeats)[0]
    return total


def _online_ms(gpu, block, T, hd, repeats, variant="tiles"):
    kn = Kernels(gpu, PORTABLE)
    B, H, C = 1, 1, hd
    r = np.random.default_rng(T)
    q, k, v, do = (r.standard_normal((B, T, C)).astype(np.float32) for _ in range(4))
    tq, tk, tv, tdo = (gpu.upload(x) for x in (q, k, v, do))
    out, dq, dk, dv = (gpu.tensor((B, T, C)) for _ in range(4))
    L, D = gpu.tensor((B, H, T)), gpu.tensor((B, H, T))
    ds = [kn.attention.attn_online_forward(tq, tk, tv, out, L, B, T, C, H, block, variant),
          kn.attention.attn_online_d(tdo, out, D, B, T, C, H, block),
          kn.attention.attn_online_dq(tq, tk, tv, tdo, L, D, dq, B, T, C, H, block, variant),
          kn.attention.attn_online_dkv(tq, tk, tv, tdo, L, D, dk, dv, B, T, C, H, block, variant)]
    gpu.run(ds)
    f = lambda x: x.astype(np.float64)
    err = max(np.abs(gpu.read(out) - RA.attention_forward(f(q), f(k), f(v), H)).max(),
              np.abs(gpu.read(dq) - RA.attention_backward(f(q), f(k), f(v), f(do), H)[0]).max())
    if err > 1e-4:
        raise RuntimeError(f"online attention {variant} {block} gave a wrong result ({err:.2e}); not tuning")
    return time_dispatches(gpu, ds, repeats)[0]


def measure_peaks(gpu: GPU, quick: bool = False) -> dict:
    """The adapter's peaks, the denominators of the training profile's utilisation (the probes of
    scripts/probe_adapter.py): vec4 FMA GFLOP/s with no memory traffic (probe_fma, checked against
    its twin), and streaming GB/s: the vec4 add (elementwise.wgsl) over buffers larger than any cache, two reads
    and a write per float."""
    n = (1 << 16) if gpu.is_cpu or quick else (1 << 20)           # invocations: enough to fill a GPU
    iters = 256 if quick else 4096
    out = gpu.tensor((4 * n,))
    k = gpu.kernel("probe.wgsl", "probe_fma", "urw")
    d = gpu.dispatch(k, (iters, 1), [None, out], (n // 64,))
    gpu.run([d])
    got, want = gpu.read(out, count=4 * 256).reshape(256, 4), R.probe_fma(iters, 256)
    if not np.allclose(got, want, rtol=1e-3):
        raise RuntimeError("probe_fma differs from its NumPy twin; no peaks measured")
    best = lambda ds: min(time_dispatches(gpu, ds, 1)[0] for _ in range(1 if quick else 5))   # a busy moment
    fma_ms = best([d])                                                                         # only reads low
    m = min(gpu.max_binding // 4, (1 << 20) if quick else (1 << 25)) // 1024 * 1024   # floats per buffer
    x, y, z = gpu.tensor((m,)), gpu.tensor((m,)), gpu.tensor((m,))
    add = Kernels(gpu, PORTABLE).add(x, y, z, m, variant="vec4")
    add_ms = best([add])
    return {"gflops": n * iters * 64 / fma_ms / 1e6, "gbps": 12 * m / add_ms / 1e6}


def cached_peaks(gpu: GPU, again: bool = False) -> dict:
    """The peaks cached with this adapter's tuning, measured (and cached) now when there are none.
    again: measure them anew and keep, for each, the higher of the two (noise only ever makes a
    peak read low), for a profile that found a kernel above them."""
    entry = read_tuning(gpu.key)
    if "peaks" not in entry or again:
        fresh = measure_peaks(gpu)
        old = entry.get("peaks") or {}
        entry = dict(entry, peaks={k: max(v, old.get(k, 0.0)) for k, v in fresh.items()})
        save_tuning(gpu.key, entry)
    return entry["peaks"]


def tune(gpu: GPU, quick: bool = False, log=None) -> dict:
    """Measure, pick, cache. quick: small shapes (tests)."""
    say = log or (lambda *_: None)
    rows = _measure(gpu, quick, say)
    best = _choose(rows)
    best["peaks"] = measure_peaks(gpu)      # full size even when quick: a short probe reads low
    say(f"peaks: {best['peaks']['gflops']:.1f} GFLOP/s (FMA), {best['peaks']['gbps']:.1f} GB/s (streaming)")
    path = save_tuning(gpu.key, best)   # make_plan reads these back: the families measured, the tunables
    return {"rows": rows, "chosen": best, "cache": str(path) if path else None}


def _measure(gpu: GPU, quick: bool, say) -> list:
    """One row per candidate variant that this adapter can run: its time on the tuning shapes."""
    repeats = 1 if quick else 3
    shapes = [(64, 64, 64)] if quick else [(1024, 96, 384), (1024, 384, 96), (512, 512, 512)]
    T, hd = (64, 16) if quick else (1024, 64)
    rows = []
    # every candidate gets an explicit plan: nothing shared is changed while measuring
    for wx in WX_CANDIDATES:
        if wx <= int(gpu.limits.get("max-compute-invocations-per-workgroup", 256)):
            ms = _matmul_ms(gpu, wx, shapes, repeats)
            rows.append({"kernel": "matmul_vec4", "variant": f"WX={wx}", "ms": ms, "value": wx})
            say(f"matmul_vec4 WX={wx}: {ms:.2f} ms")
    for tile in TILE_CANDIDATES:
        if tile_problem(gpu.limits, tile) is None:
            ms = _matmul_ms(gpu, None, shapes, repeats, "tiled", tile)
            rows.append({"kernel": "matmul_tiled", "variant": "x".join(map(str, tile)), "ms": ms, "value": list(tile)})
            say(f"matmul_tiled {tile}: {ms:.2f} ms")
    sg = subgroup_verdict(gpu) == "ok"
    if sg:
        ms = _matmul_ms(gpu, None, shapes, repeats, "sg")
        rows.append({"kernel": "matmul_sg", "variant": "sg", "ms": ms, "value": "sg"})
        say(f"matmul_sg: {ms:.2f} ms")
    for block in BLOCK_CANDIDATES:
        if online_fits(gpu.limits, hd, *block):
            ms = _online_ms(gpu, block, T, hd, repeats)
            rows.append({"kernel": "attn_online", "variant": f"BQ={block[0]} BK={block[1]}", "ms": ms,
                         "value": list(block)})
            say(f"attn_online {block}: {ms:.2f} ms")
    if sg:
        ms = _online_ms(gpu, None, T, hd, repeats, "sg")
        rows.append({"kernel": "attn_online_sg", "variant": "sg", "ms": ms, "value": "sg"})
        say(f"attn_online_sg: {ms:.2f} ms")
    return rows


def _choose(rows: list) -> dict:
    """The plan's choices from the measured rows (the winners marked "chosen")."""
    best = {}
    for kernel, key in (("matmul_vec4", "matmul_wx"), ("matmul_tiled", "matmul_tile"), ("attn_online", "online_block")):
        cands = [r for r in rows if r["kernel"] == kernel]
        if cands:
            win = min(cands, key=lambda r: r["ms"])
            win["chosen"] = True
            best[key] = win["value"]
    # the matmul family: the fastest of its variants' best (the tunables of the losers stay cached:
    # a variant that loses here is still the fallback where the winner cannot run)
    fam = {"matmul_sg": "sg", "matmul_tiled": "tiled", "matmul_vec4": "vec4"}
    bests = [min((r for r in rows if r["kernel"] == k), key=lambda r: r["ms"]) for k in fam
             if any(r["kernel"] == k for r in rows)]
    if bests:
        win = min(bests, key=lambda r: r["ms"])
        for r in rows:
            if r["kernel"] in fam:
                r["chosen"] = r is win
        best["matmul"] = fam[win["kernel"]]
    for sg_kernel, other, key, lose in (("attn_online_sg", "attn_online", "attention", "tiles"),):
        s_rows = [r for r in rows if r["kernel"] == sg_kernel]
        o_best = min((r["ms"] for r in rows if r["kernel"] == other), default=float("inf"))
        if s_rows:
            win = s_rows[0]["ms"] < o_best
            s_rows[0]["chosen"] = win
            best[key] = "sg" if win else lose
    return best
