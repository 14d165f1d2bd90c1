"""The GPT on the device: its buffers (from the table in model.buffers), and the recorded forward,
backward and optimizer step.

Everything is allocated and bound once in __init__; `step` uploads the batch (one write), encodes
the recorded dispatches into one command buffer, submits once, and reads nothing back. `loss()`
reads the loss when it is shown. The flat parameter layout is model.layout's.
"""
from __future__ import annotations

import numpy as np

from ..core.config import Config
from ..core.errors import UsageError
from ..core.lora import LoRA, trainable_specs
from ..core.optim import OptimizerSettings, make_settings
from ..core.init import token_buckets
from ..core.precision import FP32, Precision
from ..device import gate
from ..device.gpu import GPU, PER_WORD, Tensor
from ..device.kernels import LOSS_SCALE, Kernels
from ..device.plan import KernelPlan
from . import buffers
from . import attention as attn
from .block import MATRICES, VECTORS, BlockActs, BlockGrads, BlockLoRA, BlockWeights, PolicyKernels, \
    block_backward, block_forward
from .head import Head
from .layout import LOSS_SLOT, batch_layout, flat_chunks, flat_view, logit_chunks, padded_vocab, param_layout, rows
from .optim import Flat, Gate, make_optimizer


def precision_problem(gpu: GPU, policy: Precision) -> str | None:
    """Why this device cannot run a precision's kernels (a feature it lacks), or None."""
    if policy.feature and policy.feature not in gpu.features:
        return (f"{{opt:precision}} {policy.name} needs the WebGPU feature {policy.feature}, which {gpu.name} "
                f"({gpu.backend}, {gpu.engine_label}) does not offer; use {{opt:precision}} bf16 or fp32")
    return None


class Model:
    """A GPT of config `cfg` recorded for batches of [B, T] tokens, on `gpu` under the kernel plan
    `plan` and the precision policy `precision`.

    training=False records the forward only (evaluation and sampling); head=False (with it) stops
    the forward at the last block's output: a prefill, which needs each layer's keys and values.
    accum=N: a step takes N micro-batches of B windows, whose gradients add up (each scaled by
    1/(N*B*T), so the sum is the mean's) before one clipped update: the step of a batch N*B.
    optimizer (training): its settings (core.optim; None: AdamW's), from which model.optim makes
    the optimizer that updates the flat buffers after the gate (the clip, and the loss scaler).
    loss_scale: the first scale of a precision with a loss scaler (core.precision: f16), kept and
    changed on the device from then on (gate_state, set_gate). lora (training only): adapters
    beside the targeted matrices (core.lora); the base model is frozen in a buffer of its own, and
    the flat parameter, gradient and optimizer-state buffers hold the trainable parameters alone."""

    def __init__(self, gpu: GPU, plan: KernelPlan, cfg: Config, attention=attn.DEFAULT, B: int | None = None,
                 T: int | None = None, training: bool = True, head: bool = True, accum: int = 1,
                 precision: Precision = FP32, loss_scale: float = LOSS_SCALE, recompute: bool = False,
                 lora: LoRA | None = None, optimizer: OptimizerSettings | None = None):
        assert head or not training, "training needs the head"
        assert lora is None or training, "an adapted model trains; evaluation and sampling take it merged"
        assert accum >= 1 and (accum == 1 or training)
        self.gpu, self.plan, self.cfg, self.precision, self.lora = gpu, plan, cfg, precision, lora
        self.training, self.accum, self.attention = training, accum, attn.path(attention)
        self.recompute = recompute and training      # one set of block activations, rebuilt in the backward
        self.scaled = training and precision.loss_scaling
        self.optimizer = make_optimizer(optimizer or make_settings("adamw")) if training else None
        self.kn = Kernels(gpu, plan)
        self.pk = PolicyKernels(self.kn, precision, cfg.activation)
        self.B, self.T = B or cfg.batch, T or cfg.ctx
        self.VP = padded_vocab(cfg.vocab)                                       # logits row stride
        self.specs = trainable_specs(cfg, lora)                                  # what the optimizer updates
        self.offsets, self.n_flat = param_layout(cfg, self.specs)
        self.base_offsets = param_layout(cfg)[0] if lora else None               # a LoRA run's frozen model
        self._check_fits()
        self.chunks = logit_chunks(self.B * self.T, self.VP, gpu.max_binding) if head else []
        align = int(gpu.limits.get("min-storage-buffer-offset-alignment", 256))
        self.flat_chunks = flat_chunks(self.n_flat, gpu.max_binding, align)
        self.base_chunks = flat_chunks(param_layout(cfg)[1], gpu.max_binding, align) if lora else []
        self.buf = self._allocate(head)
        self._views()
        self._copy_weights = self._record_weight_copy()
        self._copy_base = self._record_weight_copy("base")      # a LoRA run's frozen copy: made once, when set
        if self.scaled:
            self.set_gate(scale=loss_scale, clean=0, skipped=0, taken=0)
        self.att = [self._attention(l) for l in range(cfg.layers)]
        self.head = Head(self.kn, self.pk, self.P["tok_emb"], self.read["tok_emb"], cfg.d_model,
                         max((n for _, n in self.chunks), default=0), self.buf.get("head block"))
        self._fwd = self._record_forward()
        self._record_loss(head)
        self._bwd, self._bwd_more, self._opt = [], [], []
        if training:
            self._bwd = self._record_backward(self.G)
            self._opt = self._record_optimizer()
        if accum > 1:   # later micro-batches: the backward into a second buffer, added to the first
            self._bwd_more = self._record_backward(self.G_micro) + [
                self.kn.accumulate(flat_view(self.buf["grads micro"], f0, k), flat_view(self.grads, f0, k), k)
                for f0, k in self.flat_chunks]
        if precision.feature:       # a precision WGSL has as an option: its kernels judged on this device first
            gate.check(gpu, plan, gate.half_kernels(self._fwd + self._loss + self._eval_rows + self._bwd
                                                    + self._bwd_more + self._opt + self._copy_weights
                                                    + self._copy_base), precision.name)
        self.step_count = 0
        self.moments_from = 0       # the step the optimizer's state started from (zero state then)

    # ---- building ----------------------------------------------------------------------------------
    def _check_fits(self):
        """What the kernels cannot take, refused before anything is allocated."""
        cfg, g = self.cfg, self.gpu
        problem = self.precision.problem(cfg.d_model, cfg.d_mlp) or precision_problem(g, self.precision)
        if problem:                                      # a usage error: the width or precision option
            raise UsageError(problem)
        g.check_loop(self.B * self.T, "batch x ctx (rows reduced by the bias and LayerNorm gradients)")
        self.attention.check(self.T, cfg.d_model, cfg.heads)
        self.attention.check_fits(self.B, self.T, g.max_binding)
        lo = self.lora
        if lo and self.precision.width_multiple > 1 and lo.rank % self.precision.width_multiple:
            raise UsageError(f"{{opt:lora}} {lo.rank}: {{opt:precision}} {self.precision.name} needs a rank that is a "
                             f"multiple of {self.precision.width_multiple} (its kernels' width)")
        for name, (_, shape) in {**(self.base_offsets or {}), **self.offsets}.items():   # each parameter is bound
            if name != "tok_emb":                        # whole by its kernels, except tok_emb: Head binds it in chunks
                g.check_size(4 * int(np.prod(shape)), f"parameter {name} {list(shape)}")

    def _allocate(self, head: bool) -> dict:
        """This model's rows of the buffer table (self.planned, one entry a buffer), allocated."""
        self.planned, self.size = buffers.model_rows(self.cfg, self.B, self.T, self.attention, self.plan,
                                                     self.precision, self.gpu.max_binding, training=self.training,
                                                     head=head, accum=self.accum, recompute=self.recompute,
                                                     lora=self.lora, optimizer=self.optimizer)
        return buffers.allocate(self.gpu, self.planned, self.size, {"logits": len(self.chunks)})

    def _views(self):
        """Names for the buffers, and views of every parameter in the flat ones."""
        b = self.buf
        self.params, self.batch = b["params"], b["batch"]
        self.grads = b.get("grads")
        self.logits, self.losses, self.loss_buf = b.get("logits"), b.get("losses"), b.get("loss slots")
        self.gate = b.get("gate")                                # model.optim.Gate's: the clip, the loss scaler
        self.residuals = b["x"]                                  # the stream into each block, and out of the last
        self.batch_parts = batch_layout(self.B * self.T, self.cfg.vocab)[0]
        # every parameter where it lives: the trainable ones in params, a LoRA run's frozen rest in base
        frozen = lambda key: self._param_views(b[key], self.base_offsets) if self.lora else {}
        self.P = {**frozen("base"), **self._param_views(self.params)}
        # each weight as the matmuls read it: the policy's copy, or the float32 master itself
        copy = "params copy" in b
        self.read = {**frozen("base copy"), **self._param_views(b["params copy"])} if copy else self.P
        self.G = self._param_views(self.grads) if self.grads is not None else None
        self.G_micro = self._param_views(b["grads micro"]) if "grads micro" in b else None

    def _param_views(self, flat: Tensor, offsets: dict | None = None) -> dict:
        """name -> a view of that parameter in a flat buffer of the layout `offsets` (the
        trainable one by default; tok_emb [VP, C], its padded rows included), and "ln_f",
        "hL.ln1", "hL.ln2" -> the LayerNorm's [g | b] as one [2, C] where the layout holds it."""
        per_word = PER_WORD[flat.dtype]                         # a bf16 flat buffer packs two a word
        offsets = self.offsets if offsets is None else offsets
        out = {}
        for name, (off, shape) in offsets.items():
            if name == "tok_emb":
                shape = (self.VP, shape[1])
            words = shape[:-1] + (shape[-1] // per_word,)
            out[name] = Tensor(flat.buf, 4 * off // per_word, words, flat.dtype, name)
        C = self.cfg.d_model
        for ln, gain in [("ln_f", "ln_f_g")] + [(f"h{l}.ln{i}", f"h{l}.ln{i}_g") for l in range(self.cfg.layers)
                                               for i in (1, 2)]:
            if gain in offsets:
                out[ln] = Tensor(flat.buf, 4 * offsets[gain][0] // per_word, (2, C // per_word), flat.dtype, ln)
        return out

    def _attention(self, l: int) -> attn.Attention:
        cfg, a = self.cfg, self.attention
        return a.bind(self.kn, self.B, self.T, cfg.d_model, cfg.heads, a.scratch(self.buf, self.size, l),
                      cfg.attn_window)

    def weights(self, l: int) -> BlockWeights:
        """Block l's weights as its kernels read them."""
        p = lambda n: f"h{l}.{n}"
        return BlockWeights({n: self.read[p(n)] for n in MATRICES}, {n: self.P[p(n)] for n in VECTORS},
                            self.P[p("ln1")], self.P[p("ln2")], self.P[p("ln1_g")], self.P[p("ln2_g")])

    def adapters(self, l: int, G: dict | None) -> BlockLoRA | None:
        """Block l's adapters (None without LoRA): A and B as the matmuls read them, the saved
        s (x A^T) of each target, and where their gradients go in G."""
        lo, b = self.lora, self.buf
        if lo is None:
            return None
        BT, R = self.B * self.T, lo.rank
        stride = buffers.lora_block(BT, R)
        keys = {W: (f"h{l}.{W}.lora_A", f"h{l}.{W}.lora_B") for W in lo.targets}
        hs = {W: Tensor(b["lora hs"][l].buf, b["lora hs"][l].offset + 4 * i * stride, (BT, R), "f32", f"lora hs {W}")
              for i, W in enumerate(lo.targets)}
        pick = lambda d, j: {W: d[k[j]] for W, k in keys.items()} if d is not None else {}
        return BlockLoRA(R, lo.scale, pick(self.read, 0), pick(self.read, 1), hs, pick(G, 0), pick(G, 1),
                         b["lora h"], b["lora gs"], b.get("lora y"))

    def acts(self, l: int) -> BlockActs:
        """Block l's saved activations; q, k, v and ctx as the attention reads and writes them."""
        b = self.buf
        q, k, v, ctx = b["q"][l], b["k"][l], b["v"][l], b["ctx"][l]
        return BlockActs(b["x"][l], b["x mid"][l], b["x"][l + 1], b["ln1"][l], b["ln1 stats"][l], (q, k, v), ctx,
                         b["ln2"][l], b["ln2 stats"][l], b["pre"][l], b["gel"][l], b["branch out"],
                         (b.get("q f32", q), b.get("k f32", k), b.get("v f32", v)), b.get("ctx f32", ctx))

    def _batch_view(self, part: str) -> Tensor:
        w0, n = self.batch_parts[part]
        return Tensor(self.batch.buf, 4 * w0, (n,), "u32", part)

    # ---- recording ---------------------------------------------------------------------------------
    def _record_forward(self) -> list:
        cfg, B, T, BT = self.cfg, self.B, self.T, self.B * self.T
        C, M, L = cfg.d_model, cfg.d_mlp, cfg.layers
        fwd = self.head.embed(self._batch_view("tokens"), self.P["pos_emb"], self.residuals[0], B, T)
        for l in range(L):
            fwd += block_forward(self.kn, self.pk, self.weights(l), self.acts(l), self.att[l].forward, BT, C, M,
                                 self.adapters(l, None))
        if self.chunks:
            lnf = self.buf["lnf"]
            fwd.append(self.pk.layernorm(self.residuals[L], self.P["ln_f"], lnf, self.buf["lnf stats"], BT, C))
            for r0, n in self.chunks:
                fwd += self.head.forward(rows(lnf, r0, n), rows(self.logits, r0, n), n)
        return fwd

    def _record_loss(self, head: bool):
        """The loss of a step (cross-entropy writing dlogits over the logits, then the mean into the
        micro-batch's slot), and the per-row losses without a gradient (evaluation). The dispatch
        lists are the model's own: callers use step / mean_loss / logits_of / dispatch_groups, so no
        caller can run part of a list."""
        kn, V, BT, accum = self.kn, self.cfg.vocab, self.B * self.T, self.accum
        targets = self._batch_view("targets")
        # dlogits carry 1/(accum*B*T): the micro-batches' gradients add up to the mean's
        # and, under a loss scaler, its scale (from the device: the gate changes it there)
        scaler = self.gate if self.scaled else None
        ce = lambda grad: [kn.cross_entropy(targets, rows(self.logits, r0, n), self.losses, n, V, 1.0 / (accum * BT),
                                            grad, r0, self.VP, scaler=scaler if grad else None) for r0, n in self.chunks]
        slot = lambda i: Tensor(self.loss_buf.buf, 4 * LOSS_SLOT * i, (LOSS_SLOT,), "f32", f"loss{i}")
        self._reduce = [kn.loss_reduce(self.losses, slot(i), BT, 1.0 / BT) for i in range(accum)] if head else []
        self._loss = ce(self.training) + self._reduce[:1] if head else []
        self._eval_rows = ce(False)

    def _record_backward(self, Gd: dict) -> list:
        """The backward writing every gradient into the flat buffer of the views Gd."""
        kn, pk, cfg, b = self.kn, self.pk, self.cfg, self.buf
        B, T, C, V, M, L = self.B, self.T, cfg.d_model, cfg.vocab, cfg.d_mlp, cfg.layers
        BT, lnf, x_last = B * T, b["lnf"], self.residuals[L]
        dres, dln = b["d residual"], b["d ln"]
        ds = []
        for i, (r0, n) in enumerate(self.chunks):                    # logits hold dlogits after cross_entropy
            ds += self.head.backward(rows(self.logits, r0, n), rows(lnf, r0, n), Gd.get("tok_emb"), rows(dln, r0, n),
                                     n, accumulate=i > 0)
        if "ln_f" in Gd:                # a parameter without a gradient view is frozen (LoRA)
            ds.append(kn.layernorm_dgb(dln, x_last, b["lnf stats"], Gd["ln_f"], BT, C))
        ds.append(kn.layernorm_dx(dln, x_last, self.P["ln_f_g"], b["lnf stats"], dres, BT, C, accumulate=False))
        for l in reversed(range(L)):
            G = {n: Gd[f"h{l}.{n}"] for n in MATRICES + VECTORS + ("ln1", "ln2") if f"h{l}.{n}" in Gd}
            grads = BlockGrads(G, dres, dln, b["d act"], b["d pre"], b["d ctx"], (b["dq"], b["dk"], b["dv"]))
            if self.recompute and l < L - 1:    # the top block's are still those of the forward
                ds += block_forward(kn, pk, self.weights(l), self.acts(l), self.att[l].forward, BT, C, M,
                                    self.adapters(l, None))
            ds += block_backward(kn, pk, self.weights(l), self.acts(l), grads, self.att[l], BT, C, M,
                                 self.adapters(l, Gd))
        if "tok_emb" in Gd:
            ds += self.head.embed_grad(self._batch_view("buckets"), dres, Gd["tok_emb"], B, T, V)
            ds.append(kn.embed_pos_grad(dres, Gd["pos_emb"], B, T, C))
        return ds

    def _record_optimizer(self) -> list:
        """The gate (the global norm, the clip and the loss scaler), the optimizer's update, then
        the weights' copy the next step reads. The flat buffers are bound a chunk at a time where
        they exceed one binding; the partial sums and the decay table are bound whole (small: one
        float per 4,096 and per 256), each chunk's place in them passed as an index."""
        flat = Flat(self.gpu, self.kn, self.params, self.grads, self.gate, self.buf, self.flat_chunks, self.n_flat,
                    self.specs, self.offsets, self._param_views)
        gate = Gate(self.cfg.grad_clip, self.scaled)
        return gate.record(flat, self.buf["norm partials"]) + self.optimizer.record(flat) + self._copy_weights

    def _record_weight_copy(self, src: str = "params") -> list:
        """The policy's weight copy refreshed from the float32 weights, chunk by chunk (nothing
        where the matmuls read the float32 weights themselves). src: "params" (after every
        update), or a LoRA run's frozen "base" (once, when it is set)."""
        copy = self.buf.get(src + " copy")
        if copy is None:
            return []
        per_word, flat = PER_WORD[copy.dtype], self.buf[src]
        return [d for f0, k in (self.flat_chunks if src == "params" else self.base_chunks)
                for d in self.pk.convert(flat_view(flat, f0, k),
                                         Tensor(copy.buf, 4 * f0 // per_word, (k // per_word,), copy.dtype, src + " copy"),
                                         k)]

    # ---- state in and out ------------------------------------------------------------------------
    def _pack(self, tensors: dict, into: str = "params") -> np.ndarray:
        """The flat buffer `into` ("params", or a LoRA run's "base") of the named tensors."""
        offsets = self.base_offsets if into == "base" else self.offsets
        flat = np.zeros(self.buf[into].size, np.float32)
        for name, (off, shape) in offsets.items():
            a = np.asarray(tensors[name], np.float32)
            if a.shape != tuple(shape):
                raise ValueError(f"{name}: shape {a.shape}, expected {tuple(shape)}")
            flat[off:off + a.size] = a.reshape(-1)
        return flat

    def _unpack(self, flat: np.ndarray, offsets: dict | None = None) -> dict:
        return {n: flat[o:o + int(np.prod(s))].reshape(s).copy()
                for n, (o, s) in (self.offsets if offsets is None else offsets).items()}

    def set_params(self, params: dict):
        """Every parameter (a LoRA run's: the base model's and the adapters')."""
        if self.lora:
            self.gpu.write(self.buf["base"], self._pack(params, "base"))
            if self._copy_base:
                self.gpu.run(self._copy_base)
        self.gpu.write(self.params, self._pack(params))
        if self._copy_weights:
            self.gpu.run(self._copy_weights)

    def get_params(self) -> dict:
        """Every parameter, as set_params takes them (the trainable ones where they live)."""
        base = self._unpack(self.gpu.read(self.buf["base"]), self.base_offsets) if self.lora else {}
        return {**base, **self._unpack(self.gpu.read(self.params))}

    def get_grads(self) -> dict:
        return self._unpack(self.gpu.read(self.grads))

    def set_opt_state(self, state: dict, steps: int):
        """The optimizer's state ({row: {parameter: array}}, its state_rows each, zeros where a row
        is missing) and the updates it has taken (its bias corrections count from there)."""
        for row in self.optimizer.state_rows:
            held = state.get(row)
            self.gpu.write(self.buf[row], self._pack(held) if held is not None else
                           np.zeros(self.buf[row].size, np.float32))
        self.set_gate(taken=int(steps))

    def get_opt_state(self) -> dict:
        """{row: {parameter: array}} of the optimizer's state rows, read from the device."""
        return {row: self._unpack(self.gpu.read(self.buf[row])) for row in self.optimizer.state_rows}

    def opt_steps(self) -> int:
        """The updates the optimizer's state has taken (a loss scaler's skips not among them)."""
        return int(self.gate_state()["taken"])

    def gate_state(self) -> dict:
        """The gate's values (kernels.GATE: norm, factor, scale, skipped, taken, ...), one read."""
        return Gate.read(self.gpu, self.gate)

    def set_gate(self, **values):
        """Set any of the gate's values: scale, clean, skipped, taken (a resumed run's, or the first scale)."""
        Gate.write(self.gpu, self.gate, **values)

    # ---- running -----------------------------------------------------------------------------
    def write_batch(self, x: np.ndarray, y: np.ndarray | None = None):
        """x, y [B, T] token ids -> the batch buffer, in one write."""
        BT, V = self.B * self.T, self.cfg.vocab
        x = np.asarray(x).reshape(-1)
        data = np.zeros(self.batch.size, np.uint32)
        data[self.batch_parts["tokens"][0]:][:BT] = x
        if y is not None:
            data[self.batch_parts["targets"][0]:][:BT] = np.asarray(y).reshape(-1)
        if self.training:
            offsets, positions = token_buckets(x, V)
            b0 = self.batch_parts["buckets"][0]
            data[b0:b0 + V + 1] = offsets
            data[b0 + V + 1:b0 + V + 1 + BT] = positions
        self.gpu.write(self.batch, data)

    def step(self, x, y, lr: float):
        """One training step: forward, loss, backward, the gate, the optimizer; one submit (one per
        micro-batch with accum), no readback. x, y [accum*B, T]."""
        self.step_count += 1
        self.optimizer.write_step(self.gpu, lr)
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

    def loss(self) -> float:
        """The last step's mean loss (over its micro-batches)."""
        slots = self.gpu.read(self.loss_buf, count=LOSS_SLOT * (self.accum - 1) + 1)[::LOSS_SLOT]
        return float(slots.astype(np.float64).mean()) if self.accum > 1 else float(slots[0])

    def grad_norm(self) -> float:
        return float(self.gpu.read(self.gate, count=1)[0])
