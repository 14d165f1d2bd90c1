"""Where things lie in the model's buffers, and how a buffer larger than one binding is bound.

Parameters, gradients and both AdamW moments are each one flat array with the same layout:
tensors in .tinygpt order, each starting on a 256-float boundary (a LayerNorm's bias follows its
gain directly, so [g | b] binds as one [2, C] tensor). Padding stays zero, so the flat optimizer
kernels can ignore it. A flat array larger than one device buffer is several buffers (Parts),
cut every `part` floats (flat_part), and no parameter lies across a cut: the layout moves one
that would to the next part (Qwen3-0.6B's 2.4 GB of float32 weights on an adapter whose buffers
hold 2 GiB). Pure arithmetic on sizes and limits: the memory budget uses it before
anything exists, the model when it allocates.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from ..core.block import HEAD_TABLES
from ..core.config import Config, param_shapes
from ..device.gpu import PER_WORD, LimitError, Tensor
from ..device.kernels import CHUNK

LOSS_SLOT = 64             # floats between micro-batch loss slots: 256 bytes, any adapter's binding alignment
HEAD_BLOCK_BYTES = 32 << 20    # the split head's dense scratch block: at most this, or 64 rows


def padded_vocab(V: int) -> int:
    """The vocabulary rounded up to a multiple of 8, so the head's matmuls take the vec4 kernels
    and, in bf16, the 8-wide ones (50257 -> 50264). The extra rows of tok_emb stay zero and their
    logits are never used."""
    return -(-V // 8) * 8


def param_layout(cfg: Config, shapes=None, part: int = 0):
    """name -> (float offset, shape) in the flat buffers, and the total floats, of `shapes` (every
    parameter by default; a LoRA run's trainable ones, lora.trainable_shapes, have a layout of their own).

    tok_emb (and an untied head's lm_head) reserves padded_vocab rows; the extra ones stay zero (no
    gradient reaches them). part (flat_part; 0: one buffer): a parameter (with a norm's bias packed
    after it) that would lie across a multiple of `part` starts at that multiple instead; one larger
    than a part cannot, and the memory budget refuses it."""
    items = list(param_shapes(cfg) if shapes is None else shapes)
    packed = [n.endswith("_b") and ("ln" in n.split(".")[-1]) for n, _, _ in items]  # LN bias right after its gain
    floats = [int(np.prod(s)) + ((padded_vocab(cfg.vocab) - cfg.vocab) * cfg.d_model if n in HEAD_TABLES else 0)
              for n, s, _ in items]
    offs, pos = {}, 0
    for i, (name, shape, _) in enumerate(items):
        if not packed[i]:
            pos = -(-pos // 256) * 256
            need = floats[i] + (floats[i + 1] if i + 1 < len(items) and packed[i + 1] else 0)
            if part and pos // part != (pos + need - 1) // part and need <= part:
                pos = -(-pos // part) * part
        offs[name] = (pos, shape)
        pos += floats[i]
    return offs, -(-pos // 256) * 256


def batch_layout(BT: int, V: int, refs: int = 0, packed_T: int = 0) -> tuple[dict, int]:
    """The batch buffer, uploaded in one write a step: tokens | targets | bucket offsets (V+1) |
    bucket positions (BT) | and, for preference pairs, the reference's log-probability of each
    window (refs, float32 bits) | and, for packed windows of packed_T rows, each row's position in
    its record (docs) and the rows bucketed by that position (pos buckets: offsets (T+1) | rows (BT),
    the position table's gradient), each part starting on 256 words -> ({part: (first word, words)}, words)."""
    parts, n = {}, 0
    packed = (("docs", BT), ("pos buckets", packed_T + 1 + BT)) if packed_T else ()
    for name, size in (("tokens", BT), ("targets", BT), ("buckets", V + 1 + BT)) + ((("refs", refs),) if refs else ()) \
            + packed:
        parts[name] = (n, size)
        n = -(-(n + size) // 256) * 256
    return parts, n


def rows(t: Tensor, r0: int, n: int) -> Tensor:
    """Rows r0 .. r0+n-1 of a [rows, cols] tensor, as a tensor of its own."""
    cols = t.shape[1]
    return Tensor(t.buf, t.offset + 4 * r0 * cols, (n, cols), t.dtype, t.name)


@dataclass(frozen=True)
class Parts:
    """A flat array over several device buffers: floats [i part, (i + 1) part) in tensors[i]. Only a
    flat array larger than one part is allocated so (model.buffers.allocate); its chunks
    (flat_chunks) and parameters (param_layout) each lie in one part, so every kernel binds a
    Tensor of one buffer (flat_view)."""
    tensors: tuple      # each part, a flat Tensor of a buffer of its own
    part: int           # floats a part holds (the last may hold fewer)
    dtype: str
    name: str

    @property
    def size(self) -> int:
        return sum(t.size for t in self.tensors)


def flat_view(t, f0: int, n: int, shape: tuple | None = None) -> Tensor:
    """Floats f0 .. f0+n-1 of a flat array (a Tensor or Parts; a 16-bit one packs two a word), as
    a Tensor of `shape` in words ([n] by default)."""
    if isinstance(t, Parts):
        i = f0 // t.part
        assert f0 + n <= (i + 1) * t.part, f"{t.name}: floats {f0} .. {f0 + n} lie across a part"
        t, f0 = t.tensors[i], f0 - i * t.part
    per_word = PER_WORD[t.dtype]
    return Tensor(t.buf, t.offset + 4 * f0 // per_word, shape or (n // per_word,), t.dtype, t.name)


WRITE_FLUSH = 64 << 20     # bytes written between waits for the device (write_tensors)


@dataclass
class FlatLayout:
    """Where a model's things lie, decided once when it is built (gpt.model_layout): the flat
    arrays' layouts and how they are bound, the logits' chunks, the batch's parts and the
    buffer table's rows (model.buffers)."""
    VP: int                      # the padded vocabulary: the logits' row stride
    trainable: list              # what the optimizer updates (core.lora.trainable_shapes)
    part: int                    # a flat array's floats a device buffer (flat_part)
    offsets: dict                # the trainable parameters' layout: name -> (offset, shape)
    n_flat: int                  # their flat arrays' floats
    base_offsets: dict | None    # a LoRA run's frozen model's layout
    logit_chunks: list           # (first row, rows) of the logits each binding holds
    flat_chunks: list            # (first float, floats) of a flat array each binding holds
    base_chunks: list            # the frozen model's
    batch_parts: dict            # batch_layout's parts: name -> (first word, words)
    rows: list                   # the buffer table's rows, one a buffer
    size: dict                   # their sizes by name


def param_views(flat, offsets: dict, VP: int, cfg: Config) -> dict:
    """name -> a view of that parameter in a flat array (a Tensor, or Parts) of the layout
    `offsets` (tok_emb [VP, C], its padded rows included), and "ln_f", "hL.ln1", "hL.ln2" -> the
    norm's [g | b] as one [2, C] where the layout holds it (an RMSNorm's g alone, [1, C])."""
    per_word = PER_WORD[flat.dtype]                         # a bf16 flat buffer packs two a word
    view = lambda off, shape, name: dataclasses.replace(
        flat_view(flat, off, math.prod(shape), shape[:-1] + (shape[-1] // per_word,)), name=name)
    out = {}
    for name, (off, shape) in offsets.items():
        out[name] = view(off, (VP, shape[1]) if name in HEAD_TABLES else tuple(shape), name)
    C = cfg.d_model
    norms = [("ln_f", "ln_f_g"), ("ln_e", "ln_e_g")]
    for ln, gain in norms + [(f"h{l}.ln{i}", f"h{l}.ln{i}_g") for l in range(cfg.layers) for i in (1, 2)]:
        if gain in offsets:
            out[ln] = view(offsets[gain][0], (2 if gain[:-1] + "b" in offsets else 1, C), ln)
    return out


def write_tensors(gpu, flat, offsets: dict, tensors: dict):
    """Each named tensor (float32) into its place in a flat array of the layout `offsets`, a write
    each: no flat copy of the model on the host (Qwen3-0.6B's is 2.4 GB); the padding between
    them stays the zeros a new buffer holds. Every WRITE_FLUSH bytes it waits for the device: a
    write is staged in host memory until a submission carries it, and a model's worth staged at
    once is a second model in memory."""
    since = 0
    for name, (off, shape) in offsets.items():
        a = np.asarray(tensors[name], np.float32)
        if a.shape != tuple(shape):
            raise ValueError(f"{name}: shape {a.shape}, expected {tuple(shape)}")
        gpu.write(flat_view(flat, off, a.size), a)
        since += a.nbytes
        if since >= WRITE_FLUSH:
            gpu.sync()
            since = 0


def read_tensors(gpu, flat, offsets: dict) -> dict:
    """name -> that parameter's values (an array of its own) in a flat float32 array of the layout
    `offsets`, read a tensor at a time (no flat copy on the host)."""
    return {n: gpu.read(flat_view(flat, o, math.prod(s))).reshape(s) for n, (o, s) in offsets.items()}


def flat_grain(align: int) -> int:
    """Floats a flat chunk starts on a multiple of: whole blocks of the norm's partial sums (4,096
    floats, so whole 256-float decay blocks too; the optimizer binds those two tables whole and
    passes each chunk's index into them), at a byte offset the device's alignment allows for the
    float32 buffers and for a bf16 copy (2 bytes a value): 4,096 floats for any alignment up to
    8 KiB."""
    return math.lcm(CHUNK, max(1, align // 2))


def flat_part(max_buffer: int | None, align: int = 256) -> int:
    """Floats one buffer of a flat array holds: the most whole flat_grain(align) blocks within
    max_buffer bytes (0: no limit known, one buffer). A cut there starts every part, and every
    chunk of it, on the grain."""
    if not max_buffer:
        return 0
    grain = flat_grain(align)
    return (max_buffer // 4) // grain * grain


def flat_chunks(n: int, max_binding: int, align: int = 256, part: int = 0):
    """[(first float, floats)] of an n-float flat array, each chunk within one binding and one
    part (flat_part; 0: one buffer), starting on a multiple of flat_grain(align)."""
    part = part or n
    if 4 * n <= max_binding and n <= part:
        return [(0, n)]
    grain = flat_grain(align)
    per = min(part, (max_binding // 4) // grain * grain)
    if per == 0:
        raise LimitError(f"a flat chunk of {4 * grain:,} bytes exceeds this adapter's binding limit "
                         f"{max_binding:,} (max-storage-buffer-binding-size)")
    return [(f0, min(per, p0 + part - f0, n - f0)) for p0 in range(0, n, part)
            for f0 in range(p0, min(p0 + part, n), per)]


def flat_bound(n: int, max_binding: int | None, align: int) -> int:
    """Bytes of the largest chunk flat_chunks binds (the whole buffer when it fits; more than the
    limit when not even one aligned chunk does, which the budget then reports)."""
    if not max_binding or 4 * n <= max_binding:
        return 4 * n
    grain = flat_grain(align)
    per = (max_binding // 4) // grain * grain
    return 4 * min(n, per) if per else 4 * grain


def rows_per_binding(n: int, row_bytes: int, max_binding: int | None) -> int:
    """Rows of an [n, ...] tensor that one binding holds: all n where they fit (or no limit is
    known), else a multiple of 64 rows, which keeps every bound offset aligned (and every chunk a
    whole number of vec4 rows where rows are); 0 where not even 64 rows fit."""
    if not max_binding or n * row_bytes <= max_binding:
        return n
    return (max_binding // row_bytes) // 64 * 64


def row_chunks(n: int, row_bytes: int, max_binding: int, what: str):
    """[(first row, rows)] of an [n, ...] tensor of row_bytes a row, each chunk within one binding."""
    per = rows_per_binding(n, row_bytes, max_binding)
    if per == 0:
        raise LimitError(f"64 rows of {what} need {64 * row_bytes:,} bytes, over this adapter's binding limit "
                         f"{max_binding:,} (max-storage-buffer-binding-size)")
    return [(r0, min(per, n - r0)) for r0 in range(0, n, per)]


def logit_chunks(BT: int, VP: int, max_binding: int):
    """[(first row, rows)] so that each chunk of [BT, VP] logits fits one binding."""
    return row_chunks(BT, 4 * VP, max_binding, f"logits (V={VP})")


def vocab_chunks(VP: int, C: int, max_binding: int):
    """[(first row, rows)] of the [VP, C] token table, each within one binding (GPT-2's 50264 x 768
    floats are 154 MB, lavapipe binds 134 MB)."""
    return row_chunks(VP, 4 * C, max_binding, f"the token embedding (d_model {C})")


def head_block_rows(VP: int, C: int, max_rows: int, max_binding: int | None) -> tuple[int, int]:
    """(rows per block, floats of the scratch) of the split head; (0, 0) when the table fits whole.
    Blocks of rows are multiples of 64 (aligned offsets), fewer only when max_rows is."""
    wide = rows_per_binding(VP, 4 * C, max_binding)      # the widest chunk of the token table
    if wide == VP:
        return 0, 0
    wide = max(wide, 64)                                   # under 64 rows: refused (vocab_chunks, the budget)
    rows_ = max(64, HEAD_BLOCK_BYTES // (4 * wide) // 64 * 64)
    rows_ = min(rows_, max_rows)
    return rows_, rows_ * wide


def head_chunks(B: int, T: int, H: int, max_binding: int | None):
    """[(first head, heads)] so that one chunk's [B, nh, T, T] score matrix fits one binding; at
    least one head a chunk (where even one does not fit, Attention refuses and the budget says so)."""
    per_head = 4 * B * T * T
    nh = max(1, min(H, (max_binding or per_head * H) // per_head))
    return [(h0, min(nh, H - h0)) for h0 in range(0, H, nh)]
