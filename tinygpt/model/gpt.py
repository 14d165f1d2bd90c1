"""The GPT on the device: its buffers (from the table in model.buffers), and the recorded forward,
backward and optimizer step.

Everything is allocated and bound once in __init__; `step` uploads the batch (one write), encodes
the recorded dispatches into one command buffer, submits once, and reads nothing back. `loss()`
reads the loss when it is shown. The flat parameter layout is model.layout's.
"""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from ..core.config import UNSCORED
from ..core.dpo import preference_stats
from ..core.lora import trainable_shapes
from ..core.init import token_buckets
from ..core.rope import rope_table
from ..device import numerics
from ..device.gpu import GPU
from ..device.kernels import Kernels
from ..device.plan import KernelPlan
from . import buffers
from . import record
from .block import MATRICES, PolicyKernels
from .head import Head
from .layout import LOSS_SLOT, FlatLayout, batch_layout, flat_chunks, flat_part, flat_view, logit_chunks, \
    padded_vocab, param_layout, param_views, read_tensors, write_tensors
from .optim import Gate
from .optimizers import make_optimizer
from .spec import RunSpec


def put_buckets(data: np.ndarray, at: int, ids: np.ndarray, n: int):
    """The rows holding each of n ids (a token; a packed window's position) into the batch's words from
    `at`: offsets (n + 1), then rows. Their table's gradient sums each id's rows (embed_tok_grad)."""
    offsets, rows_of = token_buckets(ids, n)
    data[at:at + n + 1] = offsets
    data[at + n + 1:at + n + 1 + len(rows_of)] = rows_of


class HeldOrder(Mapping):
    """The parameters as a model holds them: the blocks' matrices [in, out] turned to [out, in]
    (RunSpec.out_in), or back. Each keeps its [in, out] shape, which the flat layout checks: only
    the order of its values changes. A matrix is turned when it is read, so that one turned copy
    at a time is on the host, not a second model."""

    def __init__(self, params: Mapping, back: bool = False):
        self.params, self.back = params, back

    def __getitem__(self, name):
        a = self.params[name]
        if name.rpartition(".")[2] not in MATRICES or not name.startswith("h"):
            return a
        a = np.asarray(a, np.float32)
        K, N = a.shape
        return np.ascontiguousarray(a.reshape(N, K).T if self.back else a.T).reshape(K, N)

    def __iter__(self):
        return iter(self.params)

    def __len__(self):
        return len(self.params)


class Recorded:
    """A model's recorded dispatches, each list a part of the submissions Model makes: the
    forward; the loss (cross-entropy over the logits' chunks, each micro-batch's reduction, what
    follows it), the rows' losses of an evaluation; the backward (the first micro-batch's, the
    later ones'), the optimizer's step; the weights' copies the policy's matmuls read."""

    def __init__(self):
        self.fwd, self.reduce, self.ce, self.after, self.eval_rows, self.loss = [], [], [], [], [], []
        self.bwd, self.bwd_more, self.opt, self.copy_weights, self.copy_base = [], [], [], [], []

    def every(self) -> list:
        """Every recorded dispatch (the numerics check judges their kernels)."""
        return (self.fwd + self.loss + self.eval_rows + self.bwd + self.bwd_more + self.opt + self.copy_weights
                + self.copy_base)


def model_layout(gpu: GPU, plan: KernelPlan, spec: RunSpec, optimizer) -> FlatLayout:
    """Where a model's things lie on this device (layout.FlatLayout), from its spec and the
    device's limits, before anything is allocated."""
    cfg = spec.cfg
    VP = padded_vocab(cfg.vocab)                                       # logits row stride
    trainable = trainable_shapes(cfg, spec.lora)                       # what the optimizer updates
    align = int(gpu.limits.get("min-storage-buffer-offset-alignment", 256))
    part = flat_part(gpu.max_buffer, align)                            # a flat array's floats a device buffer
    offsets, n_flat = param_layout(cfg, trainable, part)
    base, n_base = param_layout(cfg, part=part)
    rows, size = buffers.model_rows(spec, plan, gpu.max_binding, optimizer, part)
    return FlatLayout(
        VP=VP, trainable=trainable, part=part, offsets=offsets, n_flat=n_flat,
        base_offsets=base if spec.lora else None,                     # a LoRA run's frozen model
        logit_chunks=logit_chunks(spec.B * spec.T, VP, gpu.max_binding) if spec.lm_head else [],
        flat_chunks=flat_chunks(n_flat, gpu.max_binding, align, part),
        base_chunks=flat_chunks(n_base, gpu.max_binding, align, part) if spec.lora else [],
        batch_parts=batch_layout(spec.B * spec.T, cfg.vocab, spec.B if spec.dpo is not None else 0,
                                 spec.T if spec.packed else 0)[0],
        rows=rows, size=size)


class Model:
    """A GPT built as its run spec says (model.spec.RunSpec: the config, [B, T] tokens a step, the
    precision policy, the attention path, ...), on `gpu` under the kernel plan `plan`. What the
    spec's fields mean here:

    training=False records the forward only (evaluation and sampling); lm_head=False (with it) stops
    the forward at the last block's output: a prefill, which needs each layer's keys and values.
    accum=N: a step takes N micro-batches of B windows, whose gradients add up (each scaled by
    1/(N*B*T), so the sum is the mean's) before one clipped update: the step of a batch N*B.
    optimizer (training): its settings (model.optimizers), from which its room makes
    the optimizer that updates the flat buffers after the gate (the clip, and the loss scaler).
    loss_scale: the first scale of a precision with a loss scaler (core.precision: f16), kept and
    changed on the device from then on (gate_state, set_gate). lora (training only): adapters
    beside the targeted matrices (core.lora); the base model is frozen in a buffer of its own, and
    the flat parameter, gradient and optimizer-state buffers hold the trainable parameters alone."""

    def __init__(self, gpu: GPU, plan: KernelPlan, spec: RunSpec):
        cfg, precision = spec.cfg, spec.precision
        self.gpu, self.plan, self.spec, self.cfg, self.precision = gpu, plan, spec, cfg, precision
        self.B, self.T = spec.B, spec.T
        self.optimizer = make_optimizer(spec.optimizer) if spec.training else None
        self.kn = Kernels(gpu, plan)
        self.pk = PolicyKernels(self.kn, precision, cfg.block)
        self.layout = model_layout(gpu, plan, spec, self.optimizer)
        record.check_fits(self)
        self.buf = buffers.allocate(gpu, self.layout.rows, self.layout.size,
                                    {"logits": len(self.layout.logit_chunks)})
        self._views()
        if "rope table" in self.buf:          # a rotary model's angles, made once on the host (core.rope)
            gpu.write(self.buf["rope table"], rope_table(cfg.ctx, cfg.hd, cfg.rope_theta,
                                                                  scaling=cfg.rope_scaling).reshape(-1))
        if "ones" in self.buf:                # the gains of norms without weights
            gpu.write(self.buf["ones"], np.ones(self.layout.size["ones"], np.float32))
        graph = self.graph = Recorded()
        graph.copy_weights = record.weight_copy(self)
        graph.copy_base = record.weight_copy(self, "base")      # a LoRA run's frozen copy: made once, when set
        if spec.scaled:
            self.set_gate(scale=spec.loss_scale, clean=0, skipped=0, taken=0)
        self.att = [record.layer_attention(self, l) for l in range(cfg.layers)]
        self.head = Head(self.kn, self.pk, self.P["tok_emb"], self.read[cfg.block.head], cfg.d_model,
                         max((n for _, n in self.layout.logit_chunks), default=0), self.buf.get("head block"))
        graph.fwd = record.forward(self)
        graph.reduce, graph.ce, graph.after, graph.eval_rows = record.losses(self, spec.lm_head)
        graph.loss = graph.ce + graph.reduce[:1] + graph.after     # one micro-batch's, in order
        self._scored = spec.accum * self.B * self.T         # the targets the recorded loss scales mean over
        if spec.training:
            graph.bwd = record.backward(self, self.G)
            graph.opt = record.optimizer_step(self)
        if spec.accum > 1:   # later micro-batches: the backward into a second buffer, added to the first
            graph.bwd_more = record.backward(self, self.G_micro) + [
                self.kn.accumulate(flat_view(self.buf["grads micro"], f0, k), flat_view(self.buf["grads"], f0, k),
                                   k)
                for f0, k in self.layout.flat_chunks]
        if precision.feature:       # a precision WGSL has as an option: its kernels judged on this device first
            numerics.check(gpu, plan, numerics.half_kernels(graph.every(), precision.stored), precision.name)
        self.step_count = 0
        self.moments_from = 0       # the step the optimizer's state started from (zero state then)

    # ---- building ----------------------------------------------------------------------------------
    def _views(self):
        """Views of every parameter in the flat buffers: P (the float32 masters), read (what the
        matmuls read: the policy's copy, or the masters), G and G_micro (the gradients)."""
        b, lay, cfg = self.buf, self.layout, self.cfg
        views = lambda flat, offsets=None: param_views(flat, lay.offsets if offsets is None else offsets, lay.VP, cfg)
        # every parameter where it lives: the trainable ones in params, a LoRA run's frozen rest in base
        frozen = lambda key: views(b[key], lay.base_offsets) if self.spec.lora else {}
        self.P = {**frozen("base"), **views(b["params"])}
        # each weight as the matmuls read it: the policy's copy, or the float32 master itself
        copy = "params copy" in b
        self.read = {**frozen("base copy"), **views(b["params copy"])} if copy else self.P
        self.G = views(b["grads"]) if "grads" in b else None
        if "ones" in b:             # the norms without weights read ones where a gain would be (no gradient)
            blk, L = cfg.block, cfg.layers
            free = ([] if blk.norm.weights else ["ln_f", "ln_f_g", "ln_e", "ln_e_g"]
                    + [f"h{l}.ln{i}{g}" for l in range(L) for i in (1, 2) for g in ("", "_g")])
            free += [] if blk.qk_norm.weights else [f"h{l}.{w}_norm_g" for l in range(L) for w in "qk"]
            self.P.update({n: b["ones"] for n in free})
        self.G_micro = views(b["grads micro"]) if "grads micro" in b else None

    # ---- state in and out ------------------------------------------------------------------------
    def set_params(self, params: dict):
        """Every parameter (a LoRA run's: the base model's and the adapters'), each as the files hold
        it: the blocks' matrices [in, out], turned here where this model holds them [out, in]."""
        params = HeldOrder(params) if self.spec.out_in else params
        if self.spec.lora:
            write_tensors(self.gpu, self.buf["base"], self.layout.base_offsets, params)
            if self.graph.copy_base:
                self.gpu.run(self.graph.copy_base)
        write_tensors(self.gpu, self.buf["params"], self.layout.offsets, params)
        if self.graph.copy_weights:
            self.gpu.run(self.graph.copy_weights)

    def get_params(self) -> dict:
        """Every parameter, as set_params takes them (the trainable ones where they live)."""
        base = read_tensors(self.gpu, self.buf["base"], self.layout.base_offsets) if self.spec.lora else {}
        held = {**base, **read_tensors(self.gpu, self.buf["params"], self.layout.offsets)}
        return dict(HeldOrder(held, back=True)) if self.spec.out_in else held

    def get_grads(self) -> dict:
        return read_tensors(self.gpu, self.buf["grads"], self.layout.offsets)

    def set_opt_state(self, state: dict, steps: int):
        """The optimizer's state ({row: {parameter: array}}, its state_rows each, zeros where a row
        is missing) and the updates it has taken (its bias corrections count from there)."""
        for row in self.optimizer.state_rows:
            held = state.get(row)
            write_tensors(self.gpu, self.buf[row], self.layout.offsets, held if held is not None else
                          {n: np.zeros(s, np.float32) for n, (_, s) in self.layout.offsets.items()})
        self.set_gate(taken=int(steps))

    def get_opt_state(self) -> dict:
        """{row: {parameter: array}} of the optimizer's state rows, read from the device."""
        return {row: read_tensors(self.gpu, self.buf[row], self.layout.offsets) for row in self.optimizer.state_rows}

    def opt_steps(self) -> int:
        """The updates the optimizer's state has taken (a loss scaler's skips not among them)."""
        return int(self.gate_state()["taken"])

    def gate_state(self) -> dict:
        """The gate's values (kernels.GATE: norm, factor, scale, skipped, taken, ...), one read."""
        return Gate.read(self.gpu, self.buf["gate"])

    def set_gate(self, **values):
        """Set any of the gate's values: scale, clean, skipped, taken (a resumed run's, or the first scale)."""
        Gate.write(self.gpu, self.buf["gate"], **values)

    # ---- running -----------------------------------------------------------------------------
    def write_batch(self, x: np.ndarray, y: np.ndarray | None = None, refs: np.ndarray | None = None,
                    docs: np.ndarray | None = None):
        """x, y [B, T] token ids (and preference pairs' refs [B], the reference's log-probability of
        each window; a packed model's docs [B, T], each row's position in its record, by default
        one record a window) -> the batch buffer, in one write."""
        B, T, V = self.B, self.T, self.cfg.vocab
        x = np.asarray(x).reshape(-1)
        data = np.zeros(self.buf["batch"].size, np.uint32)
        data[self.layout.batch_parts["tokens"][0]:][:B * T] = x
        if y is not None:
            data[self.layout.batch_parts["targets"][0]:][:B * T] = np.asarray(y).reshape(-1)
        if refs is not None:
            data[self.layout.batch_parts["refs"][0]:][:B] = np.asarray(refs, np.float32).view(np.uint32)
        if self.spec.training:
            put_buckets(data, self.layout.batch_parts["buckets"][0], x, V)
        if self.spec.packed:
            docs = np.tile(np.arange(T, dtype=np.uint32), B) if docs is None else np.asarray(docs).reshape(-1)
            assert docs.shape == (B * T,) and (docs <= np.tile(np.arange(T), B)).all(), "a record before its window"
            data[self.layout.batch_parts["docs"][0]:][:B * T] = docs
            if self.spec.training:
                put_buckets(data, self.layout.batch_parts["pos buckets"][0], docs, T)
        self.gpu.write(self.buf["batch"], data)

    def step(self, x, y, lr: float, refs=None, docs=None):
        """One training step: forward, loss, backward, the gate, the optimizer; one submit (one per
        micro-batch with accum), no readback. x, y [accum*B, T]; refs [accum*B]: preference pairs'
        (windows 2i chosen, 2i+1 rejected) reference log-probabilities, for a DPO model; docs
        [accum*B, T]: a packed model's positions of each row in its record."""
        self.step_count += 1
        self.optimizer.write_step(self.gpu, lr)
        self._micro_batches(x, y, self.graph.opt, refs, docs)

    def grads_only(self, x, y, refs=None, docs=None):
        """Forward, loss and backward without the update (tests compare gradients)."""
        self._micro_batches(x, y, [], refs, docs)

    def _micro_batches(self, x, y, then, refs=None, docs=None):
        x, y, B = np.asarray(x), np.asarray(y), self.B
        assert (refs is None) == (self.spec.dpo is None), \
            "a DPO model's steps take the pairs' reference log-probabilities"
        if self.spec.dpo is None:
            self._scale_loss(y)
        for i in range(self.spec.accum):
            part = slice(i * B, (i + 1) * B)
            self.write_batch(x[part], y[part], None if refs is None else refs[part],
                             None if docs is None else np.asarray(docs)[part])
            bwd = self.graph.bwd if i == 0 else self.graph.bwd_more
            self.gpu.run(self.graph.fwd + self.graph.ce + self.graph.reduce[i:i + 1] + self.graph.after + bwd
                         + (then if i == self.spec.accum - 1 else []))

    def _scale_loss(self, y):
        """The step's loss is the mean over its scored targets (a chat file's assistant tokens; every
        target of a text): where their count differs from the last step's, the recorded scales are
        rewritten, dlogits' 1/scored and each micro-batch's slot accum/scored (loss() averages them)."""
        scored = max(1, int(np.count_nonzero(y != UNSCORED)))
        if scored != self._scored and self.graph.reduce:
            for d in self.graph.ce:
                self.kn.losses.set_loss_scale(d, 1.0 / scored)
            for d in self.graph.reduce:
                self.kn.losses.set_loss_scale(d, self.spec.accum / scored)
            self._scored = scored

    def dispatch_groups(self):
        """[(group, dispatch)] of one training step in order (the profiler times each)."""
        return ([("forward", d) for d in self.graph.fwd + self.graph.loss] + [("backward", d) for d in self.graph.bwd]
                + [("optimizer", d) for d in self.graph.opt])

    def row_losses(self, x, y, rows: int | None = None, docs=None) -> np.ndarray:
        """The next-token loss of each of the first `rows` of B*T positions (all by default):
        forward, then cross-entropy over every chunk of logits, no gradient, no update."""
        self.write_batch(x, y, docs=docs)
        self.gpu.run(self.graph.fwd + self.graph.eval_rows)
        return self.gpu.read(self.buf["losses"], count=rows or self.B * self.T)

    def window_logprobs(self, xs: np.ndarray, ys: np.ndarray) -> np.ndarray:
        """Each window's log-probability of its scored targets (minus the sum of their losses, float64),
        B windows at a time, the last batch padded with copies of its first window."""
        B, T, n = self.B, self.T, len(xs)
        out = np.empty(n)
        for i in range(0, n, B):
            x, y = xs[i:i + B], ys[i:i + B]
            k = len(x)
            if k < B:
                x, y = np.concatenate([x, np.repeat(x[:1], B - k, 0)]), np.concatenate([y, np.repeat(y[:1], B - k, 0)])
            out[i:i + k] = -self.row_losses(x, y, k * T).astype(np.float64).reshape(k, T).sum(1)
        return out

    def mean_loss(self, xs: np.ndarray, ys: np.ndarray, refs=None, docs=None, progress=None) -> float:
        """Mean next-token loss over N windows [N, T], B at a time (float64 sum), of the targets that are
        scored (every one but UNSCORED's: a chat file's assistant tokens); the last batch
        is padded with copies of its first window, whose rows are not read. progress: a bar
        (tqdm's), updated by the windows of each batch. refs: preference pairs' reference
        log-probabilities (a DPO model's windows): their DPO loss instead. docs [N, T]: packed
        windows' positions of each row in its record (a packed model's)."""
        if refs is not None:
            return preference_stats(self.window_logprobs(np.asarray(xs), np.asarray(ys)), refs, self.spec.dpo)["loss"]
        B, T, n = self.B, self.T, len(xs)
        scored = int(np.count_nonzero(np.asarray(ys) != UNSCORED))
        if n == 0 or scored == 0:
            raise ValueError("no windows to evaluate" if n == 0 else "no target in these windows is scored")
        total = 0.0
        for i in range(0, n, B):
            x, y = xs[i:i + B], ys[i:i + B]
            d = None if docs is None else docs[i:i + B]
            k = len(x)
            if k < B:
                x = np.concatenate([x, np.repeat(x[:1], B - k, 0)])
                y = np.concatenate([y, np.repeat(y[:1], B - k, 0)])
                d = None if d is None else np.concatenate([d, np.repeat(d[:1], B - k, 0)])
            total += self.row_losses(x, y, k * T, d).astype(np.float64).sum()
            if progress is not None:
                progress.update(k)
        return total / scored

    def forward(self, x, then=()):
        """The forward alone, then `then` in the same submission; its activations (and the naive
        path's attention weights) are then readable."""
        self.write_batch(x)
        self.gpu.run(self.graph.fwd + list(then))

    def logits_of(self, x) -> np.ndarray:
        self.forward(x)
        return self.gpu.read(self.buf["logits"])[:, :self.cfg.vocab].reshape(self.B, self.T, -1)

    def loss(self) -> float:
        """The last step's mean loss (over its micro-batches)."""
        slots = self.gpu.read(self.buf["loss slots"], count=LOSS_SLOT * (self.spec.accum - 1) + 1)[::LOSS_SLOT]
        return float(slots.astype(np.float64).mean()) if self.spec.accum > 1 else float(slots[0])

    def grad_norm(self) -> float:
        return float(self.gpu.read(self.buf["gate"], count=1)[0])
