"""The memory plan of a training run, by arithmetic, before anything is allocated.

Every buffer model.Model allocates for training (and the sampler the end of a run builds), with
its bytes, in the groups a user asks about: parameters, gradients, AdamW moments, saved
activations, backward scratch, attention scratch, logits. It mirrors Model's allocations line for
line; tests/test_memory.py holds the plan against the bytes Model really asks the device for.
What it cannot know on a GPU is the device's free memory (WebGPU does not say); on a CPU adapter
the plan is held against the memory the system has available.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from .config import Config, n_params, param_specs


def _buf(nbytes: int) -> int:
    """gpu.buffer's size: at least 16 bytes, rounded up to 16."""
    return max(16, (int(nbytes) + 15) // 16 * 16)


def _flat_floats(cfg: Config) -> int:
    from .model import layout
    return layout(cfg)[1]


@dataclass
class Plan:
    cfg: Config
    batch: int                      # windows per micro-batch
    accum: int
    attention: str
    precision: str = "fp32"
    groups: dict = field(default_factory=dict)          # group -> bytes
    bindings: dict = field(default_factory=dict)        # what -> bytes bound at once
    buffers: list = field(default_factory=list)         # (what, bytes), every buffer
    limits: dict = field(default_factory=dict)          # max_binding, max_buffer, loop_cap, memory
    problems: list = field(default_factory=list)

    @property
    def total(self) -> int:
        return sum(self.groups.values())

    @property
    def largest_binding(self) -> tuple[str, int]:
        return max(self.bindings.items(), key=lambda kv: kv[1])

    @property
    def fits(self) -> bool:
        return not self.problems

    def as_dict(self) -> dict:
        what, largest = self.largest_binding
        return {"params": n_params(self.cfg), "batch": self.batch, "grad_accum": self.accum,
                "attention": self.attention, "precision": self.precision, "bytes": dict(self.groups), "total_bytes": self.total,
                "largest_binding_bytes": largest, "largest_binding": what, "limits": dict(self.limits),
                "fits": self.fits, "problems": list(self.problems)}


def plan(cfg: Config, batch: int, attention: str = "online", accum: int = 1, limits: dict | None = None,
         sample: int = 200, precision: str = "fp32") -> Plan:
    """The bytes of a training run of `cfg` at micro-batch `batch`; limits: max_binding,
    max_buffer, loop_cap (None where the adapter has none), memory (None where unknown);
    sample: the tokens of the samples at the end (0: none); precision: fp32 or bf16."""
    limits = dict(limits or {})
    p = Plan(cfg, batch, accum, attention, limits=limits, precision=precision)
    B, T, C, M, H, L = batch, cfg.ctx, cfg.d_model, cfg.d_mlp, cfg.heads, cfg.layers
    V = cfg.vocab
    from .model import padded_vocab
    VP = padded_vocab(V)
    BT = B * T
    n_flat = _flat_floats(cfg)

    def add(group, what, nbytes, bound=None, count=1):
        for _ in range(count):
            p.buffers.append((what, _buf(nbytes)))
        p.groups[group] = p.groups.get(group, 0) + count * _buf(nbytes)
        p.bindings[what] = max(p.bindings.get(what, 0), nbytes if bound is None else bound)

    f = 4 * n_flat
    fb = _flat_bound(n_flat, limits.get("max_binding"), limits.get("align") or 256)   # bound a chunk at a time
    add("parameters", "parameters (flat)", f, bound=fb)
    add("gradients", "gradients (flat)", f, bound=fb, count=2 if accum > 1 else 1)
    add("adam moments", "AdamW m and v (flat)", f, bound=fb, count=2)
    add("batch", "token batch", _batch_bytes(BT, V))
    act = "activations (saved)"
    if precision == "bf16":   # model.Model: ln1 q k v ctx ln2 pre gel saved as bf16; q k v ctx float32 scratch
        add("parameters", "parameters' bf16 copy (flat)", 2 * n_flat, bound=fb // 2)
        add(act, "[B*T, C] activations", 4 * BT * C, count=(L + 1) + L + 4 + 1)   # x; x_mid; scratch; tmp
        add(act, "[B*T, C] bf16 activations", 2 * BT * C, count=6 * L)
        add(act, "[B*T, 4C] bf16 MLP activations", 2 * BT * M, count=2 * L)
    else:
        add(act, "[B*T, C] activations", 4 * BT * C, count=(L + 1) + 7 * L + 1)   # x; x_mid ln1 q k v ctx ln2; tmp
        add(act, "[B*T, 4C] MLP activations", 4 * BT * M, count=2 * L)
    add(act, "LayerNorm statistics", 4 * 2 * BT, count=2 * L)
    add(act, "[B*T, C] activations" if precision == "fp32" else "[B*T, C] bf16 activations",
        (4 if precision == "fp32" else 2) * BT * C)                            # the final LayerNorm's output
    add(act, "LayerNorm statistics", 4 * 2 * BT)
    from .model import LOSS_SLOT
    max_binding = limits.get("max_binding")
    from .model import head_block_rows, rows_per_binding     # the chunks model.Model binds
    rows_per_chunk = max(64, rows_per_binding(BT, 4 * VP, max_binding))    # under 64: refused below
    add("logits", "logits", 4 * BT * VP, bound=4 * min(BT, rows_per_chunk) * VP)
    add("logits", "per-row losses", 4 * BT)
    add("logits", "loss slots", 4 * LOSS_SLOT * accum)
    if attention == "online":
        add("attention scratch", "attention row statistics", 4 * B * H * T, count=L + 1)
    else:
        per_head = 4 * B * T * T
        nh = max(1, min(H, (max_binding or per_head * H) // per_head))
        chunks = [min(nh, H - h0) for h0 in range(0, H, nh)]
        for n in chunks:
            add("attention scratch", "attention score matrices", 4 * B * n * T * T, count=L)
        add("attention scratch", "attention score matrices", 4 * B * max(chunks) * T * T)   # dS, shared
    add("backward scratch", "[B*T, C] gradients", 4 * BT * C, count=6)
    add("backward scratch", "[B*T, 4C] gradients", 4 * BT * M, count=2)
    from .kernels import CHUNK
    add("optimizer scratch", "weight-decay table", 4 * (n_flat // 256))
    add("optimizer scratch", "gradient-norm partials", 4 * -(-n_flat // CHUNK))
    add("optimizer scratch", "gradient-norm statistics", 16)
    # the token table is bound whole, or in chunks of rows through a block scratch (model.Head)
    p.bindings["token embedding"] = 4 * max(64, rows_per_binding(VP, 4 * C, max_binding)) * C
    _, head_floats = head_block_rows(VP, C, min(BT, rows_per_chunk), max_binding)
    if head_floats:
        add("logits", "head block scratch", 4 * head_floats)
    name, shape, _ = max(param_specs(cfg), key=lambda s: math.prod(s[1]))
    if name != "tok_emb":                                # every parameter (and its gradient) is bound whole
        p.bindings[f"parameter {name}"] = 4 * math.prod(shape)
    if sample:        # the Sampler the end of a run builds: another copy of the weights, a [1, ctx] prefill
        p.groups["sampling"] = sampler_bytes(cfg, attention, sample, max_binding)
    _check(p, BT)
    return p


def _flat_bound(n: int, max_binding: int | None, align: int) -> int:
    """Bytes of the largest chunk model.flat_chunks binds (the whole buffer when it fits; more
    than the limit when not even one aligned chunk does, which the check then reports)."""
    if not max_binding or 4 * n <= max_binding:
        return 4 * n
    grain = 1024 * max(align, 4)
    per = (max_binding // 4) // grain * grain
    return 4 * min(n, per) if per else 4 * grain


def _batch_bytes(BT: int, V: int) -> int:
    """Model's batch buffer: tokens, targets, bucket offsets and positions, each 256-aligned."""
    n = 0
    for size in (BT, BT, V + 1 + BT):
        n = -(-(n + size) // 256) * 256
    return 4 * n


def sampler_bytes(cfg: Config, attention: str, capacity: int, max_binding: int | None = None) -> int:
    """The end-of-run Sampler (decode.Decoder, one sequence, key/value cache): a copy of the
    weights, a [1, ctx] forward without its head (whose k and v are the cache), the decode step,
    and the head's block scratch where the token table is split."""
    from .model import head_block_rows
    T, C, M, H, L, V = cfg.ctx, cfg.d_model, cfg.d_mlp, cfg.heads, cfg.layers, cfg.vocab
    from .model import padded_vocab
    VP = padded_vocab(V)
    _, head_floats = head_block_rows(VP, C, 1, max_binding)
    b = _buf(4 * _flat_floats(cfg)) + _buf(_batch_bytes(T, V))
    b += (L + 1 + 7 * L + 1) * _buf(4 * T * C) + 2 * L * _buf(8 * T) + 2 * L * _buf(4 * T * M)
    b += (L + 1) * _buf(4 * H * T) if attention == "online" else (L + 1) * _buf(4 * H * T * T)
    b += 9 * _buf(4 * C) + _buf(8) + 2 * _buf(4 * M) + _buf(4 * H * T) + _buf(4 * VP)
    b += _buf(4 * head_floats) if head_floats else 0        # (uniforms, one per chunk, are not counted)
    return b + _buf(4 * (1 + capacity))


def _check(p: Plan, BT: int):
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
    if cap and BT > cap:
        p.problems.append(f"batch x ctx = {BT:,} rows, over the {cap:,} loop trips a CPU adapter runs")
    if mem and p.total > mem:
        p.problems.append(f"{p.total:,} bytes in all, over the {mem:,} the system has available")


def largest_fitting_batch(cfg: Config, batch: int, attention: str, limits: dict, precision: str = "fp32") -> int | None:
    """The largest divisor of `batch` whose micro-batch fits (so that gradient accumulation keeps the batch)."""
    for b in sorted((d for d in range(1, batch + 1) if batch % d == 0), reverse=True):
        if plan(cfg, b, attention, batch // b, limits, precision=precision).fits:
            return b
    return None


def device_limits(gpu) -> dict:
    from .files import available_memory
    return {"max_binding": gpu.max_binding, "max_buffer": gpu.max_buffer,
            "align": int(gpu.limits.get("min-storage-buffer-offset-alignment", 256)),
            "loop_cap": gpu.LOOP_CAP if gpu.is_cpu else None,
            "memory": available_memory() if gpu.is_cpu else None}


def refusal(p: Plan) -> str:
    """The one-line message when a run does not fit: why, and what would."""
    msg = f"this run does not fit: {p.problems[0]}"
    b = largest_fitting_batch(p.cfg, p.batch * p.accum, p.attention, p.limits, p.precision)
    if b and b < p.batch * p.accum:
        msg += (f"; {{opt:batch}} {b} {{opt:grad_accum}} {p.batch * p.accum // b} fits and keeps the batch of "
                f"{p.batch * p.accum}")
    else:
        msg += "; use a smaller {opt:ctx}, {opt:d_model} or fewer {opt:layers}"
    return msg + " (tinygpt plan shows every buffer)"


def human(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def text(p: Plan) -> str:
    cfg = p.cfg
    what, largest = p.largest_binding
    lines = [f"# {cfg.layers} layers, d_model {cfg.d_model}, {cfg.heads} heads, ctx {cfg.ctx}, vocab {cfg.vocab}: "
             f"{n_params(cfg):,} parameters; batch {p.batch}" + (f" x {p.accum} micro-batches" if p.accum > 1 else "")
             + f", attention {p.attention}, {p.precision}"]
    for g, nbytes in p.groups.items():
        lines.append(f"{g:20s} {nbytes:>16,} bytes  {human(nbytes):>10s}")
    lines.append(f"{'total':20s} {p.total:>16,} bytes  {human(p.total):>10s}")
    lines.append(f"largest binding: {what}, {largest:,} bytes")
    lim = p.limits
    shown = {"max_binding": "binding limit", "align": "offset alignment", "max_buffer": "buffer limit", "loop_cap": "CPU loop cap (rows)",
             "memory": "memory available"}
    lines.append("limits: " + ", ".join(f"{shown[k]} {v:,}" for k, v in lim.items() if v is not None and k in shown))
    lines.append("fits" if p.fits else "does not fit: " + "; ".join(p.problems))
    return "\n".join(lines)

