"""The precision policy: what a model stores in which dtype, and which kernels read it.

A policy is a value made once from the precision option and passed down: the model's buffer
table reads `stored` and `weights` for the dtype of each buffer, its block reads `kernels` for the
launcher of each step, and the reference reads `stored` and `weights` to round where the model
stores. Master weights, both AdamW moments, gradients, the residual stream, the logits and the
loss are float32 under every policy. A new precision is a new policy here, its kernels and its
tests.
"""
from __future__ import annotations

from dataclasses import dataclass, field

# the steps of a block whose kernel depends on the stored dtype: the casts between it and float32.
# The others are not among them: one launcher serves every precision, reading it from its
# tensors' dtypes (the matmul templates completed with a section of shaders/products.wgsl; the
# activations and the norm's forward with their stored type's section of their file).
ROLES = ("to_f32", "from_f32")


@dataclass(frozen=True)
class Precision:
    name: str
    stored: str          # dtype of the matmuls' saved operands: LayerNorm and GELU outputs, q, k, v, the
                         # attention output, the pre-activation, the head's input
    weights: str         # dtype of the weights the matmuls read: "f32" is the master copy itself; anything
                         # else is a copy the optimizer step refreshes after every update
    width_multiple: int  # d_model and the MLP width must be multiples of this (the kernels' vector width)
    decode_cache: bool   # the key/value-cache decode step (decode.wgsl; a half cache read as stored) serves it
    kernels: dict = field(default_factory=dict)   # role -> the launcher (a WGSL entry point) that plays it
    grad_operands: str = "f32"   # dtype the matmuls read float32 gradients in (f16's round them as read)
    feature: str | None = None   # the adapter feature its kernels need
    loss_scaling: bool = False   # the loss scaled, dynamically (GradScaler's rules: grad_norm.wgsl's grad_clip)

    def problem(self, d_model: int, d_mlp: int) -> str | None:
        """Why a model of this width cannot run in this precision, or None."""
        m = self.width_multiple
        if d_model % m or d_mlp % m:
            return (f"{{opt:precision}} {self.name} needs {{opt:d_model}} and the MLP width multiples of {m}, "
                    f"got {d_model} and {d_mlp}")
        return None

    @property
    def weight_copy(self) -> bool:
        """Whether the matmuls read a copy of the weights (refreshed after every update), not the master."""
        return self.weights != "f32"

    @property
    def converts(self) -> bool:
        """Whether what is stored differs from float32, so that some kernels read converted copies."""
        return self.stored != "f32"


FP32 = Precision("fp32", stored="f32", weights="f32", width_multiple=1, decode_cache=True, kernels={
    "to_f32": None, "from_f32": None})

# bf16: GELU reads 8 bf16 at a time and the subgroup matmuls 8 per row, hence the multiple of 8.
BF16 = Precision("bf16", stored="bf16", weights="bf16", width_multiple=8, decode_cache=True, kernels={
    "to_f32": "cast_f32", "from_f32": "cast_bf16"})

# f16: WGSL's own half type (the shader-f16 feature). Each matmul product is taken in f16 and the
# products summed in float32; float32 operands (the backward's gradients) are rounded to f16 as
# the matmuls read them, so the backward needs the loss scaler (model/optim.py's Gate) to keep
# small gradients above f16's subnormals and to skip a step whose gradients overflowed. The kernels
# read 4 values at a time (vec4<f16>), hence the multiple of 4.
F16 = Precision("f16", stored="f16", weights="f16", width_multiple=4, decode_cache=True, kernels={
    "to_f32": "cast_f16_to_f32", "from_f32": "cast_f16"},
    grad_operands="f16", feature="shader-f16",
    loss_scaling=True)

PRECISIONS = {p.name: p for p in (FP32, BF16, F16)}
