"""The one table of what a model allocates: every buffer, its shape in symbols, its dtype under
the precision policy, its lifetime and its group in the memory budget.

The model allocates exactly these rows (allocate), and the memory budget counts exactly these
rows (budget.py), so the budget equals the allocation by construction. `sizes` gives the
symbols their values for one run; `flags` says which conditional rows exist.

Symbols: B windows a micro-batch, T positions, BT = B*T rows, C d_model, M the MLP width, H heads,
QC = H * hd the width of q and of the attention's output (C, unless the head dim is set apart),
L layers, VP the padded vocabulary, F the floats of a flat parameter buffer (model.layout), and
a few derived counts named where they are defined in sizes(). The decode step's table uses N
sequences and the cache's T = ctx.

dtype: "f32" or "u32", or the policy's: "stored" (what the matmuls read: core.precision) and
"weights" (the weights' copy the matmuls read). Lifetimes: "model" lives across steps (weights,
optimizer state); "step" is written and read within a step; "per layer" (and "per layer + 1") is one
buffer a layer, saved for the backward; "shared" is one scratch that every layer reuses; "layers'
scratch" is that too, named by every layer as its own (where another flag makes the same name per
layer); "per layer, per head chunk" are the score matrices, split by heads to fit a binding. Under the
"recompute" flag the "per layer" rows (not the residual stream's "per layer + 1") are one buffer
that every layer shares: the backward recomputes each block's forward into it from the block's
input, which stays saved.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..core.config import Config
from ..core.lora import LoRA, shapes as lora_shapes, trainable_shapes
from ..core.precision import Precision
from ..device.gpu import GPU, PER_WORD, Tensor, buffer_bytes
from ..device.kernels import CHUNK, GATE_FLOATS
from ..device.plan import KernelPlan
from .layout import LOSS_SLOT, Parts, batch_layout, head_block_rows, head_chunks, padded_vocab, param_layout, \
    rows_per_binding


@dataclass(frozen=True)
class Buffer:
    name: str
    shape: tuple        # symbols (keys of sizes()) or ints
    dtype: str          # "f32", "u32", "stored" or "weights"
    lifetime: str
    group: str          # the memory budget's group
    when: str = ""      # the flag it exists under ("": always)
    bound: str = "whole"    # how kernels bind it: "whole", "flat" (flat chunks) or "rows" (row chunks)
    label: str = ""     # what errors call it, a format string over sizes() ("": the name)


# the memory budget's groups
A, LG, AT, BW, OP = "activations (saved)", "logits", "attention scratch", "backward scratch", "optimizer scratch"

MODEL = (
    # name                shape                    dtype      lifetime        group
    # params: what the optimizer updates (every parameter; a LoRA run's adapters); base: a LoRA
    # run's frozen model, with the policy's copy of it made once
    Buffer("params",        ("F",),                  "f32",     "model",        "parameters", bound="flat"),
    Buffer("params copy",   ("F",),                  "weights", "model",        "parameters", "weight copy", "flat"),
    Buffer("base",          ("FB",),                 "f32",     "model",        "parameters", "lora", "flat"),
    Buffer("base copy",     ("FB",),                 "weights", "model",        "parameters", "lora, weight copy",
           "flat"),
    Buffer("grads",         ("F",),                  "f32",     "model",        "gradients", "training", "flat"),
    Buffer("grads micro",   ("F",),                  "f32",     "model",        "gradients", "accumulating", "flat"),
    Buffer("batch",         ("batch",),              "u32",     "step",         "batch"),
    # RoPE's (cos, sin) [ctx, hd/2, 2] (core.rope), written once: a rotary model's, and its decode step's;
    # the gains of a norm without weights (ones: nanochat's norms, its QK-norm)
    Buffer("rope table",    ("ctx", "hd"),           "f32",     "model",        "constants", "rotary"),
    Buffer("ones",          ("ones",),               "f32",     "model",        "constants", "ones"),
    # the block's activations (model.block): the residual stream in f32, the matmuls' operands as stored
    Buffer("x",             ("BT", "C"),             "f32",     "per layer + 1", A),
    Buffer("x emb",         ("BT", "C"),             "f32",     "step",         A, "embed norm"),   # before its norm
    Buffer("x emb stats",   (2, "BT"),               "f32",     "step",         A, "embed norm"),
    Buffer("x mid",         ("BT", "C"),             "f32",     "per layer",    A),
    Buffer("ln1",           ("BT", "C"),             "stored",  "per layer",    A),
    Buffer("ln1 stats",     (2, "BT"),               "f32",     "per layer",    A),
    Buffer("q",             ("BT", "QC"),            "stored",  "per layer",    A),
    # k and v as the attention reads them (each kv head copied to its query heads); a grouped model's
    # sampler keeps the projections' own instead, its key/value cache ("kv cache", below)
    Buffer("k",             ("BT", "QC"),            "stored",  "per layer",    A, "expanded kept"),
    Buffer("v",             ("BT", "QC"),            "stored",  "per layer",    A, "expanded kept"),
    Buffer("k",             ("BT", "QC"),            "stored",  "layers' scratch", A, "kv cache"),
    Buffer("v",             ("BT", "QC"),            "stored",  "layers' scratch", A, "kv cache"),
    Buffer("ctx",           ("BT", "QC"),            "stored",  "per layer",    A),
    Buffer("ln2",           ("BT", "C"),             "stored",  "per layer",    A),
    Buffer("ln2 stats",     (2, "BT"),               "f32",     "per layer",    A),
    Buffer("pre",           ("BT", "M"),             "stored",  "per layer",    A),
    Buffer("gel",           ("BT", "M"),             "stored",  "per layer",    A),
    Buffer("mlp gate",      ("BT", "M"),             "stored",  "per layer",    A, "gated"),   # a gated MLP's
    # QK-norm's input: the projections' float32 q and k, and each head's row statistics
    Buffer("q raw",         ("BT", "QC"),            "f32",     "per layer",    A, "qk norm"),
    Buffer("k raw",         ("BT", "KVC"),           "f32",     "per layer",    A, "qk norm"),
    Buffer("q norm stats",  (2, "BTH"),              "f32",     "per layer",    A, "qk norm"),
    Buffer("k norm stats",  (2, "BTKV"),             "f32",     "per layer",    A, "qk norm"),
    # grouped-query attention: k and v of the KV heads as stored, before each is copied to its query heads
    Buffer("k kv",          ("BT", "KVC"),           "stored",  "layers' scratch", A, "grouped, expanded kept"),
    Buffer("v kv",          ("BT", "KVC"),           "stored",  "layers' scratch", A, "grouped, expanded kept"),
    Buffer("k kv",          ("BT", "KVC"),           "stored",  "per layer",    A, "kv cache"),
    Buffer("v kv",          ("BT", "KVC"),           "stored",  "per layer",    A, "kv cache"),
    # float32 copies for the attention kernels that do not read what is stored
    Buffer("q f32",         ("BT", "QC"),            "f32",     "shared",       A, "attention reads f32"),
    Buffer("k f32",         ("BT", "QC"),            "f32",     "shared",       A, "attention reads f32"),
    Buffer("v f32",         ("BT", "QC"),            "f32",     "shared",       A, "attention reads f32"),
    Buffer("ctx f32",       ("BT", "QC"),            "f32",     "shared",       A, "converts"),
    Buffer("branch out",    ("BT", "C"),             "f32",     "shared",       A),
    # LoRA: s (x A^T) of each target, saved (one [BT, R] block per target, 256-byte aligned); the
    # unscaled product; a 16-bit output's float32 sum before it is rounded
    Buffer("lora hs",       ("lora_saved",),         "f32",     "per layer",    A, "lora"),
    Buffer("lora h",        ("BT", "R"),             "f32",     "shared",       A, "lora"),
    Buffer("lora y",        ("BT", "LY"),            "f32",     "shared",       A, "lora, converts"),
    Buffer("lnf",           ("BT", "C"),             "stored",  "step",         A, "head"),
    Buffer("lnf stats",     (2, "BT"),               "f32",     "step",         A, "head"),
    Buffer("logits",        ("BT", "VP"),            "f32",     "step",         LG, "head", "rows",
           "logits [B*T={BT}, V={VP}]"),
    Buffer("losses",        ("BT",),                 "f32",     "step",         LG, "head"),
    Buffer("loss slots",    ("slots",),              "f32",     "step",         LG, "head"),
    Buffer("dpo weights",   ("B",),                  "f32",     "step",         LG, "head, dpo"),
    Buffer("head block",    ("head_block",),         "f32",     "shared",       LG, "split head"),
    # the attention path's scratch: its own rows (model.attention, AttentionPath.rows())
    # the backward's gradients of activations, shared by the layers
    Buffer("d residual",    ("BT", "C"),             "f32",     "shared",       BW, "training"),
    Buffer("d ln",          ("BT", "C"),             "f32",     "shared",       BW, "training"),
    Buffer("d act",         ("BT", "M"),             "f32",     "shared",       BW, "training"),
    Buffer("d pre",         ("BT", "M"),             "f32",     "shared",       BW, "training"),
    Buffer("d mlp gate",    ("BT", "M"),             "f32",     "shared",       BW, "training, gated"),
    Buffer("d ctx",         ("BT", "QC"),            "f32",     "shared",       BW, "training"),
    Buffer("dq",            ("BT", "QC"),            "f32",     "shared",       BW, "training"),
    Buffer("dk",            ("BT", "QC"),            "f32",     "shared",       BW, "training"),
    Buffer("dv",            ("BT", "QC"),            "f32",     "shared",       BW, "training"),
    Buffer("d qk raw",      ("BT", "QC"),            "f32",     "shared",       BW, "training, qk norm"),
    Buffer("dk kv",         ("BT", "KVC"),           "f32",     "shared",       BW, "training, grouped"),
    Buffer("dv kv",         ("BT", "KVC"),           "f32",     "shared",       BW, "training, grouped"),
    Buffer("lora gs",       ("BT", "R"),             "f32",     "shared",       BW, "lora"),
    # the gate that wraps every optimizer (model.optim.Gate), and the elementwise optimizers'
    # decay per 256-float block; each optimizer's state and scratch: its own rows (optimizer.rows())
    Buffer("weight decay",  ("wd",),                 "f32",     "model",        OP, "training"),
    Buffer("norm partials", ("partials",),           "f32",     "model",        OP, "training"),
    Buffer("gate",          ("gate",),               "f32",     "model",        OP, "training"),
)

# The decode step from the key/value cache (model.decode): one row per sequence through every
# block, the model's prefill (its k and v per layer) being the cache.
S = "sampling"
DECODE = (
    Buffer("ids",           ("ids",),                "u32",     "step",         S),  # next [N] | history
    Buffer("x a",           ("N", "C"),              "f32",     "shared",       S, "cache"),
    Buffer("x b",           ("N", "C"),              "f32",     "shared",       S, "cache"),
    Buffer("x mid",         ("N", "C"),              "f32",     "shared",       S, "cache"),
    # the matmuls' operands as the policy stores them, as the prefill's (whose k, v are the cache)
    Buffer("ln",            ("N", "C"),              "stored",  "shared",       S, "cache"),
    Buffer("ln stats",      (2, "N"),                "f32",     "shared",       S, "cache"),
    Buffer("branch out",    ("N", "C"),              "f32",     "shared",       S, "cache"),
    Buffer("q",             ("N", "QC"),             "stored",  "shared",       S, "cache"),
    Buffer("k",             ("N", "KVC"),            "stored",  "shared",       S, "cache"),   # the kv heads'
    Buffer("v",             ("N", "KVC"),            "stored",  "shared",       S, "cache"),
    Buffer("att",           ("N", "QC"),             "stored",  "shared",       S, "cache"),
    Buffer("att f32",       ("N", "QC"),             "f32",     "shared",       S, "cache, converts"),
    Buffer("pre",           ("N", "M"),              "stored",  "shared",       S, "cache"),
    Buffer("gel",           ("N", "M"),              "stored",  "shared",       S, "cache"),
    Buffer("mlp gate",      ("N", "M"),              "stored",  "shared",       S, "cache, gated"),
    Buffer("q raw",         ("N", "QC"),             "f32",     "shared",       S, "cache, qk norm"),
    Buffer("k raw",         ("N", "KVC"),            "f32",     "shared",       S, "cache, qk norm"),
    Buffer("q norm stats",  (2, "NH"),               "f32",     "shared",       S, "cache, qk norm"),
    Buffer("k norm stats",  (2, "NKV"),              "f32",     "shared",       S, "cache, qk norm"),
    Buffer("scores",        ("N", "H", "T"),         "f32",     "shared",       S, "cache"),
    Buffer("head block",    ("head_block",),         "f32",     "shared",       S, "cache, split head"),
    Buffer("logits",        ("N", "VP"),             "f32",     "step",         S, "cache",
           label="logits of {N} samples"),
)


def lora_block(BT: int, R: int) -> int:
    """Floats between two targets' saved blocks in "lora hs": [BT, R], rounded up to 64 floats
    (256 bytes, any adapter's offset alignment)."""
    return -(-BT * R // 64) * 64


def sizes(cfg: Config, B: int, T: int, accum: int = 1, max_binding: int | None = None, head_rows: int = 0,
          N: int = 0, capacity: int = 0, lora: LoRA | None = None, part: int = 0, dpo: bool = False,
          packed: bool = False) -> dict:
    """The symbols' values for a model of cfg on [B, T] batches (and a decoder of N sequences).
    part: the floats of one buffer of a flat array (layout.flat_part; 0: one buffer)."""
    V, C, H = cfg.vocab, cfg.d_model, cfg.heads
    VP = padded_vocab(V)
    FB = param_layout(cfg, part=part)[1]
    F = param_layout(cfg, trainable_shapes(cfg, lora), part)[1] if lora else FB
    R = lora.rank if lora else 0
    chunks = head_chunks(B, T, H, max_binding)
    return {"B": B, "T": T, "BT": B * T, "C": C, "ctx": cfg.ctx, "hd": cfg.hd, "M": cfg.d_mlp,
            "H": H, "L": cfg.layers, "V": V, "VP": VP,
            "F": F, "FB": FB, "part": part, "R": R,
            "LY": max(lora_shapes(cfg, W)[1] for W in lora.targets) if lora else C,
            "QC": cfg.block.heads.q_width, "ones": max(C, cfg.hd),       # the gains of ones: a norm's, QK-norm's
            "lora_saved": len(lora.targets) * lora_block(B * T, R) if lora else 0,
            "batch": batch_layout(B * T, V, B if dpo else 0, T if packed else 0)[1],
            "slots": LOSS_SLOT * accum,                          # one loss slot a micro-batch
            "head_block": head_block_rows(VP, C, head_rows, max_binding)[1],   # the split head's scratch
            "head_chunks": chunks, "NHmax": max(n for _, n in chunks),
            "wd": F // 256,                                      # one decay value a 256-float block
            "partials": -(-F // CHUNK),                          # the norm's partial sums
            "gate": GATE_FLOATS,                                 # the norm, the clip factor, the loss scaler
            "BTH": B * T * H, "NH": N * H, "N": N, "ids": N + N * capacity,
            "KVC": cfg.block.heads.kv_width, "BTKV": B * T * cfg.n_kv, "NKV": N * cfg.n_kv}


def flags(policy: Precision, *, training: bool, head: bool, accum: int, split_head: bool,
          attention_reads_stored: bool, cache: bool = False, recompute: bool = False, lora: bool = False,
          rotary: bool = False, qk_norm=None, grouped: bool = False, norm_free: bool = False,
          embed_norm: bool = False, gated_mlp: bool = False, prefill: bool = False, dpo: bool = False) -> set:
    """The conditions the table's rows are taken under, each decided once here."""
    on = {"lora"} if lora and training else set()
    on |= {"dpo"} if dpo else set()
    on |= {"rotary"} if rotary else set()
    on |= {"grouped"} if grouped else set()
    on |= {"embed norm"} if embed_norm else set()
    on |= {"gated"} if gated_mlp else set()
    on |= {"qk norm"} if qk_norm is not None and qk_norm.on else set()
    on |= {"ones"} if qk_norm is not None and qk_norm.on and not qk_norm.weights or norm_free else set()
    on |= {"training"} if training else set()
    on |= {"head"} if head else set()
    on |= {"accumulating"} if accum > 1 else set()
    on |= {"split head"} if split_head else set()
    on |= {"weight copy"} if policy.weight_copy else set()
    on |= {"converts"} if policy.converts else set()
    on |= {"attention reads f32"} if policy.converts and not attention_reads_stored else set()
    on |= {"cache"} if cache else set()
    on |= {"recompute"} if recompute and training else set()
    # the cached sampler's prefill keeps each layer's k and v as projected: a grouped model's cache
    on |= {"kv cache"} if prefill and grouped else {"expanded kept"}
    # and nothing else of a layer: its other activations are read by that layer alone (no backward),
    # so one set serves every layer, as with recompute
    on |= {"share layers"} if prefill else set()
    return on


@dataclass
class Allocation:
    """One buffer of one run: its row, which layer (and head chunk) it serves, its shape in
    elements and its dtype, resolved."""
    row: Buffer
    layer: int | None
    chunk: tuple | None      # (first head, heads) of a score matrix
    shape: tuple
    dtype: str
    layers: int = 1          # how many layers name it as theirs (recompute, layers' scratch: one buffer)

    @property
    def words(self) -> tuple:
        """The shape in 4-byte words (a bf16 tensor packs two values a word along its last axis)."""
        return self.shape[:-1] + (self.shape[-1] // PER_WORD[self.dtype],)

    @property
    def nbytes(self) -> int:
        return 4 * math.prod(self.words)


CACHE_ROWS = ("k", "v", "k kv", "v kv")     # what a prefill keeps of each layer: the decode step's cache


def resolve(table, on: set, size: dict, policy: Precision) -> list[Allocation]:
    """Every buffer of the rows whose flag is on, in table order, one a layer where the lifetime says."""
    out = []
    dtype_of = {"stored": policy.stored, "weights": policy.weights}
    for row in table:
        if row.when and not all(w.strip() in on for w in row.when.split(",")):
            continue
        # layers sharing one saved activation: all with recompute; a prefill's all but its cache's
        shared = size["L"] if "recompute" in on or ("share layers" in on and row.name not in CACHE_ROWS) else 1
        dtype = dtype_of.get(row.dtype, row.dtype)
        if row.lifetime == "per layer, per head chunk":
            for l in range(size["L"] // shared):
                for h0, nh in size["head_chunks"]:
                    out.append(Allocation(row, l, (h0, nh), _shape(row.shape, dict(size, NH=nh)), dtype, shared))
            continue
        count = {"per layer": size["L"] // shared, "per layer + 1": size["L"] + 1,
                 "layers' scratch": 1}.get(row.lifetime)
        views = {"per layer": shared, "layers' scratch": size["L"]}.get(row.lifetime, 1)
        shape = _shape(row.shape, size)
        out += [Allocation(row, l, None, shape, dtype, views)
                for l in range(count)] if count is not None else [Allocation(row, None, None, shape, dtype)]
    return out


def model_rows(spec, plan: KernelPlan, max_binding: int | None, optimizer=None, part: int = 0):
    """(resolved rows, sizes) of a Model built as `spec` says (model.spec.RunSpec): what
    model.gpt.Model allocates and budget.py counts. The head's block scratch holds one chunk of
    logit rows (at least 64 rows: fewer cannot be bound, which layout.logit_chunks refuses).
    optimizer (training): the model.optim optimizer made from spec.optimizer, whose rows (its state
    and scratch) follow the table's, after the attention path's scratch. part: as sizes'."""
    cfg, B, T, attention, policy = spec.cfg, spec.B, spec.T, spec.attention, spec.precision
    training, head, accum, lora = spec.training, spec.lm_head, spec.accum, spec.lora
    BT = B * T
    head_rows = min(BT, max(64, rows_per_binding(BT, 4 * padded_vocab(cfg.vocab), max_binding))) if head else 0
    assert optimizer is not None or not training, "a model that trains has an optimizer"
    size = sizes(cfg, B, T, accum, max_binding, head_rows, lora=lora, part=part, dpo=spec.dpo is not None,
                 packed=spec.packed)
    size.update(optimizer.sizes(cfg) if training else {})
    on = flags(policy, training=training, head=head, accum=accum, split_head=size["head_block"] > 0,
               attention_reads_stored=attention.reads(policy.stored, plan, B, T, cfg.d_model, cfg.heads),
               recompute=spec.recompute, lora=lora is not None, rotary=cfg.block.position.rotary,
               qk_norm=cfg.block.qk_norm, grouped=cfg.block.heads.grouped, norm_free=not cfg.block.norm.weights,
               embed_norm=cfg.block.embed_norm, gated_mlp=cfg.block.mlp.gated,
               prefill=not head,                  # a model without the LM head is the cached sampler's prefill
               dpo=spec.dpo is not None)
    table = MODEL + attention.rows() + (optimizer.rows() if training else ())
    return resolve(table, on, size, policy), size


def decode_rows(cfg: Config, N: int, capacity: int, policy: Precision, cache: bool, max_binding: int | None):
    """(resolved rows, sizes) of a Decoder's own buffers (its Model's are model_rows')."""
    size = sizes(cfg, N, cfg.ctx, max_binding=max_binding, head_rows=N, N=N, capacity=capacity)
    on = flags(policy, training=False, head=False, accum=1, split_head=size["head_block"] > 0,
               attention_reads_stored=True, cache=cache, qk_norm=cfg.block.qk_norm,   # the attention: decode.wgsl's
               gated_mlp=cfg.block.mlp.gated)
    return resolve(DECODE, on, size, policy), size


def _shape(symbols, size: dict) -> tuple:
    return tuple(int(size[s]) if isinstance(s, str) else int(s) for s in symbols)


def allocate(gpu: GPU, allocations: list[Allocation], size: dict, row_chunks: dict | None = None) -> dict:
    """The device buffers of `allocations`: name -> a Tensor, or a list of them (per layer; per layer
    of per-chunk lists for the score matrices). row_chunks: name -> how many chunks of rows a
    "rows"-bound buffer is bound in (one: bound whole, so its size is checked as a binding)."""
    out = {}
    for p in allocations:
        label = p.row.label.format(**size) if p.row.label else p.row.name
        if p.row.bound == "whole":
            t = gpu.tensor(p.words, p.dtype, label)
        elif p.row.bound == "flat" and size["part"] and p.shape[0] > size["part"]:
            t = flat_parts(gpu, p, size["part"], label)
        else:
            whole = p.row.bound == "rows" and (row_chunks or {}).get(p.row.name, 1) == 1
            t = Tensor(gpu.buffer(p.nbytes, label, binding=whole), 0, p.words, p.dtype, label)
        if p.chunk is not None:
            per = out.setdefault(p.row.name, [])
            if len(per) <= p.layer:
                per.append([])
            per[p.layer].append(t)
        elif p.layer is not None:
            out.setdefault(p.row.name, []).append(t)
        else:
            out[p.row.name] = t
        if p.layers > 1:         # one buffer every layer's view names (recompute)
            out[p.row.name] = out[p.row.name] * p.layers
    return out


def part_words(p: Allocation, part: int) -> list[int]:
    """The words of each buffer a flat row is allocated as: one, or one a part (layout.Parts)."""
    n, per_word = p.shape[0], PER_WORD[p.dtype]
    if not part or n <= part:
        return [p.words[0]]
    return [min(part, n - f0) // per_word for f0 in range(0, n, part)]


def flat_parts(gpu: GPU, p: Allocation, part: int, label: str) -> Parts:
    """A flat row larger than one part, a buffer a part (bound a chunk at a time, never whole)."""
    words = part_words(p, part)
    return Parts(tuple(Tensor(gpu.buffer(4 * w, f"{label} {i + 1}/{len(words)}", binding=False), 0, (w,),
                              p.dtype, label) for i, w in enumerate(words)), part, p.dtype, label)


def total_bytes(allocations: list[Allocation]) -> int:
    """What allocate asks the device for (GPU.buffer rounds each buffer up to 16 bytes)."""
    return sum(buffer_bytes(p.nbytes) for p in allocations)

