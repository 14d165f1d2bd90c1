"""The rotary position embedding's table: what rope.wgsl's kernels read, made on the host once a
model's shape is known, since WGSL's sin and cos promise 2^-11 only on [-pi, pi] and a
position's angle runs to thousands of radians."""
from __future__ import annotations

import numpy as np


def rope_table(positions: int, hd: int, theta: float, dtype=np.float32) -> np.ndarray:
    """(cos, sin) [positions, hd/2, 2] of the angles pos * theta^(-2i/hd), i < hd/2: in float32 as
    transformers computes its table (inv_freq, then the product, in float32), or in float64."""
    inv_freq = 1.0 / (dtype(theta) ** (np.arange(0, hd, 2).astype(dtype) / dtype(hd)))
    angles = np.arange(positions).astype(dtype)[:, None] * inv_freq.astype(dtype)[None, :]
    return np.stack([np.cos(angles), np.sin(angles)], -1).astype(dtype)
