"""One transformer block, written once: its forward serves training, the prefill and the decode
step; its backward serves training.

    x_mid = x + Wo(attention(rot(qkn(Wq norm1(x))), rot(qkn(Wk norm1(x))), Wv norm1(x)))
    x_out = x_mid + W_out(act(W_in norm2(x_mid)))

The caller gives the block its weights (as the matmuls read them) and its activations (saved
per layer in training, one reused set in the decode step), and the attention as a function of
(q, k, v, out). Precision enters only through the tensors' dtypes and the policy's kernels
(PolicyKernels): where the attention reads float32 copies of what is stored, `convert` fills them.
The parts (core.block's Block: norm, activation, position) enter through PolicyKernels too; a
rotary model's q and k are turned where they are stored (Rotary), before any copy is made; with
QK-norm (qkn, each head's RMSNorm) the projections write float32 q and k, which the norm reads and
stores as the policy stores q and k, before RoPE turns them.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..core.block import Block
from ..core.precision import Precision
from ..device.gpu import DTYPES, Tensor
from ..device.kernels import Kernels

MATRICES = ("Wq", "Wk", "Wv", "Wo", "fc_gate_W", "fc_in_W", "fc_out_W")
VECTORS = ("bq", "bk", "bv", "bo", "fc_gate_b", "fc_in_b", "fc_out_b")


class PolicyKernels:
    """A precision policy's kernels for each role (core.precision), bound to one device's launchers,
    with the model's parts (core.block): its norm's form and eps, its MLP's activation."""

    def __init__(self, kn: Kernels, policy: Precision, block: Block):
        self.kn, self.policy, self.block = kn, policy, block
        self.rms = block.norm.rms

    def _k(self, role: str):
        return getattr(self.kn, self.policy.kernels[role])

    def layernorm(self, x, gb, y, stats, rows, C):
        """The block's norm: gb its [g | b] (RMSNorm's g alone)."""
        return self.kn.layernorm_forward(x, gb, y, stats, rows, C, eps=self.block.eps, rms=self.rms)

    def norm_f32(self, x, gb, y, stats, rows, C):
        """The block's norm writing float32 (the embedding's norm, into the residual stream)."""
        return self.kn.layernorm_forward(x, gb, y, stats, rows, C, eps=self.block.eps, rms=self.rms)

    def norm_dx(self, dy, x, g, stats, dx, rows, C, accumulate=True):
        return self.kn.layernorm_dx(dy, x, g, stats, dx, rows, C, accumulate=accumulate, rms=self.rms)

    def norm_dgb(self, dy, x, stats, dgb, rows, C):
        return self.kn.layernorm_dgb(dy, x, stats, dgb, rows, C, rms=self.rms)

    def qk_norm(self, x, g, y, stats, rows, hd):
        """QK-norm: RMSNorm over each head's hd channels (x [rows, hd]), whatever the block's norm."""
        return self.kn.layernorm_forward(x, g, y, stats, rows, hd, eps=self.block.eps, rms=True)

    def qk_norm_dx(self, dy, x, g, stats, dx, rows, hd):
        return self.kn.layernorm_dx(dy, x, g, stats, dx, rows, hd, accumulate=False, rms=True)

    def qk_norm_dg(self, dy, x, stats, dg, rows, hd):
        return self.kn.layernorm_dgb(dy, x, stats, dg, rows, hd, rms=True)

    def matmul(self, a, b, bias, out, M, N, K, accumulate=False):
        return self.kn.matmul(a, b, bias, out, M, N, K, accumulate, dtype=self.policy.stored)

    def matmul_abt(self, a, b, out, M, N, K, accumulate=False, bias=None):
        return self.kn.matmul_abt(a, b, out, M, N, K, accumulate, dtype=self.policy.stored, bias=bias)

    def matmul_atb(self, a, b, out, M, N, K, accumulate=False):
        return self.kn.matmul_atb(a, b, out, M, N, K, accumulate, dtype=self.policy.stored)

    def act_forward(self, x, out, n, gate=None):
        """The MLP's activation (a gated one's of gate and x, its up projection)."""
        mlp = self.block.mlp
        if mlp.gated:
            return getattr(self.kn, mlp.forward)(gate, x, out, n)
        return self.kn.act_forward(mlp.act, x, out, n)

    def act_backward(self, x, dy, out, n, gate=None, dgate=None):
        """out: d(x); a gated activation's d(gate) into dgate."""
        mlp = self.block.mlp
        if mlp.gated:
            return getattr(self.kn, mlp.backward)(gate, x, dy, dgate, out, n)
        return self.kn.act_backward(mlp.act, x, dy, out, n)

    def convert(self, src: Tensor, dst: Tensor, n: int) -> list:
        """dst = src in dst's dtype; nothing where they are one tensor."""
        if src is dst:
            return []
        return [self._k("from_f32" if DTYPES[dst.dtype].packed else "to_f32")(src, dst, n)]


@dataclass
class Rotary:
    """RoPE's place in a block: the (cos, sin) table [positions, hd/2, 2] (core.rope), the window of
    T positions that rows repeat (row r is position r % T + offset) and the head dim. The decode
    step's is T = 1 with the offset its position, rewritten per token (model.decode). A packed
    model's rows are at their positions in their records instead (docs, the batch's)."""
    cs: Tensor
    T: int
    hd: int
    offset: int = 0
    docs: Tensor | None = None

    def forward(self, kn: Kernels, x: Tensor, rows: int, C: int) -> list:
        return [kn.rope.rope_forward(self.cs, x, rows, self.T, C, self.hd, self.offset, self.docs)]

    def backward(self, kn: Kernels, dx: Tensor, rows: int, C: int) -> list:
        return [kn.rope.rope_backward(self.cs, dx, rows, self.T, C, self.hd, self.offset, self.docs)]

    def turned(self, kn: Kernels, entry: str, a, b, bias, out, M: int, N: int, K: int,
               accumulate: bool) -> object:
        """The product that stores q or k (matmul or matmul_abt), turned as it stores them; None where
        the kernels have no turned form for it (Kernels.matmul_turned: float32 q and k; nor packed rows)."""
        if self.docs is not None:
            return None
        return kn.matmul_turned(entry, a, b, bias, out, M, N, K, accumulate, self.cs, self.T, self.hd, self.offset)

    def forward_normed(self, kn: Kernels, xr: Tensor, g: Tensor, x: Tensor, stats: Tensor, rows: int, C: int,
                       eps: float) -> list:
        """QK-norm of the float32 xr into x, turned as it is written (rope.wgsl's qk_norm_rope)."""
        return [kn.rope.qk_norm_rope(self.cs, xr, g, x, stats, rows, self.T, C, self.hd, self.offset, eps, self.docs)]

    def backward_normed(self, kn: Kernels, dy: Tensor, xr: Tensor, g: Tensor, stats: Tensor, dx: Tensor, rows: int,
                        C: int) -> list:
        """forward_normed's gradient to xr where g takes none: dy turned back as QK-norm's dx reads it."""
        return [kn.rope.qk_norm_rope_dx(self.cs, dy, xr, g, stats, dx, rows, self.T, C, self.hd, self.offset,
                                        self.docs)]


@dataclass
class BlockWeights:
    """One block's weights: each matrix as the matmuls read it, float32 biases (None where the
    block has none), [g | b] of each LayerNorm as one [2, C] tensor and the gains alone
    (layernorm_dx reads them); with QK-norm the gains [hd] of q's and k's (ones where it has none).
    out_in: the matrices are held [out, in] and read by A @ B^T (RunSpec.out_in), else [in, out]."""
    W: dict
    b: dict
    ln1: Tensor
    ln2: Tensor
    g1: Tensor
    g2: Tensor
    qk_g: tuple = ()
    out_in: bool = False


@dataclass
class BlockLoRA:
    """One block's adapters (core.lora): for each targeted matrix name, A [R, in] and B [out, R]
    as the matmuls read them, its saved s (x A^T) [rows, R] (hs), and where their gradients go
    (dA, dB; absent in a model without a backward). h and gs: shared [rows, R] scratch (the
    unscaled product, and s (dy B) in the backward); y: a float32 [rows, >= out] sum for the
    outputs stored in 16 bits, which the adapter's product joins before the one rounding (None
    where nothing is stored so)."""
    R: int
    scale: float
    A: dict
    B: dict
    hs: dict
    dA: dict
    dB: dict
    h: Tensor
    gs: Tensor
    y: Tensor | None


def _cols(t: Tensor, rows: int, cols: int) -> Tensor:
    """The first [rows, cols] of a float32 scratch (a 16-bit output's float32 sum)."""
    return Tensor(t.buf, t.offset, (rows, cols), t.dtype, t.name)


def linear(kn: Kernels, pk: PolicyKernels, lo: BlockLoRA | None, name: str, x, W, bias, out, rows: int, N: int,
           K: int, rot: Rotary | None = None, out_in: bool = False) -> list:
    """out = x W + bias (W held [in, out]; x W^T + bias where out_in: held [out, in]), and where
    `name` has an adapter, + s (x A^T) B^T summed before out is stored (a 16-bit out gets the
    float32 sum in lo.y, then one rounding). rot: RoPE's turn of out (a rotary model's q or k),
    made by the product that stores out where it has a turned form (Rotary.turned), else in a
    pass after it."""
    adapted = lo is not None and name in lo.A
    y = _cols(lo.y, rows, N) if adapted and DTYPES[out.dtype].packed else out
    entry = "matmul_abt" if out_in else "matmul"
    if adapted:
        ds = [_product(pk, entry, x, W, bias, y, rows, N, K, False), pk.matmul_abt(x, lo.A[name], lo.h, rows, lo.R, K),
              kn.scale(lo.h, lo.hs[name], rows * lo.R, lo.scale)]
        last = ("matmul_abt", lo.hs[name], lo.B[name], None, y, rows, N, lo.R, True)    # the sum's last term
    else:
        ds, last = [], (entry, x, W, bias, y, rows, N, K, False)
    turned = rot.turned(kn, *last) if rot is not None and y is out else None
    if turned is not None:
        return ds + [turned]
    ds.append(_product(pk, *last))
    ds += pk.convert(y, out, rows * N)
    return ds + (rot.forward(kn, out, rows, N) if rot is not None else [])


def _product(pk: PolicyKernels, entry: str, a, b, bias, out, M: int, N: int, K: int, accumulate: bool):
    """out (+)= a @ b + bias ("matmul") or a @ b^T + bias ("matmul_abt")."""
    if entry == "matmul":
        return pk.matmul(a, b, bias, out, M, N, K, accumulate)
    return pk.matmul_abt(a, b, out, M, N, K, accumulate, bias=bias)


def linear_backward(kn: Kernels, pk: PolicyKernels, lo: BlockLoRA | None, G: dict, name: str, bias: str, x, W, dy,
                    dx, rows: int, N: int, K: int, accumulate: bool = False) -> list:
    """The gradients of out = linear(x): of W and the bias where G has a place for them (a
    frozen one has none), of the adapter where `name` has one, and dx (+)= dy W^T (+ its path
    through the adapter)."""
    ds = [pk.matmul_abt(dy, W, dx, rows, K, N, accumulate=accumulate)]
    if name in G:
        ds.append(pk.matmul_atb(x, dy, G[name], K, N, rows))
    if bias in G:
        ds.append(kn.bias_grad(dy, G[bias], rows, N))
    if lo is not None and name in lo.A:
        R = lo.R
        ds += [pk.matmul_atb(dy, lo.hs[name], lo.dB[name], N, R, rows),          # dB = dy^T s h
               pk.matmul(dy, lo.B[name], None, lo.h, rows, R, N),                 # dy B
               kn.scale(lo.h, lo.gs, rows * R, lo.scale),                         # s dy B
               pk.matmul_atb(lo.gs, x, lo.dA[name], R, K, rows),                  # dA = (s dy B)^T x
               pk.matmul(lo.gs, lo.A[name], None, dx, rows, K, R, accumulate=True)]
    return ds


@dataclass
class BlockActs:
    """One block's activations for `rows` rows. att_in: q, k, v as the attention reads them (the
    same tensors, or float32 copies); att_out: what the attention writes (ctx, or its float32 copy)."""
    x: Tensor
    x_mid: Tensor
    x_out: Tensor
    ln1: Tensor
    ln1s: Tensor
    qkv: tuple
    ctx: Tensor
    ln2: Tensor
    ln2s: Tensor
    pre: Tensor
    gel: Tensor
    tmp: Tensor
    att_in: tuple
    att_out: Tensor
    qk_raw: tuple = ()       # with QK-norm: the projections' float32 q, k, and their rows' stats [2, rows * H]
    qk_stats: tuple = ()
    kv: tuple = ()           # grouped-query attention: k and v [rows, KV * hd] as stored, before kv_expand
    gate: Tensor | None = None   # a gated MLP's gate projection [rows, M], as stored


def block_forward(kn: Kernels, pk: PolicyKernels, w: BlockWeights, a: BlockActs, attend, rows: int, C: int,
                  M: int, lo: BlockLoRA | None = None, rot: Rotary | None = None) -> list:
    """The block's dispatches; attend(q, k, v, out) -> the attention's; lo: its adapters, if any;
    rot: where RoPE turns q and k (a rotary model's)."""
    lin = lambda name, x, bias, out, N, K, rot=None: linear(kn, pk, lo, name, x, w.W[name], w.b[bias], out, rows, N,
                                                            K, rot, w.out_in)
    hs = pk.block.heads
    QC = hs.q_width                                     # q's and the attention's width (C, or H hd set apart)
    ds = [pk.layernorm(a.x, w.ln1, a.ln1, a.ln1s, rows, C)]
    for i, (n, t, t_in) in enumerate(zip("qkv", a.qkv, a.att_in)):
        width = QC if n == "q" else hs.kv_width        # k, v: KV heads (grouped-query attention)
        own = a.kv[i - 1] if a.kv and n != "q" else t   # where the projection's heads are stored
        if a.qk_raw and n != "v":                      # QK-norm: float32 q (k), each head normed into own
            ds += lin("W" + n, a.ln1, "b" + n, a.qk_raw[i], width, C)
            if rot is not None:                         # and turned as it is written there: one pass
                ds += rot.forward_normed(kn, a.qk_raw[i], w.qk_g[i], own, a.qk_stats[i], rows, width, pk.block.eps)
            else:
                ds.append(pk.qk_norm(a.qk_raw[i], w.qk_g[i], own, a.qk_stats[i], rows * width // hs.hd, hs.hd))
        else:                                           # q and k turned where they are stored
            ds += lin("W" + n, a.ln1, "b" + n, own, width, C, rot if n != "v" else None)
        if own is not t:                                # each kv head copied to its query heads
            ds.append(kn.kv_expand(own, t, rows, hs.q, hs.kv, hs.hd))
        ds += pk.convert(t, t_in, rows * QC)
    ds += attend(*a.att_in, a.att_out)
    ds += pk.convert(a.att_out, a.ctx, rows * QC)
    ds += lin("Wo", a.ctx, "bo", a.tmp, C, QC)
    ds += [kn.add(a.x, a.tmp, a.x_mid, rows * C),
           pk.layernorm(a.x_mid, w.ln2, a.ln2, a.ln2s, rows, C)]
    ds += lin("fc_in_W", a.ln2, "fc_in_b", a.pre, M, C)
    if a.gate is not None:
        ds += lin("fc_gate_W", a.ln2, "fc_gate_b", a.gate, M, C)
    ds.append(pk.act_forward(a.pre, a.gel, rows * M, a.gate))
    ds += lin("fc_out_W", a.gel, "fc_out_b", a.tmp, C, M)
    return ds + [kn.add(a.x_mid, a.tmp, a.x_out, rows * C)]


@dataclass
class BlockGrads:
    """Where the block's backward writes: the weights' gradients (G: name -> tensor, LayerNorms as
    [2, C] under "ln1", "ln2") and the shared gradients of activations. dres holds the gradient of
    x_out on entry and of x on return."""
    G: dict
    dres: Tensor
    dln: Tensor
    dact: Tensor
    dpre: Tensor
    dctx: Tensor
    dqkv: tuple
    dqk_raw: Tensor | None = None      # with QK-norm: the gradient of the float32 q or k, one at a time
    dkv: tuple = ()                    # grouped-query attention: the gradients of k and v [rows, KV * hd]
    dgate: Tensor | None = None        # a gated MLP's: the gradient of its gate projection


def block_backward(kn: Kernels, pk: PolicyKernels, w: BlockWeights, a: BlockActs, g: BlockGrads, attention,
                   rows: int, C: int, M: int, lo: BlockLoRA | None = None, rot: Rotary | None = None) -> list:
    """The block's backward; attention: its Attention, which recomputes or reads what it saved.
    A parameter without a place in g.G is frozen: no gradient is computed for it. rot: as
    block_forward's (the gradients of the turned q and k turned back)."""
    G = g.G
    lin = lambda name, bias, x, dy, dx, N, K, acc=False: linear_backward(kn, pk, lo, G, name, bias, x, w.W[name], dy,
                                                                         dx, rows, N, K, acc)
    ln_dgb = lambda x, stats, ln: [pk.norm_dgb(g.dln, x, stats, G[ln], rows, C)] if ln in G else []
    hs = pk.block.heads
    QC = hs.q_width
    ds = pk.convert(a.ctx, a.att_out, rows * QC)           # refill what the attention reads in float32
    for t, t_in in zip(a.qkv, a.att_in):
        ds += pk.convert(t, t_in, rows * QC)
    ds += lin("fc_out_W", "fc_out_b", a.gel, g.dres, g.dact, C, M)
    ds.append(pk.act_backward(a.pre, g.dact, g.dpre, rows * M, a.gate, g.dgate))
    ds += lin("fc_in_W", "fc_in_b", a.ln2, g.dpre, g.dln, M, C)
    if a.gate is not None:
        ds += lin("fc_gate_W", "fc_gate_b", a.ln2, g.dgate, g.dln, M, C, True)
    ds += ln_dgb(a.x_mid, a.ln2s, "ln2")
    ds.append(pk.norm_dx(g.dln, a.x_mid, w.g2, a.ln2s, g.dres, rows, C))
    ds += lin("Wo", "bo", a.ctx, g.dres, g.dctx, C, QC)
    # without QK-norm, the attention may turn dq and dk back where it stores them (else a pass below)
    back = rot if rot is not None and not a.qk_raw and attention.turns_back(rot) else None
    ds += attention.backward(*a.att_in, a.att_out, g.dctx, *g.dqkv, rot=back)
    dqkv = g.dqkv
    if a.kv:                                      # each kv head's gradient: the sum over its query heads
        ds += [kn.kv_reduce(d, dkv, rows, hs.q, hs.kv, hs.hd) for d, dkv in zip(g.dqkv[1:], g.dkv)]
        dqkv = (g.dqkv[0],) + tuple(g.dkv)
    widths = (QC, hs.kv_width, hs.kv_width)
    for i, (n, d, width) in enumerate(zip("qkv", dqkv, widths)):
        turned = rot is not None and n != "v"
        if a.qk_raw and n != "v":                   # back through QK-norm, into the float32 q (k)'s gradient
            heads, gain = rows * width // hs.hd, n + "_norm_g"
            if turned and gain not in G:            # turned back as its dx reads it: one pass
                ds += rot.backward_normed(kn, d, a.qk_raw[i], w.qk_g[i], a.qk_stats[i], g.dqk_raw, rows, width)
            else:
                ds += rot.backward(kn, d, rows, width) if turned else []
                if gain in G:
                    ds.append(pk.qk_norm_dg(d, a.qk_raw[i], a.qk_stats[i], G[gain], heads, hs.hd))
                ds.append(pk.qk_norm_dx(d, a.qk_raw[i], w.qk_g[i], a.qk_stats[i], g.dqk_raw, heads, hs.hd))
            d = g.dqk_raw
        elif turned and back is None:
            ds += rot.backward(kn, d, rows, width)
        ds += lin("W" + n, "b" + n, a.ln1, d, g.dln, width, C, i > 0)
    return ds + ln_dgb(a.x, a.ln1s, "ln1") + [pk.norm_dx(g.dln, a.x, w.g1, a.ln1s, g.dres, rows, C)]
