"""What the browser checks run: one training step recorded on this host's WebGPU as a trace,
with what this host computed from it, and the set of every module and pipeline the plans build.

Both are made under the browser's limits (the smaller of each, the larger offset alignment), so
that the trace asks nothing of the browser's device that it does not allow: the limits come from
the device that runs the work, as everywhere else.
"""
from __future__ import annotations

import base64
from contextlib import contextmanager

import numpy as np

from ..core.block import BLOCKS
from ..core.config import preset
from ..core.init import init_params
from ..core.precision import PRECISIONS
from ..device.gpu import GPU
from ..device.plan import PORTABLE
from ..device.trace import Recorder, collecting_kernels, recording
from ..model.attention import DEFAULT, IMPLS
from ..model.decode import Decoder
from ..model.gpt import Model
from ..model.spec import RunSpec, decoder_spec

# the browser's limit names (camelCase) -> wgpu-py's; the first group are ceilings, the second floors
CEILINGS = {"maxStorageBufferBindingSize": "max-storage-buffer-binding-size", "maxBufferSize": "max-buffer-size",
            "maxComputeWorkgroupStorageSize": "max-compute-workgroup-storage-size",
            "maxComputeInvocationsPerWorkgroup": "max-compute-invocations-per-workgroup",
            "maxStorageBuffersPerShaderStage": "max-storage-buffers-per-shader-stage",
            "maxComputeWorkgroupSizeX": "max-compute-workgroup-size-x",
            "maxComputeWorkgroupSizeY": "max-compute-workgroup-size-y"}
FLOORS = {"minStorageBufferOffsetAlignment": "min-storage-buffer-offset-alignment",
          "minUniformBufferOffsetAlignment": "min-uniform-buffer-offset-alignment"}


@contextmanager
def within(gpu: GPU, browser_limits: dict):
    """gpu.limits narrowed to what the browser's device allows too, restored on exit."""
    saved = dict(gpu.limits)
    for theirs, ours in CEILINGS.items():
        if theirs in browser_limits and ours in gpu.limits:
            gpu.limits[ours] = min(int(gpu.limits[ours]), int(browser_limits[theirs]))
    for theirs, ours in FLOORS.items():
        if theirs in browser_limits:
            gpu.limits[ours] = max(int(gpu.limits.get(ours, 0)), int(browser_limits[theirs]))
    try:
        yield gpu
    finally:
        gpu.limits.clear()
        gpu.limits.update(saved)


# The plans whose kernels the compile check builds: the portable one, each matmul family, and
# the subgroup set (compiled whether or not this host's subgroups pass the planner's check).
PLANS = {"portable": PORTABLE, "tiled": PORTABLE.with_(matmul="tiled"), "scalar": PORTABLE.with_(matmul="scalar"),
         "sg": PORTABLE.with_(matmul="sg", attention="sg", loss="sg", reduce="sg"),
         "elementwise-scalar": PORTABLE.with_(elementwise="scalar")}


def every_pipeline(gpu: GPU, browser_limits: dict, cfg_name: str = "tiny", browser_features=()) -> dict:
    """A trace without dispatches: each module and pipeline that the training model (every
    attention path, every precision whose feature the browser offers: f16 needs shader-f16) and
    the samplers build under each plan of PLANS, the training model with GPT-2's GELU (its
    kernels do not depend on the attention path: one), and with each modern block of BLOCKS on the
    default (online) path (RoPE turned by the projections and by the attention's backward, QK-norm, SwiGLU,
    ReLU²: their kernels' constants are the browser's to check too)."""
    cfg = preset(cfg_name)
    tanh = preset(cfg_name, activation="gelu_tanh")
    modern = [preset(cfg_name, **parts) for parts in BLOCKS.values() if parts]     # gpt2's: cfg
    rec = Recorder(gpu)
    with within(gpu, browser_limits), collecting_kernels(gpu) as kernels:   # built afresh under these limits
        for plan in PLANS.values():
            for impl in IMPLS:
                for prec in PRECISIONS.values():
                    if prec.feature and (prec.feature not in browser_features or prec.feature not in gpu.features):
                        continue
                    Model(gpu, plan, RunSpec(cfg, impl, precision=prec))
                    if impl == IMPLS[0]:
                        Model(gpu, plan, RunSpec(tanh, impl, precision=prec))
                    if impl == DEFAULT:
                        for c in modern:
                            Model(gpu, plan, RunSpec(c, impl, precision=prec))
                    for decode in ("cache", "full"):
                        Decoder(gpu, plan.with_(decode=decode), decoder_spec(cfg, impl, precision=prec))
    for k in kernels:
        rec.pipeline(k)
    return rec.as_dict({})


def traced_step(gpu: GPU, browser_limits: dict, cfg_name: str = "tiny", attention: str = "online",
                seed: int = 0, lr: float = 1e-3, max_binding: int | None = None, **overrides):
    """(trace, expected): one AdamW step of a freshly initialised model under the portable plan,
    recorded; expected holds the loss and the updated flat parameters this host computed.
    max_binding: a binding limit forced lower still, so that the step binds its buffers in chunks;
    overrides: of the preset's fields (batch, ctx, ...)."""
    cfg = preset(cfg_name, **overrides)
    limits = dict(browser_limits)
    if max_binding:
        held = int(limits.get("maxStorageBufferBindingSize", max_binding))
        limits["maxStorageBufferBindingSize"] = min(int(max_binding), held)
    with within(gpu, limits):
        m = Model(gpu, PORTABLE, RunSpec(cfg, attention))
        m.set_params(init_params(cfg, seed))
        tok = np.random.default_rng(seed).integers(0, cfg.vocab, (cfg.batch, cfg.ctx + 1))
        with recording(gpu) as rec:
            m.step(tok[:, :-1], tok[:, 1:], lr)
        expected = {"loss": np.float32(m.loss()), "params": gpu.read(m.buf["params"])}
        outputs = {"loss": rec.view(m.buf["loss slots"], 1), "params": rec.view(m.buf["params"])}
    return rec.as_dict(outputs), expected


def decode(outputs: dict) -> dict:
    """The page's base64 outputs as float32 arrays."""
    return {k: np.frombuffer(base64.b64decode(v), np.float32) for k, v in outputs.items()}


# The browser's step equals this host's within: the loss to 1e-5 of itself; each parameter to 1 %
# of the learning rate (one AdamW step moves a weight by about lr) plus 1e-6 of its size. The same
# WGSL on two compilers differs only in rounding (fused multiply-adds, the order of a reduction).
LOSS_RTOL = 1e-5
PARAM_LR_FRACTION = 1e-2


def compare(got: dict, expected: dict, lr: float) -> dict:
    loss_err = float(abs(np.float64(got["loss"][0]) - np.float64(expected["loss"])))
    diff = np.abs(got["params"].astype(np.float64) - expected["params"])
    bound = PARAM_LR_FRACTION * lr + 1e-6 * np.abs(expected["params"])
    return {"loss": float(got["loss"][0]), "loss_expected": float(expected["loss"]), "loss_err": loss_err,
            "params_max_err": float(diff.max()), "params": int(diff.size),
            "ok": bool(loss_err <= LOSS_RTOL * abs(float(expected["loss"])) and np.all(diff <= bound))}


def compiler_problems(result: dict) -> list:
    """The errors and warnings of a compile or replay result, one line each (info messages pass)."""
    lines = [f"{m['module']}:{m['line']}:{m['col']}: {m['type']}: {m['text']}"
             for m in result.get("messages", []) if m["type"] in ("error", "warning")]
    lines += [f"{e['module']} {e['entry']} {e['constants']}: {e['text']}" for e in result.get("errors", [])]
    return lines
