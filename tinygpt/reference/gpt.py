"""The whole model in NumPy: forward, backward and the optimizer step, composed of the kernels'
twins (kernels.py, attention.py). The tests judge the GPU model's logits, loss, every gradient and
its AdamW steps against this, in float64; scripts train it in float32 to compare.

Shapes: B batch, T time, C channels, V vocab, M MLP width, BT = B*T rows.
"""
from __future__ import annotations

import numpy as np

from ..core.config import UNSCORED, Config, param_shapes
from ..core.lora import LoRA, adapter_name, adapter_shapes
from ..core.init import token_buckets
from ..core.precision import FP32, Precision
from ..core.rope import rope_table
from . import attention as ra
from . import kernels as RK
from .optim import new_state
from .optim import step as optim_step
from .kernels import (add, bf16_round, bias_grad, cross_entropy, embed_forward, embed_pos_grad, embed_tok_grad,
                      f16_round, kv_expand, kv_reduce, layernorm_dgb, layernorm_dx, layernorm_forward, loss_reduce,
                      matmul, matmul_abt, matmul_atb, rope_backward, rope_forward, scale, softcap)

# how a value is rounded where a policy stores a dtype (in the dtype it is computed in)
ROUND = {"f32": lambda a: a,
         "bf16": lambda a: bf16_round(np.asarray(a, np.float32)).astype(np.asarray(a).dtype),
         "f16": lambda a: f16_round(np.asarray(a, np.float32)).astype(np.asarray(a).dtype)}


def _parts(cfg: Config, T: int, dtype):
    """The block's parts as the twins compute them: the norm (x, g, b -> y, mean, rstd), the
    activation and its gradient (the twins of the part's kernels, by name), and RoPE's turns of
    q or k [rows, C] (identities for a learned table), on the model's float32 table."""
    blk = cfg.block
    eps, rms = blk.eps, blk.norm.rms
    norm = lambda x, g, b: layernorm_forward(x, 1.0 if g is None else g, b, eps, rms)    # g None: no gain
    if blk.mlp.gated:                          # of (up, gate): glu.wgsl's twins take (gate, up)
        act = lambda x, gate: getattr(RK, blk.mlp.forward)(gate, x)
        act_grad = lambda x, dy, gate: getattr(RK, blk.mlp.backward)(gate, x, dy)[::-1]     # (dx, dgate)
    else:
        act = lambda x, gate: blk.mlp.act.forward(x)
        act_grad = lambda x, dy, gate: (blk.mlp.act.backward(x, dy), None)
    if not blk.position.rotary:
        return norm, act, act_grad, (lambda x: x), (lambda dx: dx)
    cs = rope_table(cfg.ctx, cfg.hd, blk.rope_theta, scaling=cfg.rope_scaling).astype(dtype)
    return (norm, act, act_grad, lambda x: rope_forward(cs, x, T, cfg.hd, 0),
            lambda dx: rope_backward(cs, dx, T, cfg.hd, 0))


def _qk_gain(P, cfg: Config, l: int, which: str, dtype):
    """QK-norm's gain of q or k [hd]: the layer's, or ones without weights."""
    return P[f"h{l}.{which}_norm_g"] if cfg.block.qk_norm.weights else np.ones(cfg.hd, dtype)


def _qkv(P, cfg: Config, l: int, c: dict, qkv, r, rot) -> tuple:
    """The projections' q, k, v as the attention reads them: QK-norm over each head of the
    float32 q and k (its input and statistics kept in c), then stored (r), turned by RoPE where
    they are stored (QK-norm's output turned before it is stored), and each kv head copied to its
    query heads."""
    q, k, v = qkv
    if cfg.block.qk_norm.on:
        c["qk_raw"] = (q, k)
        hd = cfg.hd
        for which, x in (("q", q), ("k", k)):
            y, mean, rstd = layernorm_forward(x.reshape(-1, hd), _qk_gain(P, cfg, l, which, x.dtype), None,
                                              cfg.block.eps, rms=True)
            c[which + "_stats"] = (mean, rstd)
            q, k = (y.reshape(x.shape), k) if which == "q" else (q, y.reshape(x.shape))
    # q and k normed by QK-norm are turned before they are stored (qk_norm_rope): rounded once
    once = cfg.block.qk_norm.on and cfg.block.position.rotary
    q, k, v = (q, k, r(v)) if once else (r(q), r(k), r(v))
    q, k = r(rot(q)), r(rot(k))
    hs = cfg.block.heads
    if hs.grouped:
        k, v = kv_expand(k, hs.q, hs.kv), kv_expand(v, hs.q, hs.kv)
    return q, k, v


def _qkv_backward(P, G, cfg: Config, l: int, c: dict, dqkv, unrot) -> tuple:
    """_qkv's transpose: the attention's dq, dk, dv [BT, C] -> the projections' (kv heads summed,
    turned back by RoPE, back through QK-norm, whose gains' gradients go into G)."""
    dq, dk, dv = dqkv
    hs = cfg.block.heads
    if hs.grouped:
        dk, dv = kv_reduce(dk, hs.q, hs.kv), kv_reduce(dv, hs.q, hs.kv)
    dq, dk = unrot(dq), unrot(dk)
    if cfg.block.qk_norm.on:
        hd = cfg.hd
        for which, raw in (("q", c["qk_raw"][0]), ("k", c["qk_raw"][1])):
            d = dq if which == "q" else dk
            x, dy, (mean, rstd) = raw.reshape(-1, hd), d.reshape(-1, hd), c[which + "_stats"]
            G[f"h{l}.{which}_norm_g"] = layernorm_dgb(dy, x, mean, rstd, True)[0]
            d = layernorm_dx(dy, x, _qk_gain(P, cfg, l, which, dy.dtype), mean, rstd, True).reshape(d.shape)
            dq, dk = (d, dk) if which == "q" else (dq, d)
    return dq, dk, dv


def _embed(P, cfg: Config, tokens, norm, cache: dict):
    """The residual stream's start [B*T, C]: the token (and learned position) embedding, and the
    block's norm over it where the block has one there (its input and statistics kept in cache)."""
    B, T = tokens.shape
    x = cache["emb"] = embed_forward(tokens, P["tok_emb"], P.get("pos_emb")).reshape(B * T, cfg.d_model)
    if cfg.block.embed_norm:                   # float32, as the stream
        x, *cache["emb_stats"] = norm(x, P.get("ln_e_g"), P.get("ln_e_b"))
    cache["x0"] = x
    return x


def forward(params, cfg: Config, tokens, targets=None, attention=None, precision: Precision = FP32,
            lora: LoRA | None = None):
    """tokens [B,T] -> logits [B,T,V] and, with targets, the mean loss and a cache for backward.

    The precision policy says where to round: what it stores (the matmuls' operands: the LayerNorm
    outputs, the attention output, GELU's output, the head's input; q, k and v; the saved
    pre-activation) to its `stored` dtype, and the weights the matmuls read (the head's token
    table among them) to its `weights` dtype; sums stay in the inputs' precision. The backward
    then reads the rounded activations from the cache and multiplies the float32 gradients by the
    rounded weights, as the model does.

    lora: the adapters (params holds them under core.lora's names): each targeted matrix adds
    s (x A^T) B^T, its s (x A^T) kept in the cache, and read by the next matmul as a gradient
    operand is (float32, rounded to f16 under f16), as the model's float32 scratch is."""
    attend = attention or ra.attention_forward
    windowed = {"window": cfg.attn_window} if cfg.attn_window else {}
    B, T = tokens.shape
    H, L, QC, P = cfg.heads, cfg.layers, cfg.block.heads.q_width, params     # QC: the attention's width
    r, rw, rg = ROUND[precision.stored], ROUND[precision.weights], ROUND[precision.grad_operands]
    norm, act, _, rot, _ = _parts(cfg, T, P["tok_emb"].dtype)
    cache = {"tokens": tokens, "layers": [], "precision": precision, "lora": lora}
    x = _embed(P, cfg, tokens, norm, cache)
    for l in range(L):
        p = lambda n: P[f"h{l}.{n}"]
        c = {"x": x, "lora": {}}

        def lin(W, h, bias):           # h W + bias, and the adapter's s (h A^T) B^T where W has one
            y = matmul(h, rw(p(W)), P.get(f"h{l}.{bias}"))
            if lora is not None and W in lora.targets:
                hs = c["lora"][W] = scale(matmul_abt(h, rw(P[adapter_name(l, W, "A")])), lora.scale)
                y = y + matmul_abt(rg(hs), rw(P[adapter_name(l, W, "B")]))
            return y
        y, mean, rstd = norm(x, P.get(f"h{l}.ln1_g"), P.get(f"h{l}.ln1_b"))
        c["ln1"] = (r(y), mean, rstd)
        h = c["ln1"][0]
        q, k, v = c["qkv"] = _qkv(P, cfg, l, c, [lin("W" + n, h, "b" + n) for n in "qkv"], r, rot)
        ctx = r(attend(q.reshape(B, T, QC), k.reshape(B, T, QC), v.reshape(B, T, QC), H,
                       **windowed).reshape(B * T, QC))
        c["ctx"] = ctx
        x = add(x, lin("Wo", ctx, "bo"))
        c["x_mid"] = x
        y, mean, rstd = norm(x, P.get(f"h{l}.ln2_g"), P.get(f"h{l}.ln2_b"))
        c["ln2"] = (r(y), mean, rstd)
        c["pre"] = r(lin("fc_in_W", c["ln2"][0], "fc_in_b"))   # [BT,M]
        c["gate"] = r(lin("fc_gate_W", c["ln2"][0], "fc_gate_b")) if cfg.block.mlp.gated else None
        c["act"] = r(act(c["pre"], c["gate"]))
        x = add(x, lin("fc_out_W", c["act"], "fc_out_b"))
        cache["layers"].append(c)
    cache["x_final"] = x
    y, mean, rstd = norm(x, P.get("ln_f_g"), P.get("ln_f_b"))
    cache["lnf"] = (r(y), mean, rstd)
    logits = matmul_abt(cache["lnf"][0], rw(P[cfg.block.head]))            # [BT,V]
    cap = cfg.block.softcap
    logits = softcap(logits, cap) if cap else logits
    if targets is None:
        return logits.reshape(B, T, -1)
    scored = max(1, int(np.count_nonzero(targets != UNSCORED)))   # the mean over the scored targets
    losses, dlogits = cross_entropy(targets.reshape(-1), logits, 1.0 / scored, cap)
    cache["dlogits"] = dlogits
    return logits.reshape(B, T, -1), loss_reduce(losses, 1.0 / scored), cache


def backward(params, cfg: Config, cache, attention_backward=None, loss_scale: float = 1.0):
    """Gradients of the mean loss for every parameter, from forward's cache.

    Where the policy's matmuls read float32 gradients in a narrower dtype (`grad_operands`: f16),
    each gradient operand is rounded so, after the loss gradient was multiplied by loss_scale, as
    the model's loss scaler does; the gradients returned are divided by it again. (The model
    also rounds each f16 product to f16; this sums exact products: within the tests' tolerance.)"""
    attend_bwd = attention_backward or ra.attention_backward
    P = params
    tokens = cache["tokens"]
    B, T = tokens.shape
    C = cfg.d_model
    G = {}
    dlogits = cache["dlogits"] * loss_scale
    lnf_y, lnf_mean, lnf_rstd = cache["lnf"]
    r = ROUND[cache["precision"].weights]                                     # the weights the matmuls read
    rg = ROUND[cache["precision"].grad_operands]                              # the gradients they read
    head = cfg.block.head                                                     # tok_emb, or an untied lm_head
    G[head] = matmul_atb(rg(dlogits), lnf_y)                                   # [V,C]
    dy = matmul(rg(dlogits), r(P[head]))                                       # [BT,C]
    rms = cfg.block.norm.rms
    G["ln_f_g"], G["ln_f_b"] = layernorm_dgb(dy, cache["x_final"], lnf_mean, lnf_rstd, rms)
    dx = layernorm_dx(dy, cache["x_final"], P.get("ln_f_g", 1.0), lnf_mean, lnf_rstd, rms)   # residual grad
    lora = cache.get("lora")
    for l in reversed(range(cfg.layers)):
        dx = _block_backward(P, G, cfg, l, cache["layers"][l], dx, lora, (r, rg), attend_bwd, (B, T))
    if cfg.block.embed_norm:
        mean, rstd = cache["emb_stats"]
        G["ln_e_g"], G["ln_e_b"] = layernorm_dgb(dx, cache["emb"], mean, rstd, rms)
        dx = layernorm_dx(dx, cache["emb"], P.get("ln_e_g", 1.0), mean, rstd, rms)
    offsets, positions = token_buckets(tokens, cfg.vocab)
    G["tok_emb"] = G.get("tok_emb", 0.0) + embed_tok_grad(offsets, positions, dx)
    if "pos_emb" in P:
        G["pos_emb"] = np.zeros_like(P["pos_emb"])
        G["pos_emb"][:T] = embed_pos_grad(dx.reshape(B, T, C))
    names = [n for n, _, _ in param_shapes(cfg) + (adapter_shapes(cfg, lora) if lora is not None else [])]
    return {name: G[name] / loss_scale for name in names}


def _block_backward(P, G, cfg: Config, l: int, c: dict, dx, lora, rounding, attend_bwd, shape):
    """Block l's backward from its cache c: its gradients into G; returns the residual's gradient
    below it. rounding: (weights as the matmuls read them, gradient operands as they read them)."""
    r, rg = rounding
    B, T = shape
    H, QC = cfg.heads, cfg.block.heads.q_width
    windowed = {"window": cfg.attn_window} if cfg.attn_window else {}
    p = lambda n: P[f"h{l}.{n}"]
    g = lambda n, val: G.__setitem__(f"h{l}.{n}", val)
    _, _, act_grad, _, unrot = _parts(cfg, T, dx.dtype)
    rms = cfg.block.norm.rms

    def through(W, x_in, dy):      # d x_in of h W (+ the adapter's path), and the adapter's gradients
        d = matmul_abt(rg(dy), r(p(W)))
        if lora is not None and W in lora.targets:
            A, Bm = P[adapter_name(l, W, "A")], P[adapter_name(l, W, "B")]
            G[adapter_name(l, W, "B")] = matmul_atb(rg(dy), rg(c["lora"][W]))
            gs = scale(matmul(rg(dy), r(Bm)), lora.scale)
            G[adapter_name(l, W, "A")] = matmul_atb(rg(gs), x_in)
            d = d + matmul(rg(gs), r(A))
        return d
    # MLP branch
    g("fc_out_W", matmul_atb(c["act"], rg(dx)))
    g("fc_out_b", bias_grad(dx))
    dact = through("fc_out_W", c["act"], dx)
    dpre, dgate = act_grad(c["pre"], dact, c["gate"])
    g("fc_in_W", matmul_atb(c["ln2"][0], rg(dpre)))
    g("fc_in_b", bias_grad(dpre))
    dln2 = through("fc_in_W", c["ln2"][0], dpre)
    if dgate is not None:                       # a gated MLP's gate projection
        g("fc_gate_W", matmul_atb(c["ln2"][0], rg(dgate)))
        g("fc_gate_b", bias_grad(dgate))
        dln2 = dln2 + through("fc_gate_W", c["ln2"][0], dgate)
    _, m2, r2 = c["ln2"]
    dg, db = layernorm_dgb(dln2, c["x_mid"], m2, r2, rms)
    g("ln2_g", dg)
    g("ln2_b", db)
    dx = dx + layernorm_dx(dln2, c["x_mid"], P.get(f"h{l}.ln2_g", 1.0), m2, r2, rms)
    # attention branch
    g("Wo", matmul_atb(c["ctx"], rg(dx)))
    g("bo", bias_grad(dx))
    dctx = through("Wo", c["ctx"], dx)
    q, k, v = c["qkv"]
    # the attention's D = rowsum(dO * O) reads O as stored (rounded where the policy rounds),
    # as the model's does
    dq, dk, dv = attend_bwd(q.reshape(B, T, QC), k.reshape(B, T, QC), v.reshape(B, T, QC),
                            dctx.reshape(B, T, QC), H, out=c["ctx"].reshape(B, T, QC), **windowed)
    dq, dk, dv = _qkv_backward(P, G, cfg, l, c, (d.reshape(B * T, QC) for d in (dq, dk, dv)), unrot)
    h1 = c["ln1"][0]
    dln1 = through("Wq", h1, dq) + through("Wk", h1, dk) + through("Wv", h1, dv)
    for n, d in (("q", dq), ("k", dk), ("v", dv)):
        g("W" + n, matmul_atb(h1, rg(d)))
        g("b" + n, bias_grad(d))
    _, m1, r1 = c["ln1"]
    dg, db = layernorm_dgb(dln1, c["x"], m1, r1, rms)
    g("ln1_g", dg)
    g("ln1_b", db)
    dx = dx + layernorm_dx(dln1, c["x"], P.get(f"h{l}.ln1_g", 1.0), m1, r1, rms)
    return dx


def clip_and_step(params, grads, opt, cfg: Config, lr: float, settings, shapes=None):
    """Global-norm clip then the optimizer `settings` name (model.optimizers' settings), in place,
    of the parameters `shapes` names (every one by default; a LoRA run's trainable ones:
    core.lora.trainable_shapes). opt: new_opt_state's. Returns the norm."""
    return optim_step(params, grads, opt, cfg, lr, settings, shapes)


def new_opt_state(params, settings):
    return new_state(params, settings)
