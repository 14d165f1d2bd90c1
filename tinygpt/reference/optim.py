"""The optimizers' steps in float64: the gate (the global norm and the clip), then AdamW, Lion or
Muon over the parameters `specs` names, composed of the twins of their kernels (reference.kernels)
in the order the device runs them. The settings are core.optim's; the state is {row: {name:
array}} under the rows core.optim.STATE_ROWS names, plus "t", the updates taken."""
from __future__ import annotations

import numpy as np

from ..core.config import Config, param_specs
from ..core.optim import NS_COEFFICIENTS, NS_EPS, NS_STEPS, STATE_ROWS, OptimizerSettings, is_muon_matrix, \
    make_settings, muon_ratio
from .kernels import adamw, grad_clip, grad_sumsq, lion, matmul, matmul_abt, matmul_atb, muon_momentum, \
    muon_normalize, muon_update, ns_mix


def new_state(params: dict, settings: OptimizerSettings | None = None) -> dict:
    """Zero state for `params` (every row of the optimizer), no updates taken."""
    name = (settings or make_settings("adamw")).name
    return {**{row: {k: np.zeros_like(v) for k, v in params.items()} for row in STATE_ROWS[name]}, "t": 0}


def newton_schulz(x: np.ndarray) -> np.ndarray:
    """The orthogonalisation of muon.wgsl and model.optim.Muon: normalise, then NS_STEPS quintic
    iterations X <- a X + (b A + c A A) X with A = X X^T, a tall matrix worked on as its transpose
    (X^T X and X B, which is the same arithmetic on X^T). x [batch, K, N]: each matrix alone."""
    a, b, c = NS_COEFFICIENTS
    x = muon_normalize(x, NS_EPS)
    tall = x.shape[-2] > x.shape[-1]
    for _ in range(NS_STEPS):
        A = matmul_atb(x, x) if tall else matmul_abt(x, x)
        B = ns_mix(A, matmul(A, A), b, c)
        x = ns_mix(x, matmul(x, B) if tall else matmul(B, x), a, 1.0)
    return x


def step(params: dict, grads: dict, state: dict, cfg: Config, lr: float, settings: OptimizerSettings | None = None,
         specs=None, gate: dict | None = None) -> float:
    """One optimizer step in place on params and state; returns the gradient's norm. gate: the
    device's gate (kernels.GATE's names) where a test follows a loss scaler's; else an unscaled one."""
    s = settings or make_settings("adamw")
    specs = param_specs(cfg) if specs is None else specs
    flat = np.concatenate([grads[name].reshape(-1) for name, _, _ in specs])
    gate = gate if gate is not None else {"norm": 0.0, "factor": 1.0, "skip": 0, "taken": state["t"]}
    clip = cfg.grad_clip if cfg.grad_clip > 0 else np.inf
    norm, _ = grad_clip(grad_sumsq(flat), clip, gate)
    state["t"] = gate["taken"]
    for name, _, decayed in specs:
        g, w, wd = grads[name], params[name], s.weight_decay if decayed else 0.0
        if s.name == "adamw" or (s.name == "muon" and not is_muon_matrix(name)):
            rows = STATE_ROWS[s.name]
            adamw(g, wd, gate, w, state[rows[0]][name], state[rows[1]][name], lr, s.beta1, s.beta2, s.eps)
        elif s.name == "lion":
            lion(g, wd, gate, w, state["lion m"][name], lr, s.beta1, s.beta2)
        else:
            u = np.zeros_like(g)
            muon_momentum(g, gate, state["muon m"][name], u, s.momentum, s.nesterov)
            muon_update(newton_schulz(u), gate, w, lr, wd, muon_ratio(w.shape))
    return norm
