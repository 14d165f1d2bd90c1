#!/usr/bin/env python3
"""What the adapter can do at all: peak vec4 FMA throughput with no memory traffic, the
rate of storage-buffer loads (address per lane, or per workgroup) and of workgroup-memory loads,
and, where subgroups work, the rate of subgroup broadcasts (FMA chains as probe_fma, each
new value broadcast to the subgroup: a value handed over instead of loaded).

These bound every kernel: a matmul cannot beat the FMA peak, and on a CPU adapter (lavapipe)
the per-lane load rate is what the kernels are designed around.

    python scripts/probe_adapter.py [--json]
"""
import argparse
import sys
import time

import numpy as np

from tinygpt.reference import kernels as R
from tinygpt.device.timing import time_dispatches
from tinygpt.commands.tables import emit
from tinygpt.device.gpu import GPU
from tinygpt.device.kernels import SUBGROUPS
from tinygpt.device.planner import subgroups_ok
from tinygpt.commands.argtypes import positive_int
from tinygpt.commands.cli import run_script


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--invocations", type=positive_int, default=64 * 1024)
    ap.add_argument("--iters", type=positive_int, default=4096)
    ap.add_argument("--json", action="store_true", help="the rows as JSON Lines")
    ap.add_argument("--quiet", action="store_true", help="no progress bar")
    args = ap.parse_args(argv)
    gpu = GPU()
    n, it = args.invocations, args.iters
    n4 = 1 << 16  # 1 MiB of vec4: stays in cache, so loads measure the adapter, not DRAM
    src_np = np.random.default_rng(0).standard_normal(4 * n4).astype(np.float32)
    src = gpu.upload(src_np)
    out = gpu.tensor((4 * n,))
    rows = []
    probes = [("probe_fma", "vec4 FMA, registers only", 8 * 4 * 2),
              ("probe_load_lane", "vec4 loads, address per lane", 4),
              ("probe_load_wg", "vec4 loads, address per workgroup", 4),
              ("probe_load_shared", "vec4 loads from workgroup memory", 4)]
    if subgroups_ok(gpu):
        probes.append(("probe_broadcast", "vec4 subgroup broadcasts (+ as many FMA)", 8 * 4))
    from tqdm import tqdm       # each probe takes up to a minute on a CPU adapter: say which one runs
    bar = tqdm(probes, unit="probe", file=sys.stderr, disable=args.quiet, dynamic_ncols=True)
    for entry, what, per in bar:
        bar.set_description(f"{entry} ({n:,} x {it} iterations)")
        sg = entry == "probe_broadcast"
        k = gpu.kernel("probe.wgsl", entry, "urw", fill=SUBGROUPS if sg else None)
        d = gpu.dispatch(k, (it, n4), [src, out], (n // 8 if sg else n // 64,))
        gpu.run([d])  # validate on the first 256 invocations before timing
        got = gpu.read(out, count=4 * 256).reshape(256, 4)
        twin = getattr(R, entry)
        reads = entry not in ("probe_fma", "probe_broadcast")          # the probes that read a source
        want = twin(src_np.reshape(-1, 4).astype(np.float64), it, 256) if reads else twin(it, 256)
        err = float(np.abs(got - want).max() / max(1.0, np.abs(want).max()))
        if err > 1e-3:
            raise SystemExit(f"{entry}: result differs from its NumPy twin (relative error {err:.2e})")
        ms, method = time_dispatches(gpu, [d], 3)
        rate = n * it * per / ms / 1e6  # GFLOP/s, or G floats loaded per s
        rows.append({"probe": entry, "what": what, "ms": ms, "max_rel_err": err,
                     "rate": rate, "unit": "GFLOP/s" if entry == "probe_fma" else "Gfloat/s", "timing": method})
        bar.write(f"{entry}: {rate:.2f} {rows[-1]['unit']}", file=sys.stderr)
    a = np.random.default_rng(1).standard_normal((1024, 1024)).astype(np.float32)
    a @ a
    t0 = time.perf_counter()
    for _ in range(5):
        a @ a
    npg = 5 * 2 * 1024 ** 3 / (time.perf_counter() - t0) / 1e9
    rows.append({"probe": "numpy_sgemm_1024", "what": "NumPy a @ a, same process", "ms": None, "rate": npg,
                 "unit": "GFLOP/s", "timing": "wall"})
    if not args.json:
        print(f"# {gpu.name} ({gpu.backend}); {n:,} invocations x {it} iterations")
    emit(rows, args.json, ["probe", "what", "ms", "rate", "unit"])


if __name__ == "__main__":
    run_script("probe_adapter", main)
