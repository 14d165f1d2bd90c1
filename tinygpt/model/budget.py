"""The memory budget of a training run, before anything is allocated: every buffer of the table
in model.buffers that the run's Model (and the sampler at its end) would allocate, summed by
group, with what each binds at once, held against the adapter's limits.

It counts the same resolved rows the model allocates, so the two agree by construction
(tests/model/test_memory.py holds them against the bytes the device is asked for). What it cannot
know on a GPU is the device's free memory (WebGPU does not say); on a CPU adapter the budget is
held against the memory the system has available.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..core.block import HEAD_TABLES
from ..core.config import n_params, param_shapes
from ..core.errors import TinyGPTError
from ..core.fs import available_memory
from ..device.gpu import GPU, buffer_bytes
from ..device.plan import KernelPlan
from . import buffers
from .decode import decode_mode
from .layout import flat_bound, flat_part, rows_per_binding
from .optimizers import make_optimizer
from .spec import RunSpec, decoder_spec, sampler_rows

MAX_DIVISORS = 1 << 20      # the largest batch whose divisors largest_fitting_batch tries one by one


@dataclass
class MemoryBudget:
    spec: RunSpec                                       # the run counted (its B: windows per micro-batch)
    sample: int = 0                                     # the tokens of the samples at the end (0: none)
    groups: dict = field(default_factory=dict)          # group -> bytes
    bindings: dict = field(default_factory=dict)        # what -> bytes bound at once
    buffers: list = field(default_factory=list)         # (what, bytes), every buffer (a flat row's largest part)
    limits: dict = field(default_factory=dict)          # max_binding, max_buffer, align, loop_cap, memory
    problems: list = field(default_factory=list)
    flat: set = field(default_factory=set)              # the parameters, which no option shrinks (model.layout)
    oversized: list = field(default_factory=list)       # the buffers over the adapter's buffer limit, in order
    parts: int = 1                                      # buffers the largest flat array is (model.layout.Parts)

    @property
    def total(self) -> int:
        return sum(self.groups.values())

    cfg = property(lambda self: self.spec.cfg)
    batch = property(lambda self: self.spec.B)
    accum = property(lambda self: self.spec.accum)
    attention = property(lambda self: self.spec.attention)
    precision = property(lambda self: self.spec.precision)
    recompute = property(lambda self: self.spec.recompute)
    lora = property(lambda self: self.spec.lora)
    optimizer = property(lambda self: self.spec.optimizer)

    @property
    def largest_binding(self) -> tuple[str, int]:
        return max(self.bindings.items(), key=lambda kv: kv[1])

    @property
    def fits(self) -> bool:
        return not self.problems

    def as_dict(self) -> dict:
        what, largest = self.largest_binding
        return {"params": n_params(self.cfg), "batch": self.batch, "grad_accum": self.accum,
                "attention": self.attention.name, "precision": self.precision.name, "recompute": self.recompute,
                "optimizer": self.optimizer.as_dict(), "block": self.cfg.block.describe(),
                "lora": self.lora.as_dict() if self.lora else None,
                "bytes": dict(self.groups),
                "total_bytes": self.total, "largest_binding_bytes": largest, "largest_binding": what,
                "limits": dict(self.limits), "flat_parts": self.parts, "fits": self.fits,
                "problems": list(self.problems)}


def sampler_bytes(spec: RunSpec, capacity: int, plan: KernelPlan, max_binding: int | None = None,
                  part: int = 0) -> int:
    """A sampler (model.decode.Decoder, spec.B sequences; spec: its run, decoder_spec):
    its Model over a [1, rows] window, and the decode step's buffers (decode.wgsl's uniforms are
    not counted). part: a flat array's floats a buffer (layout.flat_part)."""
    cache = decode_mode(plan, spec.precision) == "cache"
    allocations, _ = buffers.model_rows(spec.with_(lm_head=not cache), plan, max_binding, part=part)
    own, _ = buffers.decode_rows(spec.cfg, spec.B, capacity, spec.precision, cache, max_binding)
    return buffers.total_bytes(allocations) + buffers.total_bytes(own)


def memory_budget(spec: RunSpec, plan: KernelPlan, limits: dict | None = None, sample: int = 200) -> MemoryBudget:
    """The bytes of the training run `spec` (its B: the micro-batch) under the kernel plan `plan`:
    the buffer table's rows, the optimizer's and the attention path's among them. limits:
    max_binding, max_buffer, align, loop_cap (None where the adapter has none), memory (None
    where unknown); sample: the tokens of the samples at the end (0: none)."""
    limits = dict(limits or {})
    p = MemoryBudget(spec, sample, limits=limits)
    cfg, batch = spec.cfg, spec.B
    mb, align = limits.get("max_binding"), limits.get("align") or 256
    part = flat_part(limits.get("max_buffer"), align)         # a flat array larger is several buffers
    allocations, size = buffers.model_rows(spec, plan, mb, make_optimizer(spec.optimizer), part)
    for name, shape, _ in param_shapes(cfg):     # each parameter lies in one buffer of its flat arrays
        if part and math.prod(shape) > part:
            p.buffers.append((f"parameter {name} {list(shape)}", 4 * math.prod(shape)))
            p.flat.add(p.buffers[-1][0])
    for e in allocations:         # a flat array over one buffer is several (model.layout.Parts)
        nbytes, what = buffer_bytes(e.nbytes), described(e.row)
        words = buffers.part_words(e, part) if e.row.bound == "flat" else [e.nbytes // 4]
        p.buffers.append((what, max(buffer_bytes(4 * w) for w in words) if e.row.bound == "flat" else nbytes))
        p.parts = max(p.parts, len(words))
        p.groups[e.row.group] = p.groups.get(e.row.group, 0) + nbytes
        p.bindings[what] = max(p.bindings.get(what, 0), _bound(e, size, mb, align))
    VP, C = size["VP"], size["C"]
    # views of the parameters: the token table is bound whole, or in chunks of rows through the
    # head's block scratch (model.head); every other parameter (and its gradient) whole
    p.bindings["token embedding"] = 4 * max(64, rows_per_binding(VP, 4 * C, mb)) * C
    name, shape, _ = max(param_shapes(cfg), key=lambda s: math.prod(s[1]))
    if name not in HEAD_TABLES:
        p.bindings[f"parameter {name}"] = 4 * math.prod(shape)
    if sample:        # the samples at the end of a run: float32 from the cache, whatever the run's precision
        rows = sampler_rows(cfg.ctx, sample)          # the trainer's sampler: its window, not the context
        p.groups["sampling"] = sampler_bytes(decoder_spec(cfg, spec.attention, rows=rows), sample, plan, mb, part)
    _check(p, batch * cfg.ctx)
    return p


def described(row: buffers.Buffer) -> str:
    """A buffer as the budget names it: its name and its shape in symbols ("pre [BT, M]")."""
    return f"{row.name} [{', '.join(map(str, row.shape))}]"


def _bound(e: buffers.Allocation, size: dict, max_binding: int | None, align: int) -> int:
    """The bytes of e bound at once: whole, a flat chunk, or a chunk of rows."""
    if e.row.bound == "flat":                     # a bf16 copy's chunks hold half the bytes of the float32 ones
        n = e.shape[0]                            # floats: F, or a LoRA run's base FB
        return flat_bound(n, max_binding, align) * e.nbytes // (4 * n)
    if e.row.bound == "rows":
        per = max(64, rows_per_binding(e.shape[0], e.nbytes // e.shape[0], max_binding))
        return min(e.shape[0], per) * (e.nbytes // e.shape[0])
    return e.nbytes


def _check(p: MemoryBudget, BT: int):
    lim = p.limits
    mb, mbuf, cap, mem = lim.get("max_binding"), lim.get("max_buffer"), lim.get("loop_cap"), lim.get("memory")
    if mb:
        for what, nbytes in p.bindings.items():
            if nbytes > mb:
                p.problems.append(f"{what} binds {nbytes:,} bytes, over this adapter's binding limit {mb:,}")
    if mbuf:
        for what, nbytes in dict(p.buffers).items():
            if nbytes > mbuf:
                p.problems.append(f"{what} needs a {nbytes:,}-byte buffer, over this adapter's {mbuf:,}")
                p.oversized.append(what)
    if cap and BT > cap:
        p.problems.append(f"batch x ctx = {BT:,} rows, over the {cap:,} loop trips a CPU adapter runs")
    if mem and p.total > mem:
        p.problems.append(f"{p.total:,} bytes in all, over the {mem:,} the system has available")


def divisors(n: int) -> list[int]:
    """The divisors of n, largest first, by trial up to sqrt(n) (at most 1,024 trials for n <= 2^20)."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]), reverse=True)


def largest_fitting_batch(spec: RunSpec, plan: KernelPlan, limits: dict, sample: int = 200) -> int | None:
    """The largest divisor of the run's batch (micro-batch x accumulation) whose micro-batch fits
    (so that gradient accumulation keeps the batch); None where none does, or the batch is too
    large to search (over 2^20 windows). sample: as memory_budget's."""
    batch = spec.B * spec.accum
    if batch > MAX_DIVISORS:
        return None
    for b in divisors(batch):
        if memory_budget(spec.with_(B=b, accum=batch // b), plan, limits, sample).fits:
            return b
    return None


class DoesNotFit(TinyGPTError):
    exit_code = 4                     # as `tinygpt plan` exits for a run that would be refused


def check_use(device: int, host: int, limits: dict, what: str, fix: str):
    """A command's device buffers and the weights it holds on the host, against the memory the
    system has available (a CPU adapter's buffers are the system's memory), before anything is
    allocated: refused in one line naming what would make it fit."""
    mem = limits.get("memory")
    if mem and device + host > mem:
        raise DoesNotFit(f"{what} does not fit: {device:,} bytes of buffers and {host:,} of weights, over the "
                         f"{mem:,} the system has available; {fix}")


def eval_bytes(spec: RunSpec, plan: KernelPlan, limits: dict) -> int:
    """The device buffers of a forward-only model (eval, the API's logits)."""
    part = flat_part(limits.get("max_buffer"), limits.get("align") or 256)
    return buffers.total_bytes(buffers.model_rows(spec, plan, limits.get("max_binding"), part=part)[0])


def device_limits(gpu: GPU) -> dict:
    return {"max_binding": gpu.max_binding, "max_buffer": gpu.max_buffer,
            "align": int(gpu.limits.get("min-storage-buffer-offset-alignment", 256)),
            "loop_cap": gpu.LOOP_CAP if gpu.is_cpu else None,
            "memory": available_memory() if gpu.is_cpu else None}


def refusal(p: MemoryBudget, plan: KernelPlan) -> str:
    """The one-line message when a run does not fit: why, and what would."""
    msg = f"this run does not fit: {p.problems[0]}"
    if p.oversized and p.problems[0].startswith(p.oversized[0] + " "):     # one buffer over the adapter's cap
        if p.oversized[0] in p.flat:         # a parameter lies in one buffer (model.layout): no option shrinks it
            return msg + (f"; a parameter lies in one buffer of this adapter's, which holds "
                          f"{p.limits['max_buffer'] // 4:,} float32 values at most: this model does not run on it "
                          "(tinygpt plan shows every buffer)")
        return msg + "; use a smaller {opt:batch} or {opt:ctx} (tinygpt plan shows every buffer)"
    b = largest_fitting_batch(p.spec, plan, p.limits, p.sample)
    sampling = p.groups.get("sampling", 0)
    if sampling and sampling >= max(p.groups.values()):     # the end-of-run samples are what is too big
        msg += (f"; the samples at the end take {sampling:,} bytes of it: ask for fewer {{opt:sample_tokens}} "
                "(0: none)")
    elif b and b < p.batch * p.accum:
        msg += (f"; {{opt:batch}} {b} {{opt:grad_accum}} {p.batch * p.accum // b} fits and keeps the batch of "
                f"{p.batch * p.accum}")
    elif not p.recompute and p.groups.get(buffers.A, 0) >= max(p.groups.values()):   # saved activations dominate
        msg += "; {opt:recompute} keeps only each block's input, or use a smaller {opt:ctx} or {opt:batch}"
    else:
        msg += "; use a smaller {opt:ctx}, {opt:d_model} or fewer {opt:layers}"
    return msg + " (tinygpt plan shows every buffer)"


SHOWN_PROBLEMS = 4


def human(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def text(p: MemoryBudget) -> str:
    cfg = p.cfg
    what, largest = p.largest_binding
    lines = [f"# {cfg.layers} layers, d_model {cfg.d_model}, {cfg.heads} heads, ctx {cfg.ctx}, vocab {cfg.vocab}: "
             f"{n_params(cfg):,} parameters; batch {p.batch}" + (f" x {p.accum} micro-batches" if p.accum > 1 else "")
             + f", attention {p.attention.name}, {p.precision.name}" + (", recompute" if p.recompute else "")
             + (f", LoRA rank {p.lora.rank} on {','.join(p.lora.as_dict()['targets'])}" if p.lora else ""),
             f"# block {cfg.block.describe()}", f"# optimizer {p.optimizer.describe()}"]
    for g, nbytes in p.groups.items():
        lines.append(f"{g:20s} {nbytes:>16,} bytes  {human(nbytes):>10s}")
    lines.append(f"{'total':20s} {p.total:>16,} bytes  {human(p.total):>10s}")
    lines.append(f"largest binding: {what}, {largest:,} bytes")
    if p.parts > 1:              # a flat array over the adapter's buffer limit (model.layout.Parts)
        lines.append(f"flat arrays over one buffer: the largest in {p.parts} buffers, no parameter across two")
    lim = p.limits
    shown = {"max_binding": "binding limit", "align": "offset alignment", "max_buffer": "buffer limit",
             "loop_cap": "CPU loop cap (rows)", "memory": "memory available"}
    lines.append("limits: " + ", ".join(f"{shown[k]} {v:,}" for k, v in lim.items() if v is not None and k in shown))
    if p.fits:
        lines.append("fits")
    else:                       # one line a problem, the first few: a big run has one per activation
        lines += [f"does not fit: {w}" for w in p.problems[:SHOWN_PROBLEMS]]
        if len(p.problems) > SHOWN_PROBLEMS:
            lines.append(f"does not fit: {len(p.problems) - SHOWN_PROBLEMS} more buffers as these")
    return "\n".join(lines)
