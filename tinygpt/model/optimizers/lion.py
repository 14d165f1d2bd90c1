"""Lion (Chen et al., 2023): w -= lr (sign(beta1 m + (1 - beta1) g) + wd w); m = beta2 m +
(1 - beta2) g. One moment, the file's m slot; its v slot holds m^2. Its learning rate is about a
tenth of AdamW's: its schedule below."""
from __future__ import annotations

import numpy as np

from ...core.config import TrainDefaults
from .base import ElementwiseOptimizer, Hyper, frame

# p.k0 = beta1 (the interpolation), p.k1 = beta2 (the moment's decay)
LION_WGSL = """
fn update(i: u32, grad: V, wd: f32, t: f32) {
  let mi = m[i];
  let wi = w[i];
  w[i] = wi - p.lr * (sign(p.k0 * mi + (1.0 - p.k0) * grad) + wd * wi);
  m[i] = p.k1 * mi + (1.0 - p.k1) * grad;
}
"""


def lion(g, wd, gate, w, m, v, lr, beta1, beta2, _unused=0.0):
    """LION_WGSL's twin: one Lion step in place on w, m (v: unused, as the kernel's binding is)."""
    f = frame(wd, gate, w.shape)
    if f is None:
        return
    d, mine = f
    g = g * gate["factor"]
    w1 = w - lr * (np.sign(beta1 * m + (1 - beta1) * g) + d * w)
    m1 = beta2 * m + (1 - beta2) * g
    w[mine], m[mine] = w1[mine], m1[mine]


class Lion(ElementwiseOptimizer):
    name = "lion"
    summary = "lion (the sign of a momentum, one moment)"
    hypers = {"beta1": Hyper(0.9, "lion's interpolation", "beta1"),
              "beta2": Hyper(0.99, "lion's moment decay", "beta2")}
    state_rows = ("lion m",)
    # On tiny a constant 1e-4 after the warm-up did best of the seven tried (1e-4 to 3e-3, floors
    # lr/100 and 1e-4), far behind AdamW; small (1.984 with it, AdamW 1.745) and medium take it
    # unswept (docs/results.md, "Optimizers").
    schedules = {"tiny": TrainDefaults(2000, 1e-4, 200, 1e-4), "small": TrainDefaults(2000, 1e-4, 200, 1e-4),
                 "medium": TrainDefaults(1000, 1e-4, 100, 1e-4)}
    wgsl = LION_WGSL
    twin = staticmethod(lion)

    @staticmethod
    def constants(s):
        return s.beta1, s.beta2, 0.0
