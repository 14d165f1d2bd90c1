"""The start check: before a run trusts the kernels its plan picked, one step of a one-layer copy
of its model runs on the device against the float64 reference.

Why: a kernel can compute something other than its WGSL on one machine while every test passes
on another: a driver's shader cache that hands a process code compiled for other settings (issue
49: docs/engines.md, "The shader cache"), a driver's miscompile, a pipeline that reads memory it
never wrote. The result is a NaN many steps later, blamed on the learning rate. The check is
the f16 numerics check's idea (device/numerics.py) for every precision: the copy has the run's width, heads
(so head dim), MLP, block (its parts), window, vocabulary, precision, attention path and kernel plan,
so the pipelines it builds are the run's own, at one layer, and the run's batch and positions
where the reference's head stays cheap (check_spec: fewer where the vocabulary is large). Its logits,
loss and every gradient are compared with model.reference.gpt's; a kernel off by O(1) is far past
the tolerance, a rounding far below it. The optimizer's update is not compared (its kernels are
elementwise, checked by their own tests); the decoding kernels of `sample` neither.

Where they disagree, the check finds which kernels: it runs again with one kernel family at a
time on its portable variant (device/plan.py's FAMILIES), then with the score-matrix attention,
and names the kernels that the first agreeing run did not build. A verdict is kept per device
and per the copy's shape, once a process.
"""
from __future__ import annotations

import os
import weakref
from dataclasses import replace

import numpy as np

from ..core.errors import TinyGPTError
from ..core.init import init_params
from ..device.driver_cache import separate_shader_caches
from ..device.gpu import GPU, GPUError
from ..device.kernels import LOSS_SCALE
from ..device.plan import FAMILIES, PORTABLE, KernelPlan
from ..reference import gpt as RG
from .attention import plainest
from .gpt import Model
from .spec import RunSpec

REFERENCE_MACS = 3e7         # the reference head's multiply-adds, at most: B * T * vocab * width
MIN_T = 8                    # positions the copy keeps whatever the vocabulary
TOL = {"f32": 1e-3}          # of each tensor's largest magnitude; the 16-bit policies round: HALF_TOL
HALF_TOL = 3e-2
_VERDICTS = weakref.WeakKeyDictionary()     # device -> {the copy's key: None or the refusal}


class KernelCheckError(GPUError):
    """A kernel the run would use disagrees with its float64 reference on this device."""


def check_spec(spec: RunSpec) -> RunSpec:
    """The one-layer copy of a run that the check runs: forward and backward where the run trains,
    the forward where it evaluates or samples. Its batch and positions are the run's, so that its
    kernels are the run's own pipelines (a matmul's constants follow its rows), as far as the
    reference's head stays under REFERENCE_MACS: the batch halves first, then the positions."""
    B, T, per_row = spec.B, spec.T, max(1, spec.cfg.vocab * spec.cfg.d_model)
    while B > 1 and B * T * per_row > REFERENCE_MACS:
        B = -(-B // 2)
    T = max(1, min(T, max(MIN_T, int(REFERENCE_MACS // per_row))))
    cfg = replace(spec.cfg, layers=1, batch=B)
    return RunSpec(cfg, spec.attention, B=B, T=T, training=spec.training, precision=spec.precision)


def _errors(gpu: GPU, plan: KernelPlan, spec: RunSpec) -> tuple:
    """({tensor: error / its tolerance}, kernels built): one step of the copy against the reference."""
    cfg, precision = spec.cfg, spec.precision
    params = init_params(cfg)
    x = np.random.default_rng(5).integers(0, cfg.vocab, (spec.B, spec.T + 1))
    x, y = x[:, :-1], x[:, 1:]
    f64 = {k: v.astype(np.float64) for k, v in params.items()}
    logits, loss, cache = RG.forward(f64, cfg, x, y, precision=precision)
    tol = TOL.get(precision.stored, HALF_TOL)
    m = Model(gpu, plan, spec)
    m.set_params(params)
    got = {"logits": (m.logits_of(x), logits)}
    if spec.training:
        scale = LOSS_SCALE if m.spec.scaled else 1.0
        grads = RG.backward(f64, cfg, cache, loss_scale=scale)
        m.grads_only(x, y)
        got["loss"] = (np.float64(m.loss()), np.float64(loss))
        G = m.get_grads()
        got.update({f"gradient of {n}": (G[n] / scale, w) for n, w in grads.items()})
    kernels = lambda ds: {(d.kernel.file, d.kernel.name, d.kernel.constants) for d in ds}
    g = m.graph
    forward, every = kernels(g.fwd + g.eval_rows), kernels(g.fwd + g.loss + g.eval_rows + g.bwd + g.copy_weights)
    out = {}
    for name, (have, want) in got.items():
        have, want = np.asarray(have, np.float64), np.asarray(want, np.float64)
        top = max(float(np.abs(want).max()) if want.size else 0.0, 1e-4)
        err = np.abs(have - want)
        out[name] = np.inf if not np.all(np.isfinite(have)) else float(err.max()) / (tol * top)
    return out, (forward, every)


def _worst(errors: dict) -> tuple:
    name = max(errors, key=lambda n: errors[n])
    return name, errors[name]


def _culprits(gpu: GPU, plan: KernelPlan, spec: RunSpec, built: tuple, forward_wrong: bool) -> tuple:
    """(what disagreed, how to avoid it): the first plan or path change under which the copy
    agrees, and the kernels the disagreeing run built that the agreeing one did not (of the
    forward's alone, where the logits were already wrong)."""
    tries = [(f"{{opt:kernels}} {fam}={getattr(PORTABLE, fam)}", plan.with_(**{fam: getattr(PORTABLE, fam)}), spec)
             for fam in FAMILIES if plan.variant(fam) != getattr(PORTABLE, fam)]
    if spec.attention is not plainest():
        tries.append((f"{{opt:attention}} {plainest().name}", plan, spec.with_(attention=plainest())))
    for how, p, s in tries:
        try:
            errors, other = _errors(gpu, p, s)
        except (GPUError, TinyGPTError):
            continue
        if max(errors.values()) <= 1.0:
            suspects = built[1] - other[1]
            suspects = (suspects & built[0]) or suspects if forward_wrong else suspects
            names = sorted({f"{name} ({file}{_consts(c)})" for file, name, c in suspects})
            return names, how
    return [], None


def _consts(constants) -> str:
    """The override constants that are set (a false flag says nothing)."""
    return "".join(f", {n}" + ("" if v is True else f"={v}") for n, v in constants if v is not False)


def verify(gpu: GPU, plan: KernelPlan, spec: RunSpec, again: bool = False) -> None:
    """Refuse the run (KernelCheckError, one line) if a kernel it would use disagrees with the
    reference on this device; again=True checks anew what an earlier call found right (after a
    run's loss became NaN). TINYGPT_NO_KERNEL_CHECK=1 skips it (the tests that build hundreds of
    models check their kernels themselves)."""
    if os.environ.get("TINYGPT_NO_KERNEL_CHECK"):
        return
    copy = check_spec(spec)
    cfg = copy.cfg
    key = (plan, cfg.d_model, cfg.heads, cfg.d_mlp, cfg.block.describe(), cfg.window, cfg.vocab, copy.B, copy.T,
           copy.training, copy.precision.name, copy.attention.name)
    seen = _VERDICTS.setdefault(gpu, {})
    if again or key not in seen:
        errors, built = _errors(gpu, plan, copy)
        tensor, worst = _worst(errors)
        seen[key] = None
        if worst > 1.0:
            names, how = _culprits(gpu, plan, copy, built, errors["logits"] > 1.0)
            listed = "; ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
            what = f"the kernel {listed} disagrees" if len(names) == 1 else \
                f"one of the kernels {listed} disagrees" if names else "a kernel of this run disagrees"
            off = "not finite" if worst == np.inf else f"{worst:.3g} times its tolerance off"
            avoid = f"; {how} avoids it" if how else ""
            seen[key] = (f"{what} with the float64 reference on {gpu.name} (head dim {cfg.hd}, T={copy.T}: "
                         f"{tensor} {off}); the driver's shader cache may hold code built for other settings: "
                         f"delete {separate_shader_caches()} or run with MESA_SHADER_CACHE_DISABLE=true{avoid}")
    if seen[key]:
        raise KernelCheckError(seen[key])


def blame(model: Model, lr: float, batch=None) -> str:
    """What to say after a run's loss or gradient norm stopped being finite (or exploded): the
    kernels are checked again at the run's shapes, and a disagreeing one is named. Where all
    agree, the learning rate is suggested, and, given the step's batch, the forward is replayed
    on it a dispatch at a time to say which kernel wrote the first value that is not finite, and
    from what."""
    try:
        verify(model.gpu, model.plan, model.spec, again=True)
    except KernelCheckError as e:
        return f"not the learning rate: {e}"
    where = first_nonfinite(model, *batch) if batch is not None and batch[0] is not None else None
    return (f"every kernel of this run agrees with its float64 reference (checked again now){where or ''}, "
            f"so the training diverged: lower {{opt:lr}} (it is {lr:g}) or {{opt:grad_clip}}")


MAX_WALK_BYTES = 1 << 30     # what the replay reads back at most, all dispatches together


def first_nonfinite(model: Model, x, y) -> str | None:
    """'; KERNEL wrote the first value that is not finite, from finite inputs' (or 'from inputs
    that were not', the weights an update left so), replaying the forward and the loss of one
    micro-batch one dispatch at a time; None where every value stays finite or the read-backs
    would pass MAX_WALK_BYTES."""
    gpu, left = model.gpu, MAX_WALK_BYTES

    def finite(entries) -> bool:
        nonlocal left
        for buf, offset, size in entries:
            left -= size
            if left < 0:
                raise OverflowError
            if not np.all(np.isfinite(np.frombuffer(gpu.queue.read_buffer(buf, offset, size), "<f4"))):
                return False
        return True
    model.write_batch(np.asarray(x)[:model.B], np.asarray(y)[:model.B])
    try:
        for d in model.graph.fwd + model.graph.ce:
            binds = list(zip(d.entries[1:], d.kernel.access[1:]))
            inputs_ok = finite([e for e, a in binds if a == "r"])
            gpu.run([d])
            if not finite([e for e, a in binds if a == "w"]):
                return (f"; {d.kernel.name} ({d.kernel.file}) wrote the step's first value that is not finite, "
                        f"from {'finite inputs' if inputs_ok else 'inputs that were not (the weights an update left)'}")
    except OverflowError:
        return None
    return None
