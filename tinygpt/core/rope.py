"""The rotary position embedding's table: what rope.wgsl's kernels read, made on the host once a
model's shape is known, since WGSL's sin and cos promise 2^-11 only on [-pi, pi] and a
position's angle runs to thousands of radians."""
from __future__ import annotations

import numpy as np


# the scaled RoPEs whose frequencies are made here as transformers makes them (their attention
# scale is 1): linear (every frequency / factor) and Llama 3's (long wavelengths / factor, short ones
# kept, a smooth blend between), each with the fields it takes
SCALINGS = {"linear": ("factor",),
            "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")}


def inv_freq(hd: int, theta: float, scaling: dict | None = None, dtype=np.float32) -> np.ndarray:
    """theta^(-2i/hd), i < hd/2, as a scaled RoPE changes them (scaling: {"rope_type", its fields})."""
    f = 1.0 / (dtype(theta) ** (np.arange(0, hd, 2).astype(dtype) / dtype(hd)))
    kind = (scaling or {}).get("rope_type")
    if kind == "linear":
        return (f / dtype(scaling["factor"])).astype(dtype)
    if kind == "llama3":
        factor, low, high = (dtype(scaling[k]) for k in ("factor", "low_freq_factor", "high_freq_factor"))
        old = dtype(scaling["original_max_position_embeddings"])
        wavelen = dtype(2 * np.pi) / f
        scaled = np.where(wavelen > old / low, f / factor, f)
        smooth = (old / wavelen - low) / (high - low)
        blended = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < old / high) & ~(wavelen > old / low)
        return np.where(medium, blended, scaled).astype(dtype)
    return f


def rope_table(positions: int, hd: int, theta: float, dtype=np.float32, scaling: dict | None = None) -> np.ndarray:
    """(cos, sin) [positions, hd/2, 2] of the angles pos * inv_freq (theta^(-2i/hd), i < hd/2, as a
    scaled RoPE makes them): in float32 as transformers computes its table (inv_freq, then the
    product, in float32), or in float64."""
    freq = inv_freq(hd, theta, scaling, dtype)
    angles = np.arange(positions).astype(dtype)[:, None] * freq.astype(dtype)[None, :]
    return np.stack([np.cos(angles), np.sin(angles)], -1).astype(dtype)
