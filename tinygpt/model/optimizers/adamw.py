"""AdamW, TinyGPT's: beta1 0.9, beta2 0.95, eps 1e-8, bias-corrected, decoupled decay, over every
trainable parameter. Its m and v are upstream's moments: the .tinygpt file's slots hold them
where TinyGPT's readers look, and a LoRA run (whose file and PEFT export carry AdamW moments)
trains with it."""
from __future__ import annotations

import numpy as np

from ...core.config import ADAMW_BETA1, ADAMW_BETA2, ADAMW_EPS
from .base import ElementwiseOptimizer, Hyper, frame

# p.k0 = beta1, p.k1 = beta2, p.k2 = eps (AdamW.constants)
ADAMW_WGSL = """
fn update(i: u32, grad: V, wd: f32, t: f32) {
  let mi = p.k0 * m[i] + (1.0 - p.k0) * grad;
  let vi = p.k1 * v[i] + (1.0 - p.k1) * grad * grad;
  m[i] = mi;
  v[i] = vi;
  let mhat = mi / (1.0 - pow(p.k0, t));
  let vhat = vi / (1.0 - pow(p.k1, t));
  let wi = w[i];
  w[i] = wi - p.lr * (mhat / (sqrt(vhat) + p.k2) + wd * wi);
}
"""


def adamw(g, wd, gate, w, m, v, lr, beta1, beta2, eps):
    """ADAMW_WGSL's twin: one AdamW step in place on w, m, v (flat); wd per element (or scalar);
    gate: grad_clip's (factor, skip, taken: t counts from 1)."""
    f = frame(wd, gate, w.shape)
    if f is None:
        return
    d, mine = f
    t = gate["taken"]
    g = g * gate["factor"]
    m1 = beta1 * m + (1 - beta1) * g
    v1 = beta2 * v + (1 - beta2) * g * g
    mhat = m1 / (1 - beta1 ** t)
    vhat = v1 / (1 - beta2 ** t)
    w1 = w - lr * (mhat / (np.sqrt(vhat) + eps) + d * w)
    w[mine], m[mine], v[mine] = w1[mine], m1[mine], v1[mine]


class AdamW(ElementwiseOptimizer):
    name = "adamw"
    summary = "adamw (TinyGPT's: every parameter, two moments)"
    hypers = {"beta1": Hyper(ADAMW_BETA1, "adamw's first-moment decay", "beta1"),
              "beta2": Hyper(ADAMW_BETA2, "adamw's second-moment decay", "beta2"),
              "eps": Hyper(ADAMW_EPS)}
    state_rows = ("adam m", "adam v")
    upstream_moments = True
    wgsl = ADAMW_WGSL
    twin = staticmethod(adamw)

    @staticmethod
    def constants(s):
        return s.beta1, s.beta2, s.eps
