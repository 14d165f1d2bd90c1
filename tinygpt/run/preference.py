"""A DPO run's reference: each completion's log-probability under the model the run moves away from,
computed once before the first step by the run's own model (no second copy of it) and kept in
the run's file, so that a resumed run scores against the same reference.

The reference is a LoRA run's base (its adapters start at zero, so the model as it starts is the
base), a full fine-tune's starting weights, or the reference option's file, whose weights the
model holds for that one pass before the run's own are put back.
"""
from __future__ import annotations

from ..core.config import param_shapes
from ..core.errors import UsageError
from ..files import checkpoint as ckpt
from ..files.chat_data import PreferenceData


def set_reference(model, data: PreferenceData, reference: str | None, resume, new_lora: bool, label: str) -> str:
    """Sets data's reference log-probabilities; returns what the reference is, for the banner."""
    held = resume.extra.get("dpoReference") if resume else None
    if reference is None and not new_lora and data.reference_from(held):
        return "the log-probabilities the resumed file kept"
    if model.spec.lora and reference is not None:
        raise UsageError("{opt:reference} names a full fine-tune's reference; a LoRA run's is its base (the "
                         "adapters off): drop it")
    if model.spec.lora and not new_lora:
        raise UsageError(f"{label} holds trained adapters and keeps no reference log-probabilities of this data "
                         "and window; start the DPO run on the base with {opt:lora}")
    if reference is None:
        data.set_reference(model.window_logprobs)
        return "the base (its adapters at zero)" if model.spec.lora else "the weights the run starts from"
    ref = ckpt.load(reference, f"{{opt:reference}} {reference}", moments=False)
    if list(param_shapes(ref.cfg)) != list(param_shapes(model.cfg)):
        raise UsageError(f"{{opt:reference}} {reference}: not this model's shape; give the model the run starts "
                         "from, or another of its shape")
    start = model.get_params()
    try:
        model.set_params(ref.params)
        data.set_reference(model.window_logprobs)
    finally:
        model.set_params(start)
    return reference
