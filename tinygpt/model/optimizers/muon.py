"""Muon (Jordan et al., 2024): on every weight matrix inside the blocks (q, k, v, o and the MLP's
two), momentum with Nesterov, then five quintic Newton-Schulz iterations towards the nearest
orthogonal matrix; embeddings, biases and LayerNorms by AdamW in the same step.

Its learning rate by shape is torch.optim.Muon's "match_rms_adamw" rule: lr 0.2 sqrt(max(rows,
cols)), which gives the orthogonalised update the RMS of a typical AdamW update, so that one
learning rate (and one weight decay) serves both the matrices and the AdamW part, as in Moonshot's
Muon (Liu et al., 2025). Its "original" rule, max(1, rows / cols)^0.5, needs a second learning
rate, about 0.02, for the matrices: a second knob for every run to sweep.

State: "muon m" (a matrix's momentum, or AdamW's m of the rest) and "muon v" (AdamW's v; zero on
the matrices, which the file does not keep: its v slot holds m^2 there). Newton-Schulz runs in
float32 whatever the run's precision (the gradients and moments are float32; a 16-bit copy would
round every iteration), over a batch of matrices of one shape at a time (ns_batches) through the
shared scratch, each matrix batch_stride apart: X and its next value, B X, and the [r, r] A, A A
and B of r = the smaller side. Its kernels are muon.wgsl's and the matmuls.
"""
from __future__ import annotations

import math

import numpy as np

from ...core.config import ADAMW_BETA1, ADAMW_BETA2, ADAMW_EPS, Config, TrainDefaults, param_shapes
from ...device.gpu import GPU, Tensor, pack_uniform
from ...device.kernels import Kernels, batch_stride
from ..buffers import OP, Buffer
from .adamw import AdamW
from .base import Hyper, Optimizer

MUON_MATRICES = ("Wq", "Wk", "Wv", "Wo", "fc_gate_W", "fc_in_W", "fc_out_W")   # the blocks' matrices
NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)      # a, b, c of X <- a X + (b A + c A^2) X, A = X X^T
NS_STEPS = 5
NS_EPS = 1e-7                                    # the Frobenius norm's floor before the iterations
# Newton-Schulz runs over a batch of matrices of one shape in each dispatch while the batch holds
# at most this many floats (4 MiB): small matrices' iterations are too short to fill a dispatch
# alone (docs/results.md, "Optimizers": batched against one matrix at a time), while a matrix of
# GPT-2 small's, 768 x 3072, fills one by itself and takes no scratch beyond its own.
NS_BATCH_FLOATS = 1 << 20


def is_muon_matrix(name: str) -> bool:
    """A parameter Muon orthogonalises: one of the blocks' matrices ("hL.Wq", ...)."""
    return name.partition(".")[2] in MUON_MATRICES


def ns_batches(shapes) -> list:
    """[((K, N), [names])]: Muon's matrices among a parameter list [(name, shape, ...)] grouped by shape in
    the order they come, each group cut into batches of at most NS_BATCH_FLOATS floats (one matrix
    at least): one Newton-Schulz, dispatch by dispatch, for each batch."""
    groups: dict = {}
    for name, shape, *_ in shapes:
        if is_muon_matrix(name):
            groups.setdefault(tuple(shape), []).append(name)
    out = []
    for (K, N), names in groups.items():
        per = max(1, NS_BATCH_FLOATS // (K * N))
        out += [((K, N), names[i:i + per]) for i in range(0, len(names), per)]
    return out


def muon_ratio(shape) -> float:
    """The learning rate's scale for a matrix of this shape: match_rms_adamw's 0.2 sqrt(max)."""
    return 0.2 * math.sqrt(max(shape))


class Muon(Optimizer):
    name = "muon"
    summary = ("muon (the blocks' matrices orthogonalised by Newton-Schulz, the rest by AdamW; "
               "torch.optim.Muon's match_rms_adamw lr scaling)")
    hypers = {"beta1": Hyper(ADAMW_BETA1, "muon's AdamW part's first-moment decay", "beta1"),
              "beta2": Hyper(ADAMW_BETA2, "muon's AdamW part's second-moment decay", "beta2"),
              "eps": Hyper(ADAMW_EPS),
              "momentum": Hyper(0.95, "muon's momentum on the matrices, with Nesterov", "momentum"),
              "nesterov": Hyper(True)}
    state_rows = ("muon m", "muon v")
    # tiny's best lr was 2e-2 (5e-3 to 4e-2 tried); small's stayed AdamW's 1e-2 (2e-2 scored
    # worse); medium was not swept (docs/results.md, "Optimizers")
    schedules = {"tiny": TrainDefaults(2000, 2e-2, 200, 1e-4)}
    SCRATCH = (("ns x", "NSX"), ("ns x next", "NSX"), ("ns bx", "NSX"), ("ns a", "NSG"), ("ns aa", "NSG"),
               ("ns b", "NSG"))

    @classmethod
    def kept(cls, s, row, name):
        return not (row == "muon v" and is_muon_matrix(name))

    @classmethod
    def reference_step(cls, K, s, name, g, wd, gate, w, state, lr):
        if not is_muon_matrix(name):
            AdamW.twin(g, wd, gate, w, state["muon m"][name], state["muon v"][name], lr, *AdamW.constants(s))
            return
        u = np.zeros_like(g)
        K.muon_momentum(g, gate, state["muon m"][name], u, s.momentum, s.nesterov)
        K.muon_update(newton_schulz_twin(K, u), gate, w, lr, wd, muon_ratio(w.shape))

    def __init__(self, settings):
        super().__init__(settings)
        self.adamw = AdamW(AdamW.settings(settings.weight_decay, beta1=settings.beta1, beta2=settings.beta2,
                                             eps=settings.eps))
        self.adamw.state_rows = self.state_rows        # its moments in Muon's rows

    def rows(self) -> tuple:
        return super().rows() + tuple(Buffer(r, (s,), "f32", "shared", OP, "training") for r, s in self.SCRATCH)

    def sizes(self, cfg: Config) -> dict:
        batches = ns_batches(param_shapes(cfg))
        return {"NSX": max((len(b) * batch_stride(K * N) for (K, N), b in batches), default=0),
                "NSG": max((len(b) * batch_stride(min(K, N) ** 2) for (K, N), b in batches), default=0)}

    def record(self, f) -> list:
        kn = f.kn
        ds = self.adamw.record(f, mine=lambda name: not is_muon_matrix(name))
        self.update_uniform = f.gpu.uniform(16)
        G, P, Mo = f.views(f.grads), f.views(f.params), f.views(f.buf["muon m"])
        row = lambda name, n: Tensor(f.buf[name].buf, f.buf[name].offset, (n,), "f32", name)
        # the j-th matrix of a batch in a scratch row, bound alone
        slot = lambda t, j, K, N: Tensor(t.buf, t.offset + 4 * j * batch_stride(K * N), (K, N), "f32", t.name)
        for (K, N), names in ns_batches(f.trainable):
            b, r = len(names), min(K, N)
            sx, sg = b * batch_stride(K * N), b * batch_stride(r * r)
            xs = [row("ns x", sx), row("ns x next", sx)]
            for j, name in enumerate(names):
                ds.append(kn.optim.muon_momentum(G[name], f.gate, Mo[name], slot(xs[0], j, K, N), K * N,
                                           self.s.momentum, self.s.nesterov))
            ns, out = newton_schulz(kn, xs, row("ns bx", sx), row("ns a", sg), row("ns aa", sg),
                                    row("ns b", sg), K, N, b)
            ds += ns
            for j, name in enumerate(names):
                ds.append(kn.optim.muon_update(slot(out, j, K, N), f.gate, P[name], K * N, muon_ratio((K, N)),
                                         self.update_uniform))
        return ds

    def write_step(self, gpu: GPU, lr: float):
        self.adamw.write_step(gpu, lr)
        gpu.write_uniform(self.update_uniform, pack_uniform((0, float(lr), float(self.s.weight_decay), 0)))


def newton_schulz(kn: Kernels, xs: list, bx: Tensor, A: Tensor, AA: Tensor, B: Tensor, K: int, N: int,
                  batch: int = 1):
    """(dispatches, the tensor that holds the result): xs[0], `batch` [K, N] matrices
    batch_stride(K N) apart, each normalised, then NS_STEPS quintic iterations between xs[0] and
    xs[1]; bx (as xs) and A, AA, B ([r, r] matrices, r = min(K, N), batch_stride(r r) apart) are
    scratch. newton_schulz_twin is its twin."""
    a, b, c = NS_COEFFICIENTS
    n, r = K * N, min(K, N)
    ds = [kn.optim.muon_normalize(xs[0], n, NS_EPS, batch)]
    for i in range(NS_STEPS):
        X, Y = xs[i % 2], xs[1 - i % 2]
        # A = X X^T of the wide orientation: a tall matrix [K > N] is worked on as its transpose,
        # X^T X and X B, so that no transpose is ever written
        ds.append(kn.matmul_atb(X, X, A, r, r, K, batch=batch) if K > N else
                  kn.matmul_abt(X, X, A, r, r, N, batch=batch))
        ds += [kn.matmul(A, A, None, AA, r, r, r, batch=batch), kn.optim.ns_mix(A, AA, B, r * r, b, c, batch)]
        ds.append(kn.matmul(X, B, None, bx, K, N, N, batch=batch) if K > N else
                  kn.matmul(B, X, None, bx, K, N, K, batch=batch))
        ds.append(kn.optim.ns_mix(X, bx, Y, n, a, 1.0, batch))
    return ds, xs[NS_STEPS % 2]


def newton_schulz_twin(K, x: np.ndarray) -> np.ndarray:
    """newton_schulz's twin, of the twins K (reference.kernels): normalise, then NS_STEPS quintic
    iterations X <- a X + (b A + c A A) X with A = X X^T, a tall matrix worked on as its transpose
    (X^T X and X B, which is the same arithmetic on X^T). x [batch, K, N]: each matrix alone."""
    a, b, c = NS_COEFFICIENTS
    x = K.muon_normalize(x, NS_EPS)
    tall = x.shape[-2] > x.shape[-1]
    for _ in range(NS_STEPS):
        A = K.matmul_atb(x, x) if tall else K.matmul_abt(x, x)
        B = K.ns_mix(A, K.matmul(A, A), b, c)
        x = K.ns_mix(x, K.matmul(x, B) if tall else K.matmul(B, x), a, 1.0)
    return x
