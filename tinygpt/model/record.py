"""How a Model is built: what it refuses, and the dispatches of its forward, loss, backward,
optimizer step and weight copies, recorded once from its buffers (model.gpt's Model calls these
while it is made; decode.py's step reads a block's weights the same way).
"""
from __future__ import annotations

import numpy as np

from ..core.block import HEAD_TABLES
from ..core.errors import UsageError
from ..device.gpu import LimitError, Tensor
from . import attention as attn
from . import buffers
from .block import (MATRICES, VECTORS, BlockActs, BlockGrads, BlockLoRA, BlockWeights, Rotary, block_backward,
                    block_forward)
from .layout import LOSS_SLOT, flat_view, param_views, rows
from .optim import Flat, Gate


def precision_problem(gpu, policy) -> str | None:
    """Why this device cannot run a precision's kernels (a feature it lacks), or None."""
    if policy.feature and policy.feature not in gpu.features:
        return (f"{{opt:precision}} {policy.name} needs the WebGPU feature {policy.feature}, which {gpu.name} "
                f"({gpu.backend}, {gpu.engine_label}) does not offer; use {{opt:precision}} bf16 or fp32")
    return None


def check_fits(m):
    """What the kernels cannot take, refused before anything is allocated."""
    cfg, g = m.cfg, m.gpu
    problem = m.precision.problem(cfg.d_model, cfg.d_mlp) or precision_problem(g, m.precision)
    hs, wm = cfg.block.heads, m.precision.width_multiple
    if not problem and hs.apart and hs.hd % wm:      # a head dim set apart: q's width is H hd, not d_model
        problem = f"{{opt:precision}} {m.precision.name} needs {{opt:head_dim}} a multiple of {wm}, got {hs.hd}"
    if problem:                                      # a usage error: the width or precision option
        raise UsageError(problem)
    g.check_loop(m.B * m.T, "batch x ctx (rows reduced by the bias and LayerNorm gradients)")
    if cfg.block.qk_norm.on:
        g.check_loop(m.B * m.T * cfg.heads, "batch x ctx x heads (rows reduced by QK-norm's gain gradients)")
        wm = m.precision.width_multiple
        if cfg.hd % wm:
            raise UsageError(f"{{opt:precision}} {m.precision.name} with {{opt:qk_norm}} needs a head dim that is a "
                             f"multiple of {wm} (its norm's kernels' width), got {cfg.hd}")
    m.spec.attention.check(m.T, hs.q_width, cfg.heads)
    m.spec.attention.check_fits(m.B, m.T, g)
    lo = m.spec.lora
    if lo and m.precision.width_multiple > 1 and lo.rank % m.precision.width_multiple:
        raise UsageError(f"{{opt:lora}} {lo.rank}: {{opt:precision}} {m.precision.name} needs a rank that is a "
                         f"multiple of {m.precision.width_multiple} (its kernels' width)")
    for name, (_, shape) in {**(m.layout.base_offsets or {}), **m.layout.offsets}.items():   # each parameter is bound
        if name not in HEAD_TABLES:                  # whole by its kernels, except the [V, C] tables (Head: chunks)
            g.check_size(4 * int(np.prod(shape)), f"parameter {name} {list(shape)}")
        elif m.layout.part and np.prod(shape) > m.layout.part:   # and each lies in one buffer of the flat arrays
            raise LimitError(f"parameter {name} {list(shape)} needs {4 * int(np.prod(shape)):,} bytes in one buffer "
                             f"but this adapter's hold {4 * m.layout.part:,} (max-buffer-size); use a smaller model")


def layer_attention(m, l: int) -> attn.Attention:
    cfg, a = m.cfg, m.spec.attention
    return a.bind(m.kn, m.B, m.T, cfg.block.heads.q_width, cfg.heads, a.scratch(m.buf, m.layout.size, l),
                  cfg.attn_window, docs=docs(m))


def block_weights(m, l: int) -> BlockWeights:
    """Block l's weights as its kernels read them."""
    p = lambda n: f"h{l}.{n}"
    gains = (m.P[p("q_norm_g")], m.P[p("k_norm_g")]) if m.cfg.block.qk_norm.on else ()
    return BlockWeights({n: m.read.get(p(n)) for n in MATRICES}, {n: m.P.get(p(n)) for n in VECTORS},
                        m.P[p("ln1")], m.P[p("ln2")], m.P[p("ln1_g")], m.P[p("ln2_g")], gains, m.spec.out_in)


def block_adapters(m, l: int, G: dict | None) -> BlockLoRA | None:
    """Block l's adapters (None without LoRA): A and B as the matmuls read them, the saved
    s (x A^T) of each target, and where their gradients go in G."""
    lo, b = m.spec.lora, m.buf
    if lo is None:
        return None
    BT, R = m.B * m.T, lo.rank
    stride = buffers.lora_block(BT, R)
    keys = {W: (f"h{l}.{W}.lora_A", f"h{l}.{W}.lora_B") for W in lo.targets}
    hs = {W: Tensor(b["lora hs"][l].buf, b["lora hs"][l].offset + 4 * i * stride, (BT, R), "f32", f"lora hs {W}")
          for i, W in enumerate(lo.targets)}
    pick = lambda d, j: {W: d[k[j]] for W, k in keys.items()} if d is not None else {}
    return BlockLoRA(R, lo.scale, pick(m.read, 0), pick(m.read, 1), hs, pick(G, 0), pick(G, 1),
                     b["lora h"], b["lora gs"], b.get("lora y"))


def block_acts(m, l: int) -> BlockActs:
    """Block l's saved activations; q, k, v and ctx as the attention reads and writes them."""
    b = m.buf
    q, k, v, ctx = b["q"][l], b["k"][l], b["v"][l], b["ctx"][l]
    qk = ((b["q raw"][l], b["k raw"][l]), (b["q norm stats"][l], b["k norm stats"][l])) if "q raw" in b else ((), ())
    return BlockActs(b["x"][l], b["x mid"][l], b["x"][l + 1], b["ln1"][l], b["ln1 stats"][l], (q, k, v), ctx,
                     b["ln2"][l], b["ln2 stats"][l], b["pre"][l], b["gel"][l], b["branch out"],
                     (b.get("q f32", q), b.get("k f32", k), b.get("v f32", v)), b.get("ctx f32", ctx), *qk,
                     (b["k kv"][l], b["v kv"][l]) if "k kv" in b else (),
                     b["mlp gate"][l] if "mlp gate" in b else None)


def rotary(m, T: int) -> Rotary | None:
    """Where RoPE turns a rotary model's q and k, rows repeating T positions, or a packed model's at
    their positions in their records (None: a learned table's)."""
    table = m.buf.get("rope table")
    return Rotary(table, T, m.cfg.hd, docs=docs(m)) if table is not None else None


def batch_view(m, part: str) -> Tensor:
    w0, n = m.layout.batch_parts[part]
    return Tensor(m.buf["batch"].buf, 4 * w0, (n,), "u32", part)


def docs(m) -> Tensor | None:
    """A packed model's positions of each row in its record (the batch's docs), else None."""
    return batch_view(m, "docs") if m.spec.packed else None


def forward(m) -> list:
    cfg, B, T, BT = m.cfg, m.B, m.T, m.B * m.T
    C, M, L = cfg.d_model, cfg.d_mlp, cfg.layers
    emb = m.buf.get("x emb", m.buf["x"][0])          # where the embedding is normed, it is kept before
    fwd = m.head.embed(batch_view(m, "tokens"), m.P.get("pos_emb"), emb, B, T, docs(m))
    if emb is not m.buf["x"][0]:
        fwd.append(m.pk.norm_f32(emb, m.P["ln_e"], m.buf["x"][0], m.buf["x emb stats"], BT, C))
    for l in range(L):
        fwd += block_forward(m.kn, m.pk, block_weights(m, l), block_acts(m, l), m.att[l].forward, BT, C, M,
                             block_adapters(m, l, None), rotary(m, T))
    if m.layout.logit_chunks:
        lnf = m.buf["lnf"]
        fwd.append(m.pk.layernorm(m.buf["x"][L], m.P["ln_f"], lnf, m.buf["lnf stats"], BT, C))
        for r0, n in m.layout.logit_chunks:
            fwd += m.head.forward(rows(lnf, r0, n), rows(m.buf["logits"], r0, n), n)
    return fwd


def forward_rows(m, T: int) -> list:
    """The forward of a model of one sequence over its first T rows alone (T at most its own): the
    same buffers, each row where the whole forward writes it (a prompt's prefill of its own
    length). Attention is bound again for T rows; the rest takes its row count as an argument."""
    assert m.B == 1 and T <= m.T, (m.B, T, m.T)
    whole, att = m.T, m.att
    try:
        m.T = T
        m.att = [layer_attention(m, l) for l in range(m.cfg.layers)]
        return forward(m)
    finally:
        m.T, m.att = whole, att


def losses(m, head: bool) -> tuple:
    """(each micro-batch's reduction into its slot; the cross-entropy of a step, writing dlogits over
    the logits; what follows the reduction (DPO's factor on each window's rows); the per-row losses
    without a gradient, for evaluation). A micro-batch runs the cross-entropy, its slot's reduction,
    then what follows. The dispatch lists are the model's own: callers use step / mean_loss /
    logits_of / dispatch_groups, so no caller can run part of a list."""
    kn, V, BT, accum = m.kn, m.cfg.vocab, m.B * m.T, m.spec.accum
    targets = batch_view(m, "targets")
    # dlogits carry 1/(accum*B*T): the micro-batches' gradients add up to the mean's (DPO's: 1, its
    # own factor follows) and, under a loss scaler, its scale (from the device: the gate changes it there)
    scaler = m.buf.get("gate") if m.spec.scaled else None
    scale = 1.0 if m.spec.dpo is not None else 1.0 / (accum * BT)
    logits, losses = m.buf.get("logits"), m.buf.get("losses")
    ce = lambda grad: [kn.losses.cross_entropy(targets, rows(logits, r0, n), losses, n, V, scale, grad, r0, m.layout.VP,
                                        scaler=scaler if grad else None, softcap=m.cfg.block.softcap)
                       for r0, n in m.layout.logit_chunks]
    slot = lambda i: Tensor(m.buf["loss slots"].buf, 4 * LOSS_SLOT * i, (LOSS_SLOT,), "f32", f"loss{i}")
    if not head:
        return [], [], [], ce(False)
    if m.spec.dpo is None:
        return [kn.losses.loss_reduce(losses, slot(i), BT, 1.0 / BT) for i in range(accum)], ce(m.spec.training), [], \
            ce(False)
    pairs, w = m.B // 2, m.buf["dpo weights"]
    reduce = [kn.losses.dpo(batch_view(m, "refs"), losses, w, slot(i), pairs, m.T, m.spec.dpo, 1.0 / (pairs * accum),
                     1.0 / pairs)
              for i in range(accum)]
    return reduce, ce(True), [kn.losses.scale_rows(w, rows(m.buf["logits"], r0, n), n, m.layout.VP, m.T, r0)
                              for r0, n in m.layout.logit_chunks], \
        ce(False)


def backward(m, Gd: dict) -> list:
    """The backward writing every gradient into the flat buffer of the views Gd."""
    kn, pk, cfg, b = m.kn, m.pk, m.cfg, m.buf
    B, T, C, V, M, L = m.B, m.T, cfg.d_model, cfg.vocab, cfg.d_mlp, cfg.layers
    BT, lnf, x_last = B * T, b["lnf"], m.buf["x"][L]
    dres, dln = b["d residual"], b["d ln"]
    ds = []
    for i, (r0, n) in enumerate(m.layout.logit_chunks):                    # logits hold dlogits after cross_entropy
        ds += m.head.backward(rows(m.buf["logits"], r0, n), rows(lnf, r0, n), Gd.get(cfg.block.head), rows(dln, r0, n),
                                 n, accumulate=i > 0)
    if "ln_f" in Gd:                # a parameter without a gradient view is frozen (LoRA)
        ds.append(pk.norm_dgb(dln, x_last, b["lnf stats"], Gd["ln_f"], BT, C))
    ds.append(pk.norm_dx(dln, x_last, m.P["ln_f_g"], b["lnf stats"], dres, BT, C, accumulate=False))
    for l in reversed(range(L)):
        G = {n: Gd[f"h{l}.{n}"] for n in MATRICES + VECTORS + ("ln1", "ln2", "q_norm_g", "k_norm_g")
             if f"h{l}.{n}" in Gd}
        grads = BlockGrads(G, dres, dln, b["d act"], b["d pre"], b["d ctx"], (b["dq"], b["dk"], b["dv"]),
                           b.get("d qk raw"), (b["dk kv"], b["dv kv"]) if "dk kv" in b else (), b.get("d mlp gate"))
        if m.spec.recompute and l < L - 1:    # the top block's are still those of the forward
            ds += block_forward(kn, pk, block_weights(m, l), block_acts(m, l), m.att[l].forward, BT, C, M,
                                block_adapters(m, l, None), rotary(m, T))
        ds += block_backward(kn, pk, block_weights(m, l), block_acts(m, l), grads, m.att[l], BT, C, M,
                             block_adapters(m, l, Gd), rotary(m, T))
    demb = dres                                              # the embedding's gradient
    if "x emb" in b:                                         # back through the embedding's norm
        if "ln_e" in Gd:
            ds.append(pk.norm_dgb(dres, b["x emb"], b["x emb stats"], Gd["ln_e"], BT, C))
        ds.append(pk.norm_dx(dres, b["x emb"], m.P["ln_e_g"], b["x emb stats"], dln, BT, C, accumulate=False))
        demb = dln
    if "tok_emb" in Gd:
        ds += m.head.embed_grad(batch_view(m, "buckets"), demb, Gd["tok_emb"], B, T, V,
                                accumulate=cfg.block.tied and cfg.block.head in Gd)     # onto the head's
        if "pos_emb" in Gd and m.spec.packed:                   # each position's rows, wherever its records lie
            ds.append(kn.embed_tok_grad(batch_view(m, "pos buckets"), demb, Gd["pos_emb"], B, T, C, T, False))
        elif "pos_emb" in Gd:
            ds.append(kn.embed_pos_grad(demb, Gd["pos_emb"], B, T, C))
    return ds


def optimizer_step(m) -> list:
    """The gate (the global norm, the clip and the loss scaler), the optimizer's update, then
    the weights' copy the next step reads. The flat buffers are bound a chunk at a time where
    they exceed one binding; the partial sums and the decay table are bound whole (small: one
    float per 4,096 and per 256), each chunk's place in them passed as an index."""
    lay = m.layout
    flat = Flat(m.gpu, m.kn, m.buf["params"], m.buf["grads"], m.buf["gate"], m.buf, lay.flat_chunks, lay.n_flat,
                lay.trainable, lay.offsets, lambda t: param_views(t, lay.offsets, lay.VP, m.cfg))
    gate = Gate(m.cfg.grad_clip, m.spec.scaled)
    return gate.record(flat, m.buf["norm partials"]) + m.optimizer.record(flat) + m.graph.copy_weights


def weight_copy(m, src: str = "params") -> list:
    """The policy's weight copy refreshed from the float32 weights, chunk by chunk (nothing
    where the matmuls read the float32 weights themselves). src: "params" (after every
    update), or a LoRA run's frozen "base" (once, when it is set)."""
    copy = m.buf.get(src + " copy")
    if copy is None:
        return []
    flat = m.buf[src]
    return [d for f0, k in (m.layout.flat_chunks if src == "params" else m.layout.base_chunks)
            for d in m.pk.convert(flat_view(flat, f0, k), flat_view(copy, f0, k), k)]
