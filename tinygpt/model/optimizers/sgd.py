"""SGD with momentum: m = mu m + (1 - mu) g, then w -= lr (m + wd w). The momentum is the running
mean of the gradient (torch.optim.SGD's with dampening = mu, so its lr is torch's divided by
1 - mu): the file's m slot holds it as it is, and an AdamW resumed from the file reads it as
its m. Plain SGD is mu = 0."""
from __future__ import annotations

from dataclasses import replace

from ...core.config import TRAIN_DEFAULTS
from .base import ElementwiseOptimizer, Hyper, frame

# p.k0 = mu (the momentum)
SGD_WGSL = """
fn update(i: u32, grad: V, wd: f32, t: f32) {
  let mi = p.k0 * m[i] + (1.0 - p.k0) * grad;
  m[i] = mi;
  let wi = w[i];
  w[i] = wi - p.lr * (mi + wd * wi);
}
"""


def sgd(g, wd, gate, w, m, v, lr, mu, _k1=0.0, _k2=0.0):
    """SGD_WGSL's twin: one step in place on w, m (v: unused)."""
    f = frame(wd, gate, w.shape)
    if f is None:
        return
    d, mine = f
    m1 = mu * m + (1 - mu) * (g * gate["factor"])
    w1 = w - lr * (m1 + d * w)
    w[mine], m[mine] = w1[mine], m1[mine]


class SGD(ElementwiseOptimizer):
    name = "sgd"
    summary = "sgd (with momentum, one moment)"
    hypers = {"momentum": Hyper(0.9, "sgd's momentum: the running mean's decay", "momentum")}
    state_rows = ("sgd m",)
    # 300 steps of tiny at lr 0.1, 0.3, 1 and 3 (docs/results.md, "Optimizers"): 0.3 did best, far
    # behind AdamW; every preset takes it, the others unswept
    schedules = {name: replace(d, lr=0.3) for name, d in TRAIN_DEFAULTS.items()}
    wgsl = SGD_WGSL
    twin = staticmethod(sgd)

    @staticmethod
    def constants(s):
        return s.momentum, 0.0, 0.0
