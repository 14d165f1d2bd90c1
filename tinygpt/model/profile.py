"""Per-kernel GPU time of one training step, grouped forward / backward / optimizer, and how much
of the adapter each kernel uses.

Each dispatch runs in its own compute pass with timestamp writes (the adapter must offer
timestamp queries); times are medians over several steps. Utilisation: a kernel's GFLOP/s (its
matrix products, cost.kernel_flops) and GB/s (the bytes it binds, each read or written once)
against the adapter's peaks (tune.measure_peaks: FMA throughput and streaming bandwidth,
measured once and cached with the tuning); pct_peak is the larger of the two shares, the
resource the kernel is closest to exhausting. The step's model-FLOP utilisation (MFU) is
PaLM's and nanoGPT's: model FLOPs per token x tokens / GPU time / FMA peak.
"""
from __future__ import annotations

from collections import defaultdict

import numpy as np

from ..core.config import n_params
from ..device.cost import model_flops_per_token
from ..device.gpu import Timestamps
from .gpt import Model


def profile_step(model: Model, x, y, lr: float = 3e-4, repeats: int = 5, peaks: dict | None = None):
    """-> rows (dicts: group, kernel, calls, ms, gflops, gbps, pct_peak) sorted by time, and a
    summary dict (ms, tokens, model_gflops, mfu, peak_gflops, peak_gbps) of the whole step."""
    groups = model.dispatch_groups()
    ds = [d for _, d in groups]
    prof = Timestamps(model.gpu, len(ds))
    model.write_batch(x, y)
    runs = []
    for _ in range(repeats + 1):  # the first is a warm-up
        model.gpu.run(ds, timestamps=prof)
        runs.append(prof.read_ms(len(ds)))
    ms = np.median(np.stack(runs[1:]), axis=0)
    agg = defaultdict(lambda: {"calls": 0, "ms": 0.0, "flops": None, "bytes": 0})
    for (g, d), t in zip(groups, ms):
        a = agg[(g, d.kernel.name)]
        a["calls"] += 1
        a["ms"] += float(t)
        a["bytes"] += d.nbytes
        if d.flops is not None:
            a["flops"] = (a["flops"] or 0.0) + d.flops
    rows = []
    for (g, k), a in agg.items():
        t = max(a["ms"], 1e-9)
        gflops = a["flops"] / t / 1e6 if a["flops"] is not None else None
        gbps = a["bytes"] / t / 1e6
        rows.append({"group": g, "kernel": k, "calls": a["calls"], "ms": a["ms"], "gflops": gflops, "gbps": gbps})
    rows.sort(key=lambda r: -r["ms"])
    total = float(ms.sum())
    cfg = model.cfg
    tokens = model.B * model.T
    mflops = model_flops_per_token(n_params(cfg), cfg.layers, cfg.block.heads.q_width, model.T) * tokens
    summary = {"ms": total, "tokens": tokens, "model_gflops": mflops / 1e9}
    with_peaks(rows, summary, peaks)
    return rows, summary


def with_peaks(rows, summary, peaks: dict | None):
    """Each row's pct_peak and the step's mfu against these peaks (None without them), in place."""
    for r in rows:
        share = [v / peaks[key] for v, key in ((r["gflops"], "gflops"), (r["gbps"], "gbps")) if v is not None] \
            if peaks else []
        r["pct_peak"] = 100 * max(share) if share else None
    summary.update(mfu=summary["model_gflops"] * 1e3 / summary["ms"] / peaks["gflops"] if peaks else None,
                   peak_gflops=peaks["gflops"] if peaks else None, peak_gbps=peaks["gbps"] if peaks else None)


def over_peak(rows, summary) -> bool:
    """Whether a kernel, or the step, measured above the peaks: they were measured on a slower minute."""
    return any((r["pct_peak"] or 0) > 100 for r in rows) or (summary["mfu"] or 0) > 1


def format_profile(rows, summary) -> str:
    total = summary["ms"]
    f = lambda v, spec: ("-" if v is None else format(v, spec)).rjust(int(spec.split(".")[0]))
    out = [f"{'group':10s} {'kernel':24s} {'calls':>5s} {'ms':>9s} {'share':>6s} {'GFLOP/s':>8s} {'GB/s':>7s} "
           f"{'% peak':>6s}"]
    by_group = defaultdict(float)
    for r in rows:
        by_group[r["group"]] += r["ms"]
        out.append(f"{r['group']:10s} {r['kernel']:24s} {r['calls']:5d} {r['ms']:9.3f} {100 * r['ms'] / total:5.1f}% "
                   f"{f(r['gflops'], '8.2f')} {f(r['gbps'], '7.2f')} {f(r['pct_peak'], '6.1f')}")
    out.append("-" * 82)
    for g in ("forward", "backward", "optimizer"):
        out.append(f"{g:10s} {'(all)':24s} {'':5s} {by_group[g]:9.3f} {100 * by_group[g] / total:5.1f}%")
    out.append(f"{'step':10s} {'(all)':24s} {'':5s} {total:9.3f} 100.0%")
    if summary["mfu"] is not None:
        out.append(f"# model FLOPs {summary['model_gflops']:.3f} G a step ({summary['tokens']} tokens): "
                   f"{summary['model_gflops'] / total * 1e3:.2f} GFLOP/s, MFU {100 * summary['mfu']:.1f}% of the "
                   f"{summary['peak_gflops']:.1f} GFLOP/s FMA peak; streaming peak {summary['peak_gbps']:.1f} GB/s")
    if summary.get("peaks_reliable") is False:
        out.append("# not reliable: a kernel ran above the peaks even after they were measured again (the "
                   "machine's speed changed during the profile); run it again on a quiet machine")
    return "\n".join(out)
