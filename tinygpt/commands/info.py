"""`tinygpt info`: what a checkpoint holds (read from the file alone, no device needed), or what
this machine's adapter offers and the kernel plan it gets."""
from __future__ import annotations

import json
import os

from ..files import lora_files
from ..files import checkpoint as ckpt
from ..files import optim_state
from ..core.config import n_params
from ..device.driver_cache import separate_shader_caches
from ..device.gpu import GPU
from ..device.planner import make_plan
from ..run.infer import recorded_corpus


def describe_checkpoint(path) -> dict:
    """What `tinygpt info` prints of a checkpoint: read from the file alone, no device needed."""
    ck = ckpt.load(path, f"{{opt:model}} {path}")
    cfg, hist = ck.cfg, ck.loss_history
    last_train = next((h.get("train") for h in reversed(hist) if h.get("train") is not None), None)
    last_val = next((h.get("val") for h in reversed(hist) if h.get("val") is not None), None)
    return {"file": str(path), "bytes": os.path.getsize(path),
            "layers": cfg.layers, "d_model": cfg.d_model, "heads": cfg.heads, "head_dim": cfg.hd, "ctx": cfg.ctx,
            "d_mlp": cfg.d_mlp,
            "activation": cfg.activation, "block": cfg.block.describe(), "sliding_window": cfg.window or None,
            "batch": cfg.batch,
            "grad_accum": int(ck.extra.get("gradAccum", 1)), "lr": cfg.lr, "grad_clip": cfg.grad_clip, "seed": cfg.seed,
            "vocab": cfg.vocab, "tokenizer": ckpt.tokenizer_name(ck.extra, cfg.vocab),
            "params": n_params(cfg), "step": ck.step, "weights": ck.weight_dtype,
            "optimizer": optimizer_text(ck, f"{{opt:model}} {path}"),
            "optimizer_state": ck.m is not None or isinstance((ck.extra.get("optimizer") or {}).get("tensors"), dict),
            "last_train_loss": last_train, "last_val_loss": last_val, "logged_steps": len(hist),
            "data": ck.extra.get("data"), "corpus": recorded_corpus(ck), "saved_at": ck.header.get("savedAt"),
            "attention": ck.extra.get("attention"), "lora": lora_text(ck, f"{{opt:model}} {path}")}


def optimizer_text(ck, what: str) -> str:
    """The optimizer a file records, with its settings and the updates its state took."""
    s = optim_state.file_settings(ck, what)
    if s is None:
        return "adamw (the file records no optimizer: TinyGPT's)"
    rec = ck.extra["optimizer"]
    steps = rec.get("steps", ck.extra.get("adamSteps"))
    return s.describe() + (f", {steps:,} updates taken" if isinstance(steps, int) else "")


def lora_text(ck, what: str) -> str | None:
    """A LoRA run's adapters in one line (None for a plain model)."""
    st = lora_files.read(ck, what)
    if st is None:
        return None
    d = st.lora.as_dict()
    return (f"rank {d['rank']}, alpha {d['alpha']:g} on {','.join(d['targets'])}"
            f"{' with biases and LayerNorms' if d['biases'] else ''}; base sha256 {st.base[:16]}..., its step "
            f"{st.base_step:,}")


def info(model: str | None, as_json: bool = False, brief: bool = False) -> str:
    """`tinygpt info`'s text: a checkpoint's description (from the file alone), or the adapter's."""
    if model:
        d = describe_checkpoint(model)
        if as_json:
            return json.dumps(d, indent=2)
        show = lambda v: "-" if v is None else f"{v:,}" if isinstance(v, int) and not isinstance(v, bool) \
            else f"{v:.4f}" if isinstance(v, float) and v < 100 else str(v)
        return "\n".join(f"{k:16s} {show(v) if k != 'data' or v else 'built-in corpus'}" for k, v in d.items())
    gpu = GPU()
    if brief:
        return f"{gpu.name} ({gpu.backend}, {gpu.engine_label})"
    plan = make_plan(gpu)
    about = {"adapter": gpu.name, "backend": gpu.backend, "engine": gpu.engine_label,
             "adapter_type": gpu.adapter.info.get("adapter_type", ""),
             "features": sorted(gpu.features),
             "limits": {k: gpu.limits[k] for k in sorted(gpu.limits)
                        if any(w in k for w in ("storage", "buffer-size", "workgroup", "invocations", "alignment"))},
             "kernel_plan": plan.as_dict(),
             "shader_cache": str(separate_shader_caches())}    # Mesa's folder for this SIMD width
    if as_json:
        return json.dumps(about, indent=2)
    return "\n".join([f"adapter   {about['adapter']}\nbackend   {about['backend']} ({about['adapter_type']})",
                      f"engine    {about['engine']} (TINYGPT_WEBGPU={gpu.engine})",
                      f"features  {', '.join(about['features']) or '-'}", f"kernels   {plan.describe()}",
                      f"shaders   {about['shader_cache']} (Mesa's compiled code, one folder per SIMD width)"]
                     + [f"  {k:48s} {v:,}" for k, v in about["limits"].items()])
