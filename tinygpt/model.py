"""The GPT on the GPU: the parameter table, activations, and the recorded
forward, backward and optimizer step.

Everything is allocated and bound once in __init__; `step` uploads the batch
(one write), encodes the recorded dispatches into one command buffer, submits
once, and reads nothing back. `loss()` reads the loss when it is shown.

Parameters, gradients and both AdamW moments are each one flat buffer with
the same layout: tensors in .tinygpt order, each starting on a 256-float
boundary (a LayerNorm's bias follows its gain directly, so [g | b] binds as one
[2, C] tensor). Padding stays zero, so the flat optimizer kernels can ignore it.
"""
from __future__ import annotations

import functools
import inspect

import numpy as np

from . import kernels
from .attention import Attention
from .config import Config, param_specs
from .gpu import GPU, LimitError, Tensor
from .plan import KernelPlan, make_plan
from .prep import token_buckets


class Launchers:
    """kernels.py with the model's plan passed to every launcher that takes one."""

    def __init__(self, plan: KernelPlan):
        self.plan = plan

    def __getattr__(self, name):
        fn = getattr(kernels, name)
        if callable(fn) and "plan" in inspect.signature(fn).parameters:
            return functools.partial(fn, plan=self.plan)
        return fn


LOSS_SLOT = 64      # floats between micro-batch loss slots: 256 bytes, any adapter's binding alignment
PRECISIONS = ("fp32", "bf16")


def bf16_problem(plan: KernelPlan, C: int, M: int) -> str | None:
    """Why a bf16 model cannot run with this width, or None: its GELU reads 8 bf16 at a time and
    the subgroup matmuls 8 per row, so d_model and the MLP width must be multiples of 8 (the
    matmuls take matmul_bf16.wgsl where subgroups do not work)."""
    if C % 8 or M % 8:
        return f"{{opt:precision}} bf16 needs {{opt:d_model}} and the MLP width multiples of 8, got {C} and {M}"
    return None


def padded_vocab(V: int) -> int:
    """The vocabulary rounded up to a multiple of 8, so the head's matmuls take the vec4 kernels
    and, in bf16, the 8-wide ones (50257 -> 50264). The extra rows of tok_emb stay zero and their
    logits are never used."""
    return -(-V // 8) * 8


def layout(cfg: Config):
    """name -> (float offset, shape) in the flat buffers, and the total floats.

    tok_emb reserves padded_vocab rows; the extra ones stay zero (no gradient reaches them)."""
    offs, pos = {}, 0
    for name, shape, _ in param_specs(cfg):
        packed = name.endswith("_b") and ("ln" in name.split(".")[-1])  # LN bias right after its gain
        if not packed:
            pos = -(-pos // 256) * 256
        offs[name] = (pos, shape)
        pos += int(np.prod(shape))
        if name == "tok_emb":
            pos += (padded_vocab(cfg.vocab) - cfg.vocab) * cfg.d_model
    return offs, -(-pos // 256) * 256


def rows(t: Tensor, r0: int, n: int) -> Tensor:
    """Rows r0 .. r0+n-1 of a [rows, cols] tensor, as a tensor of its own."""
    cols = t.shape[1]
    return Tensor(t.buf, t.offset + 4 * r0 * cols, (n, cols), t.dtype, t.name)


def flat_chunks(gpu: GPU, n: int):
    """[(first float, floats)] of an n-float flat buffer, each chunk within one binding. Chunks
    start on multiples of 1024 x the offset alignment in floats, so that the views of the norm's
    partial sums (one per 4096 floats) and of the decay table (one per 256) are aligned too."""
    if 4 * n <= gpu.max_binding:
        return [(0, n)]
    align = int(gpu.limits.get("min-storage-buffer-offset-alignment", 256))
    grain = 1024 * max(align, 4)
    per = (gpu.max_binding // 4) // grain * grain
    if per == 0:
        raise LimitError(f"a flat chunk of {4 * grain:,} bytes exceeds this adapter's binding limit "
                         f"{gpu.max_binding:,} (max-storage-buffer-binding-size)")
    return [(f0, min(per, n - f0)) for f0 in range(0, n, per)]


def flat_view(t: Tensor, f0: int, n: int) -> Tensor:
    """Floats f0 .. f0+n-1 of a flat tensor."""
    return Tensor(t.buf, t.offset + 4 * f0, (n,), t.dtype, t.name)


def rows_per_binding(n: int, row_bytes: int, max_binding: int | None) -> int:
    """Rows of an [n, ...] tensor that one binding holds: all n where they fit (or no limit is
    known), else a multiple of 64 rows, which keeps every bound offset aligned (and every chunk a
    whole number of vec4 rows where rows are); 0 where not even 64 rows fit."""
    if not max_binding or n * row_bytes <= max_binding:
        return n
    return (max_binding // row_bytes) // 64 * 64


def row_chunks(gpu: GPU, n: int, row_bytes: int, what: str):
    """[(first row, rows)] of an [n, ...] tensor of row_bytes a row, each chunk within one binding."""
    per = rows_per_binding(n, row_bytes, gpu.max_binding)
    if per == 0:
        raise LimitError(f"64 rows of {what} need {64 * row_bytes:,} bytes, over this adapter's binding limit "
                         f"{gpu.max_binding:,} (max-storage-buffer-binding-size)")
    return [(r0, min(per, n - r0)) for r0 in range(0, n, per)]


def logit_chunks(gpu: GPU, BT: int, V: int):
    """[(first row, rows)] so that each chunk of [BT, V] logits fits one binding."""
    return row_chunks(gpu, BT, 4 * V, f"logits (V={V})")


def vocab_chunks(gpu: GPU, VP: int, C: int):
    """[(first row, rows)] of the [VP, C] token table, each within one binding (GPT-2's 50264 x 768
    floats are 154 MB, lavapipe binds 134 MB)."""
    return row_chunks(gpu, VP, 4 * C, f"the token embedding (d_model {C})")


HEAD_BLOCK_BYTES = 32 << 20    # the split head's dense scratch block: at most this, or 64 rows


def head_block_rows(VP: int, C: int, max_rows: int, max_binding: int | None) -> tuple[int, int]:
    """(rows per block, floats of the scratch) of the split head; (0, 0) when the table fits whole.
    Blocks of rows are multiples of 64 (aligned offsets), fewer only when max_rows is."""
    wide = rows_per_binding(VP, 4 * C, max_binding)      # the widest chunk of the token table
    if wide == VP:
        return 0, 0
    wide = max(wide, 64)                                   # under 64 rows: refused (vocab_chunks, the plan)
    rows_ = max(64, HEAD_BLOCK_BYTES // (4 * wide) // 64 * 64)
    rows_ = min(rows_, max_rows)
    return rows_, rows_ * wide


class Head:
    """The tied head: logits [n, VP] = x [n, C] @ tok_emb^T, and in the backward dtok_emb and dx.

    tok_emb is bound whole where it fits one binding. Where it does not, it is bound in chunks of
    rows (vocab_chunks); a chunk's logits are a column block of the logit rows, which the matmul
    kernels cannot address, so each block passes through a dense scratch (head.wgsl's copy_block),
    a block of rows at a time. The forward's logits are the same sums over the same K in the same
    order, bit for bit. The backward's sums over rows (dtok) and over the vocabulary (dx) are split
    into blocks and chunks added in turn, so their float32 rounding differs (tests/test_model.py
    bounds it)."""

    def __init__(self, gpu: GPU, plan: KernelPlan, tok: Tensor, C: int, max_rows: int, tok_h: Tensor | None = None):
        """tok_h: the table's bf16 copy [VP, C/2] (u32), which a bf16 model's head multiplies by:
        x is then bf16 too, and the backward's dlogits float32."""
        self.gpu, self.K, self.tok, self.C, self.tok_h = gpu, Launchers(plan), tok, C, tok_h
        self.VP = tok.shape[0]
        self.vchunks = vocab_chunks(gpu, self.VP, C)
        self.split = len(self.vchunks) > 1
        self.block, floats = head_block_rows(self.VP, C, max_rows, gpu.max_binding)
        # max_rows 0: the embedding only (a prefill without the head), no scratch
        self.scratch = gpu.tensor((floats,), name="head block") if floats and max_rows else None

    def _table(self, t: Tensor, v0: int, n: int) -> Tensor:
        return Tensor(t.buf, t.offset + 4 * v0 * t.shape[1], (n, t.shape[1]), t.dtype, t.name)

    def _blocks(self, n: int):
        """[(block index, first row, rows, vocab chunk index, first token, tokens, scratch)]"""
        out = []
        for b, s in enumerate(range(0, n, self.block)):
            nb = min(self.block, n - s)
            for j, (v0, nv) in enumerate(self.vchunks):
                blk = Tensor(self.scratch.buf, self.scratch.offset, (nb, nv), "f32", "head block")
                out.append((b, s, nb, j, v0, nv, blk))
        return out

    def forward(self, x: Tensor, logits: Tensor, n: int) -> list:
        g, K, VP, C = self.gpu, self.K, self.VP, self.C
        tok, abt = (self.tok_h, K.matmul_abt_bf16) if self.tok_h else (self.tok, K.matmul_abt)
        if not self.split:
            return [abt(g, x, tok, logits, n, VP, C)]
        ds = []
        for _, s, nb, _, v0, nv, blk in self._blocks(n):
            ds += [abt(g, rows(x, s, nb), self._table(tok, v0, nv), blk, nb, nv, C),
                   K.copy_block(g, blk, rows(logits, s, nb), nb, nv, nv, 0, VP, v0)]
        return ds

    def backward(self, dl: Tensor, x: Tensor, dtok: Tensor, dx: Tensor, n: int, accumulate: bool) -> list:
        """dl [n, VP] dlogits, x [n, C] the head's input -> dtok [VP, C] (added to where
        `accumulate`), dx [n, C] (written)."""
        g, K, VP, C = self.gpu, self.K, self.VP, self.C
        tok, atb, mm = (self.tok_h, K.matmul_atb_bf16, K.matmul_bf16) if self.tok_h else \
            (self.tok, K.matmul_atb, K.matmul)
        if not self.split:
            return [atb(g, dl, x, dtok, VP, C, n, accumulate=accumulate),
                    mm(g, dl, tok, None, dx, n, C, VP)]
        ds = []
        for b, s, nb, j, v0, nv, blk in self._blocks(n):
            ds += [K.copy_block(g, rows(dl, s, nb), blk, nb, nv, VP, v0, nv, 0),
                   atb(g, blk, rows(x, s, nb), self._table(dtok, v0, nv), nv, C, nb,
                       accumulate=accumulate or b > 0),
                   mm(g, blk, self._table(tok, v0, nv), None, rows(dx, s, nb), nb, C, nv,
                      accumulate=j > 0)]
        return ds

    def embed(self, tokens: Tensor, pos: Tensor, out: Tensor, B: int, T: int) -> list:
        """out [B*T, C] = tok_emb[tokens] + pos_emb, one dispatch per chunk of the table."""
        return [kernels.embed_forward(self.gpu, tokens, self._table(self.tok, v0, nv), pos, out, B, T, self.C, v0, nv)
                for v0, nv in self.vchunks]

    def embed_grad(self, buckets: Tensor, dout: Tensor, dtok: Tensor, B: int, T: int, V: int) -> list:
        """dtok [VP, C] += the embedding's gradient, rows of the first V tokens, chunk by chunk."""
        return [kernels.embed_tok_grad(self.gpu, buckets, dout, self._table(dtok, v0, min(nv, V - v0)), B, T,
                                       self.C, V, True, v0, min(nv, V - v0))
                for v0, nv in self.vchunks if v0 < V]


class Model:
    """A GPT of config `cfg` recorded for batches of [B, T] tokens.

    training=False records the forward only (evaluation and sampling); head=False (with it) stops
    the forward at the last block's output: a prefill, which needs each layer's keys and values.
    accum=N: a step takes N micro-batches of B windows, whose gradients add up (each scaled by
    1/(N*B*T), so the sum is the mean's) before one clipped AdamW update: the step of a batch N*B."""

    def __init__(self, gpu: GPU, cfg: Config, attention: str = "online", B: int | None = None,
                 T: int | None = None, training: bool = True, plan: KernelPlan | None = None, head: bool = True,
                 accum: int = 1, precision: str = "fp32"):
        assert head or not training, "training needs the head"
        assert precision in PRECISIONS, precision
        assert accum >= 1 and (accum == 1 or training)
        self.gpu, self.cfg, self.training, self.accum = gpu, cfg, training, accum
        self.plan = plan or make_plan(gpu)                                      # which kernel variants run
        K = Launchers(self.plan)
        B = self.B = B or cfg.batch
        T = self.T = T or cfg.ctx
        C, V, M, H = cfg.d_model, cfg.vocab, cfg.d_mlp, cfg.heads
        VP = self.VP = padded_vocab(V)                                          # logits row stride
        BT = B * T
        g = gpu
        g.check_loop(BT, "batch x ctx (rows reduced by the bias and LayerNorm gradients)")
        self.offsets, self.n_flat = layout(cfg)
        for name, (_, shape) in self.offsets.items():   # each parameter is bound whole by its kernels,
            if name != "tok_emb":                        # except tok_emb: Head binds it in chunks
                g.check_size(4 * int(np.prod(shape)), f"parameter {name} {list(shape)}")
        # bound only in chunks that fit (flat_chunks) or as the views of single tensors
        flat = lambda name: Tensor(g.buffer(4 * self.n_flat, name, binding=False), 0, (self.n_flat,), "f32", name)
        self.params = flat("params")
        self.P = {n: self._view(self.params, n) for n in self.offsets}
        self.P["tok_emb"] = Tensor(self.params.buf, self.P["tok_emb"].offset, (VP, C), "f32", "tok_emb")  # [VP, C]
        if training:
            self.grads, self.m, self.v = flat("grads"), flat("adam_m"), flat("adam_v")
            self.G = {n: self._view(self.grads, n) for n in self.offsets}
            self.G["tok_emb"] = Tensor(self.grads.buf, self.G["tok_emb"].offset, (VP, C), "f32", "d tok_emb")
        # the batch: tokens | targets | bucket offsets (V+1) | bucket positions, one upload per step
        self.batch_parts = [("tokens", BT), ("targets", BT), ("buckets", V + 1 + BT)]
        self.batch_offsets, n = {}, 0
        for name, size in self.batch_parts:
            self.batch_offsets[name] = n
            n = -(-(n + size) // 256) * 256
        self.batch = g.tensor((n,), "u32", "batch")
        bview = lambda name, size: Tensor(self.batch.buf, 4 * self.batch_offsets[name], (size,), "u32", name)
        tokens, targets = bview("tokens", BT), bview("targets", BT)
        buckets = bview("buckets", V + 1 + BT)

        act = lambda *shape, name="": g.tensor(shape, name=name)
        L = cfg.layers
        self.x = [act(BT, C, name=f"x{l}") for l in range(L + 1)]          # residual stream in/out
        self.x_mid = [act(BT, C, name=f"xmid{l}") for l in range(L)]
        self.precision = precision
        bf = precision == "bf16"
        if bf:
            problem = bf16_problem(self.plan, C, M)
            if problem:
                raise LimitError(problem)
        # fp32: every activation saved per layer. bf16: saved per layer as bf16 (self.half), which the
        # matmuls of both passes read as they are; q, k, v and the attention output also have one
        # float32 scratch each, shared by the layers (the lists below repeat it), for the attention
        # kernels that read float32 (the backward refills them from the bf16 copy).
        per_layer = (lambda make: [make() for _ in range(L)]) if not bf else (lambda make: [make()] * L)
        only_fp32 = (lambda make: [make() for _ in range(L)]) if not bf else (lambda make: [None] * L)
        self.ln1 = only_fp32(lambda: act(BT, C))
        self.ln1s = [act(2, BT) for _ in range(L)]                           # mean | rstd
        self.qkv = per_layer(lambda: [act(BT, C) for _ in range(3)])
        self.ctx = per_layer(lambda: act(BT, C))
        self.ln2 = only_fp32(lambda: act(BT, C))
        self.ln2s = [act(2, BT) for _ in range(L)]
        self.pre = only_fp32(lambda: act(BT, M))
        self.gel = only_fp32(lambda: act(BT, M))
        if bf:
            half = lambda n, name: g.tensor((n // 2,), "u32", name)
            self.half = [{k: half(BT * (M if k in ("pre", "gel") else C), f"{k}{l} bf16")
                          for k in ("ln1", "q", "k", "v", "ctx", "ln2", "pre", "gel")} for l in range(L)]
            # the weights' bf16 copy, in the flat layout at half the bytes (written after every update)
            self.params_h = Tensor(g.buffer(2 * self.n_flat, "params bf16", binding=False), 0, (self.n_flat // 2,),
                                   "u32", "params bf16")
            self._to_bf16 = [K.cast_bf16(g, flat_view(self.params, f0, k),
                                         Tensor(self.params_h.buf, 2 * f0, (k // 2,), "u32", "params bf16"), k)
                             for f0, k in flat_chunks(g, self.n_flat)]
        self.tmp = act(BT, C, name="branch_out")                               # branch output before the residual add
        # The logits may exceed one binding (a 50257-token vocabulary): they live in one
        # buffer and are bound in chunks of rows that each fit.
        self.chunks = logit_chunks(g, BT, VP) if head else []
        if head:
            # the final LayerNorm's output: the head's operand, bf16 in a bf16 model
            self.lnf = g.tensor((BT, C // 2), "u32", "lnf bf16") if bf else act(BT, C)
            self.lnfs = act(2, BT)
            g.check_size(4 * BT * VP, f"logits [B*T={BT}, V={VP}]", binding=len(self.chunks) == 1)
            self.logits = g.tensor((BT, VP), name="logits") if len(self.chunks) == 1 else \
                Tensor(g.buffer(4 * BT * VP, "logits", binding=False), 0, (BT, VP), "f32", "logits")  # becomes dlogits
            self.losses = act(BT, name="losses")
            self.loss_buf = act(LOSS_SLOT * accum, name="loss")                # one slot per micro-batch
        shared = {}
        self.att = [Attention(g, attention, B, T, C, H, shared, plan=self.plan) for _ in range(L)]

        tok_h = Tensor(self.params_h.buf, 2 * self.offsets["tok_emb"][0], (VP, C // 2), "u32", "tok_emb bf16") \
            if bf else None
        self.head = Head(g, self.plan, self.P["tok_emb"], C, max((n for _, n in self.chunks), default=0), tok_h)
        P = lambda l, n: self.P[f"h{l}.{n}"]
        fwd = self.head.embed(tokens, self.P["pos_emb"], self.x[0], B, T)
        for l in range(L):
            x, q, k, v = self.x[l], *self.qkv[l]
            if bf:   # matmul operands as bf16; q, k, v written as bf16 by their matmuls
                h, W = self.half[l], lambda n: self._half_view(f"h{l}.{n}")
                fwd.append(K.layernorm_forward_bf16(g, x, self._ln(l, 1), h["ln1"], self.ln1s[l], BT, C))
                direct = self.att[l].reads_bf16      # the attention reads the bf16 q, k, v itself
                for n, t in (("q", q), ("k", k), ("v", v)):
                    fwd.append(K.matmul_bf16(g, h["ln1"], W("W" + n), P(l, "b" + n), h[n], BT, C, C))
                    if not direct:                    # else it reads them back as float32
                        fwd.append(K.cast_f32(g, h[n], t, BT * C))
            else:
                fwd += [K.layernorm_forward(g, x, self._ln(l, 1), self.ln1[l], self.ln1s[l], BT, C),
                        K.matmul(g, self.ln1[l], P(l, "Wq"), P(l, "bq"), q, BT, C, C),
                        K.matmul(g, self.ln1[l], P(l, "Wk"), P(l, "bk"), k, BT, C, C),
                        K.matmul(g, self.ln1[l], P(l, "Wv"), P(l, "bv"), v, BT, C, C)]
            if bf and direct:
                fwd += self.att[l].forward(h["q"], h["k"], h["v"], self.ctx[l], bf16=True)
            else:
                fwd += self.att[l].forward(q, k, v, self.ctx[l])
            if bf:
                fwd += [K.cast_bf16(g, self.ctx[l], h["ctx"], BT * C),
                        K.matmul_bf16(g, h["ctx"], W("Wo"), P(l, "bo"), self.tmp, BT, C, C)]
            else:
                fwd.append(K.matmul(g, self.ctx[l], P(l, "Wo"), P(l, "bo"), self.tmp, BT, C, C))
            fwd.append(K.add(g, x, self.tmp, self.x_mid[l], BT * C))
            if bf:   # the pre-activation is written as bf16, and GELU reads and writes bf16
                fwd += [K.layernorm_forward_bf16(g, self.x_mid[l], self._ln(l, 2), h["ln2"], self.ln2s[l], BT, C),
                        K.matmul_bf16(g, h["ln2"], W("fc_in_W"), P(l, "fc_in_b"), h["pre"], BT, M, C),
                        K.gelu_forward_bf16(g, h["pre"], h["gel"], BT * M),
                        K.matmul_bf16(g, h["gel"], W("fc_out_W"), P(l, "fc_out_b"), self.tmp, BT, C, M)]
            else:
                fwd += [K.layernorm_forward(g, self.x_mid[l], self._ln(l, 2), self.ln2[l], self.ln2s[l], BT, C),
                        K.matmul(g, self.ln2[l], P(l, "fc_in_W"), P(l, "fc_in_b"), self.pre[l], BT, M, C),
                        K.gelu_forward(g, self.pre[l], self.gel[l], BT * M),
                        K.matmul(g, self.gel[l], P(l, "fc_out_W"), P(l, "fc_out_b"), self.tmp, BT, C, M)]
            fwd.append(K.add(g, self.x_mid[l], self.tmp, self.x[l + 1], BT * C))
        if head:
            ln_f = K.layernorm_forward_bf16 if bf else K.layernorm_forward
            fwd.append(ln_f(g, self.x[L], self._ln(None), self.lnf, self.lnfs, BT, C))
        for r0, n in self.chunks:
            fwd += self.head.forward(rows(self.lnf, r0, n), rows(self.logits, r0, n), n)
        # The dispatch lists are the model's own: callers use step / mean_loss / logits_of /
        # dispatch_groups, so no caller can run part of a list (reading losses of rows whose
        # chunk of cross-entropy never ran, as evaluation once did with split logits).
        self._fwd = fwd
        # dlogits carry 1/(accum*B*T): the micro-batches' gradients add up to the mean's
        ce = lambda grad: [K.cross_entropy(g, targets, rows(self.logits, r0, n), self.losses, n, V, 1.0 / (accum * BT),
                                           grad, r0, VP) for r0, n in self.chunks]
        slot = lambda i: Tensor(self.loss_buf.buf, 4 * LOSS_SLOT * i, (LOSS_SLOT,), "f32", f"loss{i}")
        self._reduce = [K.loss_reduce(g, self.losses, slot(i), BT, 1.0 / BT) for i in range(accum)] if head else []
        self._loss = ce(training) + self._reduce[:1] if head else []
        self._eval_rows = ce(False)                      # per-row losses of every chunk, no gradient
        self._bwd, self._opt, self._bwd_more = [], [], []
        if training:
            self._bwd = self._record_backward(buckets, self.grads, self.G)
            self._opt = self._record_optimizer()
        if accum > 1:   # later micro-batches: the backward into a second buffer, added to the first
            self.grads_micro = flat("grads_micro")
            Gm = {n: self._view(self.grads_micro, n) for n in self.offsets}
            Gm["tok_emb"] = Tensor(self.grads_micro.buf, Gm["tok_emb"].offset, (VP, C), "f32", "d tok_emb (micro)")
            self._bwd_more = (self._record_backward(buckets, self.grads_micro, Gm)
                              + [K.accumulate(g, flat_view(self.grads_micro, f0, k), flat_view(self.grads, f0, k), k)
                                 for f0, k in self.flat_chunks])
        self.step_count = 0

    # ---- layout helpers ---------------------------------------------------------------------
    def _view(self, flat: Tensor, name: str) -> Tensor:
        off, shape = self.offsets[name]
        return Tensor(flat.buf, 4 * off, shape, "f32", name)

    def _half_view(self, name: str) -> Tensor:
        """A weight's bf16 copy [rows, cols/2] (u32) in params_h."""
        off, shape = self.offsets[name]
        return Tensor(self.params_h.buf, 2 * off, (shape[0], int(np.prod(shape[1:])) // 2), "u32", name + " bf16")

    def _ln(self, l, which=1, flat=None):
        """[g | b] of a LayerNorm as one [2, C] tensor."""
        name = "ln_f_g" if l is None else f"h{l}.ln{which}_g"
        off, _ = self.offsets[name]
        return Tensor((flat or self.params).buf, 4 * off, (2, self.cfg.d_model), "f32", name)

    # ---- backward ----------------------------------------------------------------------------
    def _record_backward(self, buckets, grads: Tensor, Gd: dict):
        """The backward writing every gradient into `grads` (views `Gd`)."""
        g, cfg, K = self.gpu, self.cfg, Launchers(self.plan)
        B, T, C, V, M, L = self.B, self.T, cfg.d_model, cfg.vocab, cfg.d_mlp, cfg.layers
        VP = self.VP
        BT = B * T
        act = lambda *shape: g.tensor(shape)
        if not hasattr(self, "dres"):                                  # shared by both recordings
            self.dres, self.dln = act(BT, C), act(BT, C)              # residual grad, grad at a LN output
            self.dact, self.dpre = act(BT, M), act(BT, M)
            self.dctx = act(BT, C)
            self.dqkv = [act(BT, C) for _ in range(3)]
        P = lambda l, n: self.P[f"h{l}.{n}"]
        G = lambda l, n: Gd[f"h{l}.{n}"]
        ds = []
        for i, (r0, n) in enumerate(self.chunks):                       # logits hold dlogits after cross_entropy
            ds += self.head.backward(rows(self.logits, r0, n), rows(self.lnf, r0, n), Gd["tok_emb"],
                                     rows(self.dln, r0, n), n, accumulate=i > 0)
        ds += [K.layernorm_dgb(g, self.dln, self.x[L], self.lnfs, self._ln(None, flat=grads), BT, C),
              K.layernorm_dx(g, self.dln, self.x[L], self.P["ln_f_g"], self.lnfs, self.dres, BT, C, accumulate=False)]
        bf = self.precision == "bf16"
        for l in reversed(range(L)):
            q, k, v = self.qkv[l]
            dq, dk, dv = self.dqkv
            direct = bf and self.att[l].reads_bf16
            if bf:   # the matmuls read the saved bf16 activations and the weights' bf16 copy; the
                # gradients stay float32. The attention's float32 inputs are refilled from bf16.
                h, W = self.half[l], lambda n: self._half_view(f"h{l}.{n}")
                back = [("ctx", self.ctx[l])] + ([] if direct else [("q", q), ("k", k), ("v", v)])
                ds += [K.cast_f32(g, h[n], t, t.size) for n, t in back]
                atb, abt = K.matmul_atb_bf16, K.matmul_abt_bf16
                X = lambda n: h[n]
            else:
                atb, abt = K.matmul_atb, K.matmul_abt
                X = {"gel": self.gel[l], "ln2": self.ln2[l], "ctx": self.ctx[l], "ln1": self.ln1[l]}.get
                W = lambda n: P(l, n)
            ds += [atb(g, X("gel"), self.dres, G(l, "fc_out_W"), M, C, BT),
                   K.bias_grad(g, self.dres, G(l, "fc_out_b"), BT, C),
                   abt(g, self.dres, W("fc_out_W"), self.dact, BT, M, C),
                   K.gelu_backward_bf16(g, self.half[l]["pre"], self.dact, self.dpre, BT * M) if bf else
                   K.gelu_backward(g, self.pre[l], self.dact, self.dpre, BT * M),
                   atb(g, X("ln2"), self.dpre, G(l, "fc_in_W"), C, M, BT),
                   K.bias_grad(g, self.dpre, G(l, "fc_in_b"), BT, M),
                   abt(g, self.dpre, W("fc_in_W"), self.dln, BT, C, M),
                   K.layernorm_dgb(g, self.dln, self.x_mid[l], self.ln2s[l], self._ln(l, 2, grads), BT, C),
                   K.layernorm_dx(g, self.dln, self.x_mid[l], P(l, "ln2_g"), self.ln2s[l], self.dres, BT, C),
                   atb(g, X("ctx"), self.dres, G(l, "Wo"), C, C, BT),
                   K.bias_grad(g, self.dres, G(l, "bo"), BT, C),
                   abt(g, self.dres, W("Wo"), self.dctx, BT, C, C)]
            if direct:
                ds += self.att[l].backward(h["q"], h["k"], h["v"], self.ctx[l], self.dctx, dq, dk, dv, bf16=True)
            else:
                ds += self.att[l].backward(q, k, v, self.ctx[l], self.dctx, dq, dk, dv)
            for i, (n, d) in enumerate((("q", dq), ("k", dk), ("v", dv))):
                ds += [abt(g, d, W("W" + n), self.dln, BT, C, C, accumulate=i > 0),
                       atb(g, X("ln1"), d, G(l, "W" + n), C, C, BT),
                       K.bias_grad(g, d, G(l, "b" + n), BT, C)]
            ds += [K.layernorm_dgb(g, self.dln, self.x[l], self.ln1s[l], self._ln(l, 1, grads), BT, C),
                   K.layernorm_dx(g, self.dln, self.x[l], P(l, "ln1_g"), self.ln1s[l], self.dres, BT, C)]
        ds += self.head.embed_grad(buckets, self.dres, Gd["tok_emb"], B, T, V)
        ds.append(K.embed_pos_grad(g, self.dres, Gd["pos_emb"], B, T, C))
        return ds

    # ---- optimizer ---------------------------------------------------------------------------
    def _record_optimizer(self):
        g, cfg, K = self.gpu, self.cfg, Launchers(self.plan)
        n = self.n_flat
        wd = np.zeros(n // 256, np.float32)
        for name, shape, decayed in param_specs(cfg):
            if decayed:
                off = self.offsets[name][0]
                wd[off // 256: -(-(off + int(np.prod(shape))) // 256)] = cfg.weight_decay
        self.wd_table = g.upload(wd, "wd_table")
        n_part = -(-n // kernels.CHUNK)
        self.partials = g.tensor((n_part,), name="grad_partials")
        self.stats = g.tensor((4,), name="grad_stats")                                   # norm, scale
        clip = cfg.grad_clip if cfg.grad_clip > 0 else kernels.NO_CLIP                   # 0: never clip
        # The flat buffers are bound a chunk at a time where they exceed one binding (each chunk
        # its own step uniform, which holds its length); the chunks start on whole blocks of the
        # norm's partial sums, so the norm and the update are those of one dispatch, bit for bit.
        self.flat_chunks = flat_chunks(g, n)
        self.step_uniforms = [g.uniform(32) for _ in self.flat_chunks]
        ds = [K.grad_sumsq(g, flat_view(self.grads, f0, k), flat_view(self.partials, f0 // kernels.CHUNK,
                                                                    -(-k // kernels.CHUNK)), k)
              for f0, k in self.flat_chunks]
        ds.append(K.grad_clip(g, self.partials, self.stats, n_part, clip))
        for (f0, k), u in zip(self.flat_chunks, self.step_uniforms):
            ds.append(K.adamw(g, flat_view(self.grads, f0, k), flat_view(self.wd_table, f0 // 256, k // 256),
                              self.stats, flat_view(self.params, f0, k), flat_view(self.m, f0, k),
                              flat_view(self.v, f0, k), k, u))
        return ds + (self._to_bf16 if self.precision == "bf16" else [])   # the copy the next step reads

    # ---- state in and out ------------------------------------------------------------------------
    def _pack(self, tensors: dict) -> np.ndarray:
        flat = np.zeros(self.n_flat, np.float32)
        for name, (off, shape) in self.offsets.items():
            a = np.asarray(tensors[name], np.float32)
            if a.shape != tuple(shape):
                raise ValueError(f"{name}: shape {a.shape}, expected {tuple(shape)}")
            flat[off:off + a.size] = a.reshape(-1)
        return flat

    def _unpack(self, flat: np.ndarray) -> dict:
        return {n: flat[o:o + int(np.prod(s))].reshape(s).copy() for n, (o, s) in self.offsets.items()}

    def set_params(self, params: dict):
        self.gpu.write(self.params, self._pack(params))
        if self.precision == "bf16":
            self.gpu.run(self._to_bf16)

    def get_params(self) -> dict:
        return self._unpack(self.gpu.read(self.params))

    def get_grads(self) -> dict:
        return self._unpack(self.gpu.read(self.grads))

    def set_opt_state(self, m: dict, v: dict, step: int):
        self.gpu.write(self.m, self._pack(m))
        self.gpu.write(self.v, self._pack(v))
        self.step_count = int(step)

    def get_opt_state(self):
        return self._unpack(self.gpu.read(self.m)), self._unpack(self.gpu.read(self.v)), self.step_count

    # ---- running -----------------------------------------------------------------------------
    def write_batch(self, x: np.ndarray, y: np.ndarray | None = None):
        """x, y [B, T] token ids -> the batch buffer, in one write."""
        BT, V = self.B * self.T, self.cfg.vocab
        x = np.asarray(x).reshape(-1)
        data = np.zeros(self.batch.size, np.uint32)
        data[self.batch_offsets["tokens"]:][:BT] = x
        if y is not None:
            data[self.batch_offsets["targets"]:][:BT] = np.asarray(y).reshape(-1)
        if self.training:
            offsets, positions = token_buckets(x, V)
            b0 = self.batch_offsets["buckets"]
            data[b0:b0 + V + 1] = offsets
            data[b0 + V + 1:b0 + V + 1 + BT] = positions
        self.gpu.write(self.batch, data)

    def step(self, x, y, lr: float):
        """One training step: forward, loss, backward, clip, AdamW; one submit (one per micro-batch
        with accum), no readback. x, y [accum*B, T]."""
        self.step_count += 1
        t = self.step_count
        for (_, k), u in zip(self.flat_chunks, self.step_uniforms):
            self.gpu.queue.write_buffer(u, 0, kernels.adamw_uniform(k, self.cfg.grad_clip, lr, t))
        self._micro_batches(x, y, self._opt)

    def grads_only(self, x, y):
        """Forward, loss and backward without the update (tests compare gradients)."""
        self._micro_batches(x, y, [])

    def _micro_batches(self, x, y, then):
        x, y, B = np.asarray(x), np.asarray(y), self.B
        for i in range(self.accum):
            self.write_batch(x[i * B:(i + 1) * B], y[i * B:(i + 1) * B])
            bwd = self._bwd if i == 0 else self._bwd_more
            self.gpu.run(self._fwd + self._loss[:-1] + self._reduce[i:i + 1] + bwd
                         + (then if i == self.accum - 1 else []))

    def dispatch_groups(self):
        """[(group, dispatch)] of one training step in order (the profiler times each)."""
        return ([("forward", d) for d in self._fwd + self._loss] + [("backward", d) for d in self._bwd]
                + [("optimizer", d) for d in self._opt])

    def row_losses(self, x, y, rows: int | None = None) -> np.ndarray:
        """The next-token loss of each of the first `rows` of B*T positions (all by default):
        forward, then cross-entropy over every chunk of logits, no gradient, no update."""
        self.write_batch(x, y)
        self.gpu.run(self._fwd + self._eval_rows)
        return self.gpu.read(self.losses, count=rows or self.B * self.T)

    def mean_loss(self, xs: np.ndarray, ys: np.ndarray) -> float:
        """Mean next-token loss over N windows [N, T], B at a time (float64 sum); the last batch
        is padded with copies of its first window, whose rows are not read."""
        B, T, n = self.B, self.T, len(xs)
        if n == 0:
            raise ValueError("no windows to evaluate")
        total = 0.0
        for i in range(0, n, B):
            x, y = xs[i:i + B], ys[i:i + B]
            k = len(x)
            if k < B:
                x = np.concatenate([x, np.repeat(x[:1], B - k, 0)])
                y = np.concatenate([y, np.repeat(y[:1], B - k, 0)])
            total += self.row_losses(x, y, k * T).astype(np.float64).sum()
        return total / (n * T)

    def evaluate(self, x, y) -> float:
        """Mean loss of one batch [B, T]."""
        return self.mean_loss(np.asarray(x), np.asarray(y))

    def forward(self, x, then=()):
        """The forward alone, then `then` in the same submission; its activations (and the naive
        path's attention weights) are then readable."""
        self.write_batch(x)
        self.gpu.run(self._fwd + list(then))

    def logits_of(self, x) -> np.ndarray:
        self.forward(x)
        return self.gpu.read(self.logits)[:, :self.cfg.vocab].reshape(self.B, self.T, -1)

    def logits_row(self, x, row: int) -> np.ndarray:
        """Forward, then read one position's logits only (sampling)."""
        self.write_batch(x)
        self.gpu.run(self._fwd)
        return self.gpu.read(self.logits, count=self.cfg.vocab, offset_elems=row * self.VP)

    def loss(self) -> float:
        """The last step's mean loss (over its micro-batches)."""
        slots = self.gpu.read(self.loss_buf, count=LOSS_SLOT * (self.accum - 1) + 1)[::LOSS_SLOT]
        return float(slots.astype(np.float64).mean()) if self.accum > 1 else float(slots[0])

    def grad_norm(self) -> float:
        return float(self.gpu.read(self.stats, count=1)[0])
