"""The optimizers' steps in float64: the gate (the global norm and the clip), then the optimizer
the settings name over the parameters `shapes` names. Each optimizer's step is its room's
(model.optimizers: `reference_step`, composed of the twins of its kernels, which this module
hands it as `K`), in the order the device runs them; the settings come from the caller (the
reference imports no room). The state is {row: {name: array}} under the optimizer's state rows,
plus "t", the updates taken."""
from __future__ import annotations

import numpy as np

from ..core.config import Config, param_shapes
from . import kernels as K
from .kernels import grad_clip, grad_sumsq


def new_state(params: dict, settings) -> dict:
    """Zero state for `params` (every row of the optimizer), no updates taken."""
    return {**{row: {k: np.zeros_like(v) for k, v in params.items()} for row in settings.kind.state_rows}, "t": 0}


def step(params: dict, grads: dict, state: dict, cfg: Config, lr: float, settings, shapes=None,
         gate: dict | None = None) -> float:
    """One optimizer step in place on params and state; returns the gradient's norm. gate: the
    device's gate (kernels.GATE's names) where a test follows a loss scaler's; else an unscaled one."""
    s = settings
    shapes = param_shapes(cfg) if shapes is None else shapes
    flat = np.concatenate([grads[name].reshape(-1) for name, _, _ in shapes])
    gate = gate if gate is not None else {"norm": 0.0, "factor": 1.0, "skip": 0, "taken": state["t"]}
    clip = cfg.grad_clip if cfg.grad_clip > 0 else np.inf
    norm, _ = grad_clip(grad_sumsq(flat), clip, gate)
    state["t"] = gate["taken"]
    for name, _, decayed in shapes:
        s.kind.reference_step(K, s, name, grads[name], s.weight_decay if decayed else 0.0, gate, params[name],
                              state, lr)
    return norm
