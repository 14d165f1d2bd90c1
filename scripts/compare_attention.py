#!/usr/bin/env python3
"""Attention side by side: naive, fused_sv and online at a ladder of sequence lengths.
Where online runs online_sg.wgsl (subgroups: the default on CPU adapters), online-tiles
adds the same algorithm in online.wgsl's workgroup-memory tiles.

For each T and each implementation: forward, and forward+backward; GPU ms,
attention scratch bytes, max abs error against the float64 reference (out, and
dq/dk/dv for the backward), and naive/online. Validates before it times. With --windows,
every path again with each sliding window W < T (window column; 0: plain causal): the online
path skips the tiles outside every query's window, so its time falls with W. With --records,
every path again on packed windows (a chat file's training) of records N tokens long, each
attending within itself (records column; 0: one record a window): what the document mask costs.

    python scripts/compare_attention.py                    # T = 256, 1024, 4096; B=1, H=1, hd=64
    python scripts/compare_attention.py --T 64,128 --json  # JSON Lines on stdout
    python scripts/compare_attention.py --plot att.png
    python scripts/compare_attention.py --T 1024 --windows 32,128,512   # online's time against W
    python scripts/compare_attention.py --T 1024 --records 100            # packed records of 100 tokens
"""
import argparse
import sys

import numpy as np

from tinygpt.model import attention as A
from tinygpt.device import kernels as K
from tinygpt.device.kernels import Kernels
from tinygpt.reference import attention as RA
from tinygpt.device.timing import time_dispatches
from tinygpt.commands.tables import emit
from tinygpt.files.outputs import claim_plot, save_png
from tinygpt.commands.argtypes import positive_int, positive_ints
from tinygpt.commands.cli import run_script
from tinygpt.commands.settings import add_setting
from tinygpt.device.gpu import GPU, LimitError
from tinygpt.device.planner import make_plan


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--T", type=positive_ints, default="256,1024,4096", help="comma-separated sequence lengths")
    ap.add_argument("--batch", type=positive_int, default=1)
    ap.add_argument("--heads", type=positive_int, default=1)
    ap.add_argument("--head-dim", type=positive_int, default=64)
    ap.add_argument("--repeats", type=positive_int, default=3)
    ap.add_argument("--windows", type=positive_ints, default=[],
                    help="comma-separated sliding windows: every path again with each one below T")
    ap.add_argument("--records", type=positive_ints, default=[],
                    help="comma-separated record lengths: every path again on windows packed with such records")
    ap.add_argument("--json", action="store_true", help="JSON Lines on stdout, diagnostics on stderr")
    ap.add_argument("--plot", help="write time and memory against T (log axes) to this PNG")
    add_setting(ap, "kernels")
    args = ap.parse_args(argv)
    claim_plot(args.plot)   # before any work, as the CLI claims its outputs
    Ts = args.T
    B, H, hd = args.batch, args.heads, args.head_dim
    C = H * hd
    gpu = GPU()
    plan = make_plan(gpu, args.kernels)
    print(f"kernels: {plan.describe()}", file=sys.stderr)
    print(f"adapter: {gpu.name} ({gpu.backend}); B={B} H={H} hd={hd}", file=sys.stderr)
    rows = []
    for T in Ts:
        r = np.random.default_rng(T)
        q, k, v, do = (r.standard_normal((B, T, C)).astype(np.float32) for _ in range(4))
        f = lambda a: a.astype(np.float64)
        tq, tk, tv, tdo = (gpu.upload(x) for x in (q, k, v, do))
        out, dq, dk, dv = (gpu.tensor((B, T, C)) for _ in range(4))
        times = {}
        impls = list(A.IMPLS) + (["online-tiles"] if K.online_variant(plan, T, hd) == "sg" else [])
        runs = [(impl, w, 0) for w in [0] + [w for w in args.windows if w < T] for impl in impls]
        runs += [(impl, 0, n) for n in args.records if n < T for impl in impls]
        refs = {}
        for impl, window, n in runs:
            docs = np.tile(np.arange(T, dtype=np.uint32) % n, (B, 1)) if n else None   # records of n, end to end
            if (window, n) not in refs:
                refs[(window, n)] = (RA.attention_forward(f(q), f(k), f(v), H, window=window, docs=docs),
                                     RA.attention_backward(f(q), f(k), f(v), f(do), H, window=window, docs=docs))
            ref_out, ref_grads = refs[(window, n)]
            path = A.path("online" if impl == "online-tiles" else impl)
            base = dict(impl=impl, T=T, window=window, records=n, B=B, H=H, hd=hd,
                        scratch_bytes=path.scratch_bytes(B, T, H))
            p = plan.with_(attention="tiles") if impl == "online-tiles" else plan
            try:
                path.check(T, C, H)
                att = path.bind(Kernels(gpu, p), B, T, C, H, path.own_scratch(gpu, B, T, H), window,
                                docs=None if docs is None else gpu.upload(docs.reshape(-1)))
                fwd = att.forward(tq, tk, tv, out)
                bwd = att.backward(tq, tk, tv, out, tdo, dq, dk, dv)
            except (A.AttentionError, LimitError) as e:
                for pas in ("fwd", "fwd+bwd"):
                    rows.append(dict(base, **{"pass": pas, "ms": None, "max_err": None, "status": f"n/a: {e}"}))
                continue
            gpu.run(fwd + bwd)  # validate before timing
            err_out = float(np.abs(gpu.read(out) - ref_out).max())
            err_grads = [float(np.abs(gpu.read(t) - g).max()) for t, g in zip((dq, dk, dv), ref_grads)]
            for pas, ds, err in (("fwd", fwd, err_out), ("fwd+bwd", fwd + bwd, max([err_out] + err_grads))):
                ms, method = time_dispatches(gpu, ds, args.repeats)
                times[(impl, window, n, pas)] = ms
                row = dict(base, **{"pass": pas, "ms": ms, "max_err": err, "status": "ok", "timing": method})
                if pas == "fwd+bwd":
                    row.update(err_out=err_out, err_dq=err_grads[0], err_dk=err_grads[1], err_dv=err_grads[2])
                rows.append(row)
            fw, both = times[(impl, window, n, "fwd")], times[(impl, window, n, "fwd+bwd")]
            print(f"T={T} {impl}" + (f" window {window}" if window else "") + (f" records of {n}" if n else "")
                  + f": fwd {fw:.3f} ms, fwd+bwd {both:.3f} ms", file=sys.stderr)
            del att
        for row in rows:
            plain = ("naive", 0, 0, row["pass"])
            if row["T"] == T and row["impl"].startswith("online") and not row["window"] and not row["records"] \
                    and plain in times \
                    and row["ms"]:
                row["naive_over_online"] = times[plain] / row["ms"]
    cols = ["impl", "T"] + (["window"] if args.windows else []) + (["records"] if args.records else []) + \
        ["pass", "ms", "scratch_bytes", "max_err", "naive_over_online", "status"]
    if not args.json:
        print(f"# {gpu.name} ({gpu.backend}), B={B} H={H} hd={hd}; ms = "
              f"{rows[0].get('timing', 'timestamp') if rows else ''} GPU time, median of {args.repeats}")
    emit(rows, args.json, cols)
    if args.plot:
        plot(rows, args.plot)
        print(f"wrote {args.plot}", file=sys.stderr)


def plot(rows, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4))
    rows = [r for r in rows if not r["window"] and not r["records"]]      # time against T: the plain rows
    for impl in dict.fromkeys(r["impl"] for r in rows):
        for pas, style in (("fwd", "--"), ("fwd+bwd", "-")):
            pts = [(r["T"], r["ms"]) for r in rows if r["impl"] == impl and r["pass"] == pas and r["ms"]]
            if pts:
                a1.plot(*zip(*pts), style, marker="o", label=f"{impl} {pas}")
        pts = [(r["T"], r["scratch_bytes"]) for r in rows if r["impl"] == impl and r["pass"] == "fwd"]
        a2.plot(*zip(*pts), marker="o", label=impl)
    for ax, yl in ((a1, "ms"), (a2, "attention scratch bytes")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("T")
        ax.set_ylabel(yl)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    save_png(fig, path)


if __name__ == "__main__":
    run_script("compare_attention", main)
