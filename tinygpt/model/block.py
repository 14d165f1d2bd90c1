"""One transformer block, written once: its forward serves training, the prefill and the decode
step; its backward serves training.

    x_mid = x + Wo(attention(Wq ln1(x), Wk ln1(x), Wv ln1(x)))
    x_out = x_mid + W_out(gelu(W_in ln2(x_mid)))

The caller gives the block its weights (as the matmuls read them) and its activations (saved
per layer in training, one reused set in the decode step), and the attention as a function of
(q, k, v, out). Precision enters only through the tensors' dtypes and the policy's kernels
(PolicyKernels): where the attention reads float32 copies of what is stored, `convert` fills them.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..core.precision import Precision
from ..device.gpu import Tensor
from ..device.kernels import Kernels

MATRICES = ("Wq", "Wk", "Wv", "Wo", "fc_in_W", "fc_out_W")
VECTORS = ("bq", "bk", "bv", "bo", "fc_in_b", "fc_out_b")


class PolicyKernels:
    """A precision policy's kernels for each role (core.precision), bound to one device's launchers,
    with the model's activation (the GELU kernels' form)."""

    def __init__(self, kn: Kernels, policy: Precision, activation: str = "gelu"):
        self.kn, self.policy, self.tanh = kn, policy, activation == "gelu_tanh"

    def _k(self, role: str):
        return getattr(self.kn, self.policy.kernels[role])

    def layernorm(self, x, gb, y, stats, rows, C):
        return self._k("layernorm")(x, gb, y, stats, rows, C)

    def matmul(self, a, b, bias, out, M, N, K, accumulate=False):
        return self._k("matmul")(a, b, bias, out, M, N, K, accumulate)

    def matmul_abt(self, a, b, out, M, N, K, accumulate=False):
        return self._k("matmul_abt")(a, b, out, M, N, K, accumulate)

    def matmul_atb(self, a, b, out, M, N, K, accumulate=False):
        return self._k("matmul_atb")(a, b, out, M, N, K, accumulate)

    def gelu_forward(self, x, out, n):
        return self._k("gelu_forward")(x, out, n, tanh=self.tanh)

    def gelu_backward(self, x, dy, out, n):
        return self._k("gelu_backward")(x, dy, out, n, tanh=self.tanh)

    def convert(self, src: Tensor, dst: Tensor, n: int) -> list:
        """dst = src in dst's dtype; nothing where they are one tensor."""
        if src is dst:
            return []
        return [self._k("to_f32" if dst.dtype == "f32" else "from_f32")(src, dst, n)]


@dataclass
class BlockWeights:
    """One block's weights: each matrix as the matmuls read it, float32 biases, [g | b] of each
    LayerNorm as one [2, C] tensor and the gains alone (layernorm_dx reads them)."""
    W: dict
    b: dict
    ln1: Tensor
    ln2: Tensor
    g1: Tensor
    g2: Tensor


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


def block_forward(kn: Kernels, pk: PolicyKernels, w: BlockWeights, a: BlockActs, attend, rows: int, C: int,
                  M: int) -> list:
    """The block's dispatches; attend(q, k, v, out) -> the attention's."""
    ds = [pk.layernorm(a.x, w.ln1, a.ln1, a.ln1s, rows, C)]
    for n, t, t_in in zip("qkv", a.qkv, a.att_in):
        ds.append(pk.matmul(a.ln1, w.W["W" + n], w.b["b" + n], t, rows, C, C))
        ds += pk.convert(t, t_in, rows * C)
    ds += attend(*a.att_in, a.att_out)
    ds += pk.convert(a.att_out, a.ctx, rows * C)
    return ds + [pk.matmul(a.ctx, w.W["Wo"], w.b["bo"], a.tmp, rows, C, C),
                 kn.add(a.x, a.tmp, a.x_mid, rows * C),
                 pk.layernorm(a.x_mid, w.ln2, a.ln2, a.ln2s, rows, C),
                 pk.matmul(a.ln2, w.W["fc_in_W"], w.b["fc_in_b"], a.pre, rows, M, C),
                 pk.gelu_forward(a.pre, a.gel, rows * M),
                 pk.matmul(a.gel, w.W["fc_out_W"], w.b["fc_out_b"], a.tmp, rows, C, M),
                 kn.add(a.x_mid, a.tmp, a.x_out, rows * C)]


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


def block_backward(kn: Kernels, pk: PolicyKernels, w: BlockWeights, a: BlockActs, g: BlockGrads, attention,
                   rows: int, C: int, M: int) -> list:
    """The block's backward; attention: its Attention, which recomputes or reads what it saved."""
    G = g.G
    ds = pk.convert(a.ctx, a.att_out, rows * C)            # refill what the attention reads in float32
    for t, t_in in zip(a.qkv, a.att_in):
        ds += pk.convert(t, t_in, rows * C)
    ds += [pk.matmul_atb(a.gel, g.dres, G["fc_out_W"], M, C, rows),
           kn.bias_grad(g.dres, G["fc_out_b"], rows, C),
           pk.matmul_abt(g.dres, w.W["fc_out_W"], g.dact, rows, M, C),
           pk.gelu_backward(a.pre, g.dact, g.dpre, rows * M),
           pk.matmul_atb(a.ln2, g.dpre, G["fc_in_W"], C, M, rows),
           kn.bias_grad(g.dpre, G["fc_in_b"], rows, M),
           pk.matmul_abt(g.dpre, w.W["fc_in_W"], g.dln, rows, C, M),
           kn.layernorm_dgb(g.dln, a.x_mid, a.ln2s, G["ln2"], rows, C),
           kn.layernorm_dx(g.dln, a.x_mid, w.g2, a.ln2s, g.dres, rows, C),
           pk.matmul_atb(a.ctx, g.dres, G["Wo"], C, C, rows),
           kn.bias_grad(g.dres, G["bo"], rows, C),
           pk.matmul_abt(g.dres, w.W["Wo"], g.dctx, rows, C, C)]
    ds += attention.backward(*a.att_in, a.att_out, g.dctx, *g.dqkv)
    for i, (n, d) in enumerate(zip("qkv", g.dqkv)):
        ds += [pk.matmul_abt(d, w.W["W" + n], g.dln, rows, C, C, accumulate=i > 0),
               pk.matmul_atb(a.ln1, d, G["W" + n], C, C, rows),
               kn.bias_grad(d, G["b" + n], rows, C)]
    return ds + [kn.layernorm_dgb(g.dln, a.x, a.ln1s, G["ln1"], rows, C),
                 kn.layernorm_dx(g.dln, a.x, w.g1, a.ln1s, g.dres, rows, C)]
