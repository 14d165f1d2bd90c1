"""What the model hands its optimizer, and the gate that wraps every optimizer.

Each optimizer (model.optimizers, one room each) is one object made from its settings that adds
its state's rows (and any scratch) to the buffer table (`rows`, `sizes`, so the memory budget and
the allocation keep agreeing), records its dispatches over the flat parameter and gradient
buffers the model hands it (`Flat`), and rewrites its step's uniforms before each step
(`write_step`); its `state_rows` name the flat buffers that hold its state, which the model reads
and writes for the saver and the resume. The updates taken are the gate's count, on the device.

The gate (grad_norm.wgsl: the global norm, the clip factor and, for a precision that needs one,
the loss scaler) runs before any optimizer and leaves [norm, factor, ..., skip, ..., taken] in
one small buffer (kernels.GATE): every optimizer's kernels multiply the gradient by the factor,
change nothing on a skipped step and count their bias corrections from `taken`, so neither the
clip nor the scaler is a branch inside an optimizer.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..device.gpu import GPU, Tensor
from ..device.kernels import CHUNK, GATE, NO_CLIP, SCALE_GROWTH, Kernels
from .layout import flat_view


@dataclass
class Flat:
    """What the model hands an optimizer: its flat buffers, bound in `chunks` (first float,
    count) where they exceed one binding, the trainable parameters (name, shape, decayed) and
    where each lies, views of a flat buffer by parameter name, and the gate."""
    gpu: GPU
    kn: Kernels
    params: Tensor
    grads: Tensor
    gate: Tensor
    buf: dict           # the model's buffers by row name (the optimizer's own rows among them)
    chunks: list
    n: int
    trainable: list
    offsets: dict
    views: object       # flat Tensor -> {name: Tensor [shape]}


class Gate:
    """Clip by the global norm, and the loss scaler where the precision needs one: the partial
    sums of squares chunk by chunk, then the gate. Its rows are the table's "norm partials" and
    "gate"."""

    def __init__(self, clip: float, scaled: bool):
        self.clip = clip if clip > 0 else NO_CLIP          # 0: never clip
        self.scaled = scaled

    def record(self, f: Flat, partials: Tensor) -> list:
        """The chunks start on whole blocks of the partial sums, so the norm is that of one
        dispatch, bit for bit."""
        kn, scaler = f.kn, f.gate if self.scaled else None     # the loss scaler: unscale, find infs
        ds = [kn.optim.grad_sumsq(flat_view(f.grads, f0, k), partials, k, first=f0 // CHUNK, gate=scaler)
              for f0, k in f.chunks]
        return ds + [kn.optim.grad_clip(partials, f.gate, -(-f.n // CHUNK), self.clip,
                                  growth=SCALE_GROWTH if self.scaled else None)]

    @staticmethod
    def read(gpu: GPU, gate: Tensor) -> dict:
        """The gate's values (GATE's names: norm, scale, skipped, taken, ...), one read."""
        s = gpu.read(gate)
        return {k: float(s[i]) for k, i in GATE.items()}

    @staticmethod
    def write(gpu: GPU, gate: Tensor, **values):
        """Set any of the gate's values (a resumed run's step count and loss scaler, the first scale)."""
        for key, val in values.items():
            if val is not None:
                gpu.write(gate, np.array([val], np.float32), offset_elems=GATE[key])
