"""Timing helpers shared by the scripts: GPU time from timestamp queries where
the adapter offers them (median of several runs after a warm-up), else wall
time around a fenced submit. Every script validates before it times."""
from __future__ import annotations

import json
import sys
import time

import numpy as np

from .gpu import GPU, Profiler


def time_dispatches(gpu: GPU, dispatches, repeats: int = 3, method: str | None = None):
    """-> (median ms of one run of all dispatches, "timestamp" | "wall")."""
    method = method or ("timestamp" if "timestamp-query" in gpu.features else "wall")
    gpu.run(dispatches)  # warm-up: pipelines compiled, caches filled
    gpu.sync()
    runs = []
    if method == "timestamp":
        prof = Profiler(gpu, len(dispatches))
        for _ in range(repeats):
            gpu.run(dispatches, timestamps=prof)
            runs.append(float(prof.read_ms(len(dispatches)).sum()))
    else:
        for _ in range(repeats):
            t0 = time.perf_counter()
            gpu.run(dispatches)
            gpu.sync()
            runs.append(1e3 * (time.perf_counter() - t0))
    return float(np.median(runs)), method


def emit(rows, as_json: bool, columns, file=None):
    """Rows as JSON Lines on stdout, or as an aligned table."""
    file = file or sys.stdout
    if as_json:
        for r in rows:
            print(json.dumps(r), file=file)
        return
    widths = [max(len(c), *(len(fmt(r.get(c))) for r in rows)) for c in columns]
    print("  ".join(c.rjust(w) for c, w in zip(columns, widths)), file=file)
    for r in rows:
        print("  ".join(fmt(r.get(c)).rjust(w) for c, w in zip(columns, widths)), file=file)


def fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        if v == 0:
            return "0"
        if abs(v) >= 1000:
            return f"{v:,.0f}"
        if abs(v) >= 1:
            return f"{v:.3f}"
        return f"{v:.3g}" if abs(v) >= 1e-3 else f"{v:.2e}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)
