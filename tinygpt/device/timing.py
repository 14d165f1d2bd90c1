"""The time of a list of dispatches: GPU time from timestamp queries where the adapter offers
them (median of several runs after a warm-up), else wall time around a fenced submit. `tinygpt
tune` and the benchmark scripts use it; each validates a kernel against NumPy before timing it."""
from __future__ import annotations

import time

import numpy as np

from .gpu import GPU, Timestamps


def time_dispatches(gpu: GPU, dispatches, repeats: int = 3, method: str | None = None):
    """-> (median ms of one run of all dispatches, "timestamp" | "wall")."""
    method = method or ("timestamp" if "timestamp-query" in gpu.features else "wall")
    gpu.run(dispatches)  # warm-up: pipelines compiled, caches filled
    gpu.sync()
    runs = []
    if method == "timestamp":
        prof = Timestamps(gpu, len(dispatches))
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
