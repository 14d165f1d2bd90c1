#!/usr/bin/env python3
"""Every matmul kernel of the trainer beside NumPy's sgemm, in GFLOP/s.

Kernels: matmul (A@B + bias), matmul_abt (A@B^T), matmul_atb (A^T@B), each in every variant
of the family: sg (one subgroup per workgroup, lavapipe's fastest), tiled (workgroup-memory
tiles and register blocks, the GPU shape), vec4 and the scalar fallback, with this adapter's
tuned tunables (`tinygpt tune`) where it has them. Each is validated against NumPy before it
is timed. With --dtypes f32,bf16, the variants that have a bf16 form (bf16 operands, float32 sums:
sg as matmul_words.wgsl's sg section; tiled and scalar, the templates matmul_tiled.wgsl and matmul.wgsl,
reading bf16) run again with dtype bf16, validated against the float64 product of the same bf16
values. dtype mixed is what a bf16 model's backward runs: A @ B^T with A float32 (dX = dY @ W^T)
and A^T @ B with B float32 (dW = X^T @ dY), the other operand bf16. dtype f16 runs the f16 kernels
(WGSL's f16: products in f16, float32 sums) beside each float32 variant (sg and vec4 as matmul_quad.wgsl's
sections, tiled and scalar as the templates with f16 products), judged against
the twin that rounds each product to f16; f16mixed is an f16 model's backward, the float32 operand
rounded to f16 as it is read.

    python scripts/bench_matmul.py                      # 256^3, 512^3, 1024^3, 2048^3
    python scripts/bench_matmul.py --sizes 256,1024 --json
"""
import argparse
import sys
import time

import numpy as np

from tinygpt.device import kernels as K
from tinygpt.device.gpu import GPU
from tinygpt.device.kernels import Kernels
from tinygpt.device.plan import tile_problem
from tinygpt.device.planner import make_plan, subgroups_ok
from tinygpt.device.timing import time_dispatches
from tinygpt.reference import kernels as R
from tinygpt.commands.tables import emit
from tinygpt.commands.argtypes import positive_int, positive_ints
from tinygpt.commands.cli import run_script

KERNELS = [(e, v) for e in ("matmul", "matmul_abt", "matmul_atb") for v in ("sg", "tiled", "vec4", "scalar")]
BF16 = ("sg", "tiled", "scalar")              # the float32 variants that have a bf16 form
F16 = ("sg", "tiled", "vec4", "scalar")       # and an f16 one


def numpy_gflops(entry, a, b, repeats):
    f = {"matmul": lambda: a @ b, "matmul_abt": lambda: a @ b.T, "matmul_atb": lambda: a.T @ b}[entry]
    f()
    best = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        f()
        best.append(time.perf_counter() - t0)
    M, N = f().shape
    Kd = a.shape[0] if entry == "matmul_atb" else a.shape[1]
    return 2 * M * N * Kd / np.median(best) / 1e9


def bench_one(gpu, plan, entry, variant, dtype, a, b, repeats) -> dict:
    kn = Kernels(gpu, plan)
    M, Kd = a.shape
    N = b.shape[1]
    out = gpu.tensor((M, N))
    A = a.T.copy() if entry == "matmul_atb" else a              # stored as the kernel reads it
    B = b.T.copy() if entry == "matmul_abt" else b
    if dtype in ("f16", "f16mixed"):   # WGSL's f16; judged against the twin (each product rounded to f16)
        half = lambda x: gpu.tensor((x.size // 2,), "f16", data=R.cast_f16(x))
        ah, bh = half(A), half(B)
        if dtype == "f16mixed":
            ah, bh = (gpu.upload(A), bh) if entry == "matmul_abt" else (ah, gpu.upload(B))
        extra = [None] if entry == "matmul" else []
        d = getattr(kn, entry)(ah, bh, *extra, out, M, N, Kd, variant=variant, dtype="f16")
        want = getattr(R, entry + "_f16")(A, B)
    elif dtype in ("bf16", "mixed"):   # packed two to a word; judged against the product of the rounded values
        ah, bh = R.cast_bf16(A).reshape(A.shape[0], -1), R.cast_bf16(B).reshape(B.shape[0], -1)
        if dtype == "mixed":           # the backward's float32 gradient: A of A @ B^T, B of A^T @ B
            ah, bh = (A, bh) if entry == "matmul_abt" else (ah, B)
        extra = [None] if entry == "matmul" else []
        up = lambda x: gpu.upload(x, dtype="bf16" if x.dtype == np.uint32 else None)
        d = getattr(kn, entry)(up(ah), up(bh), *extra, out, M, N, Kd, variant=variant, dtype="bf16")
        want = getattr(R, entry + "_words_sg")(ah, bh)
    else:
        fn = getattr(kn, entry)
        extra = [None] if entry == "matmul" else []
        d = fn(gpu.upload(A), gpu.upload(B), *extra, out, M, N, Kd, variant=variant)
        want = a.astype(np.float64) @ b
    gpu.run([d])
    err = float(np.abs(gpu.read(out) - want).max())
    ms, method = time_dispatches(gpu, [d], repeats)
    gf = 2 * M * N * Kd / ms / 1e6
    npg = numpy_gflops(entry, A, B, repeats)
    return {"kernel": f"{entry}:{variant}", "variant": variant, "dtype": dtype,
            "tile": "x".join(map(str, plan.matmul_tile)) if variant == "tiled" else "", "M": M, "N": N, "K": Kd,
            "gflops": gf, "numpy_gflops": npg, "ratio": gf / npg, "ms": ms, "max_err": err, "timing": method}


def matmul_shapes(s):
    """MxNxK,...: each a triple of positive whole numbers."""
    out = []
    for sh in filter(None, (t.strip() for t in s.split(","))):
        dims = sh.lower().split("x")
        if len(dims) != 3:
            raise argparse.ArgumentTypeError(f"expected MxNxK, got {sh!r}")
        out.append(tuple(positive_int(d) for d in dims))
    if not out:
        raise argparse.ArgumentTypeError(f"expected MxNxK,..., got {s!r}")
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=positive_ints, default="256,512,1024,2048",
                    help="square sizes M=N=K, comma-separated")
    ap.add_argument("--shapes", type=matmul_shapes,
                    help="MxNxK,... instead of --sizes (e.g. the small preset's 1024x384x96)")
    ap.add_argument("--repeats", type=positive_int, default=3)
    ap.add_argument("--kernels", help="comma-separated subset, e.g. matmul:vec4,matmul_atb:scalar")
    ap.add_argument("--dtypes", default="f32",
                    help="f32, bf16, mixed, f16, f16mixed, or several (f32,bf16,f16): the operands' storage")
    ap.add_argument("--rounds", type=positive_int, default=1,
                    help="measure every kernel this many times, interleaved, and keep each one's fastest: "
                         "on a machine whose speed drifts, kernels compared in one round share its minute")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    if not dtypes or not set(dtypes) <= {"f32", "bf16", "mixed", "f16", "f16mixed"}:
        raise SystemExit(f"error: --dtypes takes f32, bf16, mixed, f16 and f16mixed, got {args.dtypes!r}")
    gpu = GPU()
    print(f"adapter: {gpu.name} ({gpu.backend})", file=sys.stderr)
    if {"f16", "f16mixed"} & set(dtypes) and "shader-f16" not in gpu.features:
        raise SystemExit(f"error: --dtypes f16 needs the shader-f16 feature, which {gpu.name} ({gpu.backend}) lacks; "
                         "leave f16 out")
    chosen = KERNELS if not args.kernels else [tuple(k.split(":")) for k in args.kernels.split(",")]
    if not subgroups_ok(gpu):  # the sg kernels need the subgroup feature, and to agree with NumPy
        if args.kernels and any(v == "sg" for _, v in chosen):
            raise SystemExit(f"error: no working subgroups on {gpu.name} ({gpu.backend}); leave out the :sg kernels")
        chosen = [(e, v) for e, v in chosen if v != "sg"]
    plan = make_plan(gpu)
    if tile_problem(gpu.limits, plan.matmul_tile):
        chosen = [(e, v) for e, v in chosen if v != "tiled"]
    rows = []
    shapes = args.shapes or [(n, n, n) for n in args.sizes]
    for M, N, Kd in shapes:
        n = f"{M}x{N}x{Kd}"
        r = np.random.default_rng(M * N + Kd)
        a = r.standard_normal((M, Kd)).astype(np.float32)
        b = r.standard_normal((Kd, N)).astype(np.float32)
        best = {}
        for _ in range(max(1, args.rounds)):
            for dtype in dtypes:
                for entry, variant in chosen:
                    if dtype in ("f16", "f16mixed"):
                        ok = K.vec4_ok if variant == "tiled" else K.quad_ok
                        if variant not in F16 or (variant != "scalar" and not ok(entry, M, N, Kd)) \
                                or (dtype == "f16mixed" and entry == "matmul"):
                            continue
                    elif dtype != "f32":
                        if variant not in BF16 or (variant == "sg" and not K.half_ok(entry, M, N, Kd)) \
                                or (dtype == "mixed" and entry == "matmul"):
                            continue
                    r_ = bench_one(gpu, plan, entry, variant, dtype, a, b, args.repeats)
                    key = (entry, variant, dtype)
                    if key not in best or r_["ms"] < best[key]["ms"]:
                        best[key] = r_
                    print(f"{entry}:{variant} {dtype} {n}: {r_['gflops']:.2f} GFLOP/s ({r_['ms']:.2f} ms), "
                          f"numpy {r_['numpy_gflops']:.1f}", file=sys.stderr)
        rows += best.values()
    if not args.json:
        timing = rows[0]["timing"] if rows else "-"
        print(f"# {gpu.name} ({gpu.backend}); GPU time from {timing}, median of {args.repeats}"
              + (f", fastest of {args.rounds} interleaved rounds" if args.rounds > 1 else ""))
    emit(rows, args.json,
         ["kernel", "dtype", "M", "N", "K", "ms", "gflops", "numpy_gflops", "ratio", "max_err", "tile"])


if __name__ == "__main__":
    run_script("bench_matmul", main)
