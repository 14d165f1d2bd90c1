"""The MLP's activations, each a room of its own: its WGSL, its float64 twins and its name.

An activation's WGSL defines act4(v) and act_grad4(v), the function and its derivative over 4
float32 values; elementwise.wgsl's entry points {{ACT}}_forward and {{ACT}}_backward call them
for every width and stored type (float32, bf16 and f16 two to a word), so one WGSL function
serves every precision. Its twins, named as its entry points are (gelu_forward, gelu_backward),
take and give float64; reference.kernels.stored_forward and stored_backward wrap them for the
16-bit types. A new activation is its WGSL and twins here, one entry in ACTIVATIONS, its line in
core.block's MLPS and its tests (docs/architecture.md, "How to add").
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Activation:
    name: str            # its entry points' names: NAME_forward, NAME_backward
    wgsl: str            # act4 and act_grad4 (common.wgsl's helpers at hand)
    forward: Callable    # twin: x -> act(x), float64
    backward: Callable   # twin: (x, dy) -> dy * act'(x), x the pre-activation


# ---- GELU: the exact x Phi(x) (TinyGPT's), and GPT-2's tanh form (Hugging Face's gelu_new) ----------
# gelu4, gelu_grad4 and their tanh forms are common.wgsl's (erf by Abramowitz & Stegun 7.1.26,
# WGSL having none).
GELU_WGSL = """
fn act4(v: vec4<f32>) -> vec4<f32> { return gelu4(v); }
fn act_grad4(v: vec4<f32>) -> vec4<f32> { return gelu_grad4(v); }
"""
GELU_TANH_WGSL = """
fn act4(v: vec4<f32>) -> vec4<f32> { return gelu_tanh4(v); }
fn act_grad4(v: vec4<f32>) -> vec4<f32> { return gelu_tanh_grad4(v); }
"""


_erf = np.frompyfunc(math.erf, 1, 1)


def erf(x):
    """Exact (math.erf) in float64; in float32 the approximation the WGSL uses
    (Abramowitz & Stegun 7.1.26, |error| < 1.5e-7), vectorised, so a float32
    reference trainer mirrors the GPU and is not slowed by a Python loop."""
    if x.dtype != np.float32:
        return _erf(x).astype(x.dtype)
    a = np.abs(x)
    t = np.float32(1.0) / (np.float32(1.0) + np.float32(0.3275911) * a)
    poly = ((((np.float32(1.061405429) * t - np.float32(1.453152027)) * t + np.float32(1.421413741)) * t
             - np.float32(0.284496736)) * t + np.float32(0.254829592)) * t
    return np.sign(x) * (np.float32(1.0) - poly * np.exp(-a * a))


def _tanh_arg(x):                        # GPT-2's GELU: u = sqrt(2/pi) (x + 0.044715 x^3), clamped as the kernels do
    with np.errstate(over="ignore"):
        return np.clip(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x), -40.0, 40.0)


def gelu_forward(x, tanh=False):         # exact erf GELU; tanh: GPT-2's 0.5 x (1 + tanh(u)) (gelu_new),
    if tanh:                             # as x sigmoid(2u): the same function, without 1 + tanh's cancellation
        return x / (1.0 + np.exp(-2.0 * _tanh_arg(x)))
    return 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))


def gelu_backward(x, dy, tanh=False):    # x = pre-activation
    if tanh:
        e = np.exp(-2.0 * _tanh_arg(x))
        s = 1.0 / (1.0 + e)
        return dy * (s + 2.0 * x * math.sqrt(2.0 / math.pi) * (1.0 + 3 * 0.044715 * x * x) * (s * e) * s)
    cdf = 0.5 * (1.0 + erf(x / math.sqrt(2.0)))
    pdf = np.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)
    return dy * (cdf + x * pdf)


def gelu_tanh_forward(x):
    return gelu_forward(x, tanh=True)


def gelu_tanh_backward(x, dy):
    return gelu_backward(x, dy, tanh=True)


# ---- relu2: nanochat's squared ReLU (Primer's) ---------------------------------------------------
RELU2_WGSL = """
fn act4(v: vec4<f32>) -> vec4<f32> { let r = max(v, vec4<f32>(0.0)); return r * r; }
fn act_grad4(v: vec4<f32>) -> vec4<f32> { return 2.0 * max(v, vec4<f32>(0.0)); }
"""


def relu2_forward(x):                     # -> relu(x)^2
    return np.maximum(x, 0.0) ** 2


def relu2_backward(x, dy):                # -> dy * 2 relu(x), x the pre-activation
    return dy * 2.0 * np.maximum(x, 0.0)


ACTIVATIONS = {a.name: a for a in (
    Activation("gelu", GELU_WGSL, gelu_forward, gelu_backward),
    Activation("gelu_tanh", GELU_TANH_WGSL, gelu_tanh_forward, gelu_tanh_backward),
    Activation("relu2", RELU2_WGSL, relu2_forward, relu2_backward))}
