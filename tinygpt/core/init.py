"""What the runtime prepares on the host: the initial weights and the token buckets of a batch.

Runtime code, not the judge: the reference imports these, never the other way round.
"""
from __future__ import annotations

import math

import numpy as np

from .config import Config, param_shapes


def init_params(cfg: Config, seed: int | None = None, dtype=np.float32):
    """TinyGPT's init: N(0, 0.02), residual projections N(0, 0.02/sqrt(2L)), LN gains 1, biases 0.

    Drawn in float64 from one seeded generator in .tinygpt order, so the GPU
    trainer and the reference start from the same bits."""
    rng = np.random.default_rng(cfg.seed if seed is None else seed)
    params = {}
    proj_std = 0.02 / math.sqrt(2 * cfg.layers)
    for name, shape, _ in param_shapes(cfg):
        short = name.split(".")[-1]
        if short in ("Wo", "fc_out_W"):
            a = rng.normal(0.0, proj_std, shape)
        elif short.endswith("_g"):
            a = np.ones(shape)
        elif len(shape) == 2:
            a = rng.normal(0.0, 0.02, shape)
        else:
            a = np.zeros(shape)
        params[name] = a.astype(dtype)
    return params


def token_buckets(tokens, V):
    """Positions grouped by token: offsets [V+1], positions [BT] (stable order)."""
    flat = np.asarray(tokens).reshape(-1)
    order = np.argsort(flat, kind="stable").astype(np.uint32)
    offsets = np.zeros(V + 1, np.uint32)
    np.cumsum(np.bincount(flat, minlength=V), out=offsets[1:])
    return offsets, order
