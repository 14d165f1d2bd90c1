"""Per-kernel GPU time of one training step, grouped forward / backward / optimizer.

Each dispatch runs in its own compute pass with timestamp writes (the
adapter must offer timestamp queries); times are medians over several steps.
"""
from __future__ import annotations

from collections import defaultdict

import numpy as np

from .gpu import Profiler
from .model import Model


def profile_step(model: Model, x, y, lr: float = 3e-4, repeats: int = 5):
    """-> rows [(group, kernel, calls, ms)] sorted by time, and the total ms of a step."""
    groups = model.dispatch_groups()
    ds = [d for _, d in groups]
    prof = Profiler(model.gpu, len(ds))
    model.write_batch(x, y)
    runs = []
    for _ in range(repeats + 1):  # the first is a warm-up
        model.gpu.run(ds, timestamps=prof)
        runs.append(prof.read_ms(len(ds)))
    ms = np.median(np.stack(runs[1:]), axis=0)
    agg = defaultdict(lambda: [0, 0.0])
    for (g, d), t in zip(groups, ms):
        a = agg[(g, d.kernel.name)]
        a[0] += 1
        a[1] += float(t)
    rows = sorted(((g, k, c, t) for (g, k), (c, t) in agg.items()), key=lambda r: -r[3])
    return rows, float(ms.sum())


def format_profile(rows, total) -> str:
    out = [f"{'group':10s} {'kernel':24s} {'calls':>5s} {'ms':>9s} {'share':>6s}"]
    by_group = defaultdict(float)
    for g, k, c, t in rows:
        by_group[g] += t
        out.append(f"{g:10s} {k:24s} {c:5d} {t:9.3f} {100 * t / total:5.1f}%")
    out.append("-" * 58)
    for g in ("forward", "backward", "optimizer"):
        out.append(f"{g:10s} {'(all)':24s} {'':5s} {by_group[g]:9.3f} {100 * by_group[g] / total:5.1f}%")
    out.append(f"{'step':10s} {'(all)':24s} {'':5s} {total:9.3f} 100.0%")
    return "\n".join(out)
