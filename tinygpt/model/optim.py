"""The optimizers on the device, and the gate that wraps them.

Each optimizer is one object made from its settings (core.optim) that
  (a) adds its state's rows (and any scratch) to the buffer table: `rows`, `sizes`, so the memory
      budget and the allocation keep agreeing;
  (b) records its dispatches over the flat parameter and gradient buffers the model hands it
      (`Flat`): `record`, and rewrites its step's uniforms before each step: `write_step`;
  (c) owns its state: `state_rows` name the flat buffers (in the parameter layout) that hold it,
      which the model reads and writes for the saver and the resume; `steps` counts the updates
      taken (the gate's count, on the device).

The gate (grad_norm.wgsl: the global norm, the clip factor and, for a precision that needs one,
the loss scaler) runs before any optimizer and leaves [norm, factor, ..., skip, ..., taken] in
one small buffer (kernels.GATE): every optimizer's kernels multiply the gradient by the factor,
change nothing on a skipped step and count their bias corrections from `taken`, so neither the
clip nor the scaler is a branch inside an optimizer.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..core.config import Config, param_specs
from ..core.optim import NS_COEFFICIENTS, NS_EPS, NS_STEPS, STATE_ROWS, OptimizerSettings, is_muon_matrix, \
    muon_ratio, ns_batches
from ..device.gpu import GPU, Tensor, pack_uniform
from ..device.kernels import CHUNK, GATE, NO_CLIP, OPTIM_UNIFORM_BYTES, SCALE_GROWTH, Kernels, batch_stride, \
    optim_uniform
from .layout import flat_view
from .buffers import OP, Buffer

STATE = "optimizer state"      # the memory budget's group of every optimizer's state


@dataclass
class Flat:
    """What the model hands an optimizer: its flat buffers, bound in `chunks` (first float,
    count) where they exceed one binding, the trainable parameters (name, shape, decayed) and
    where each lies, views of a flat buffer by parameter name, and the gate."""
    gpu: GPU
    kn: Kernels
    params: Tensor
    grads: Tensor
    gate: Tensor
    buf: dict           # the model's buffers by row name (the optimizer's own rows among them)
    chunks: list
    n: int
    specs: list
    offsets: dict
    views: object       # flat Tensor -> {name: Tensor [shape]}


class Gate:
    """Clip by the global norm, and the loss scaler where the precision needs one: the partial
    sums of squares chunk by chunk, then the gate. Its rows are the table's "norm partials" and
    "gate"."""

    def __init__(self, clip: float, scaled: bool):
        self.clip = clip if clip > 0 else NO_CLIP          # 0: never clip
        self.scaled = scaled

    def record(self, f: Flat, partials: Tensor) -> list:
        """The chunks start on whole blocks of the partial sums, so the norm is that of one
        dispatch, bit for bit."""
        kn, scaler = f.kn, f.gate if self.scaled else None     # the loss scaler: unscale, find infs
        ds = [kn.grad_sumsq(flat_view(f.grads, f0, k), partials, k, first=f0 // CHUNK, gate=scaler)
              for f0, k in f.chunks]
        return ds + [kn.grad_clip(partials, f.gate, -(-f.n // CHUNK), self.clip,
                                  growth=SCALE_GROWTH if self.scaled else None)]

    @staticmethod
    def read(gpu: GPU, gate: Tensor) -> dict:
        """The gate's values (GATE's names: norm, scale, skipped, taken, ...), one read."""
        s = gpu.read(gate)
        return {k: float(s[i]) for k, i in GATE.items()}

    @staticmethod
    def write(gpu: GPU, gate: Tensor, **values):
        """Set any of the gate's values (a resumed run's step count and loss scaler, the first scale)."""
        for key, val in values.items():
            if val is not None:
                gpu.write(gate, np.array([val], np.float32), offset_elems=GATE[key])


class Optimizer:
    """What every optimizer shares: the settings, the decay table's rows, the step's uniforms."""
    state_rows: tuple = ()
    name = ""

    def __init__(self, settings: OptimizerSettings):
        assert settings.name == self.name
        self.s = settings
        self.uniforms = []

    def rows(self) -> tuple:
        return tuple(Buffer(r, ("F",), "f32", "model", STATE, "training", "flat") for r in self.state_rows)

    def sizes(self, cfg: Config) -> dict:
        return {}

    def decay_table(self, f: Flat, mine=lambda name: True) -> np.ndarray:
        """The decay of each 256-float block: the weight decay where the parameter is decayed, 0
        where not, -1 where it is not this kernel's (mine(name) false)."""
        wd = np.zeros(f.n // 256, np.float32)
        for name, shape, decayed in f.specs:
            off = f.offsets[name][0]
            wd[off // 256: -(-(off + int(np.prod(shape))) // 256)] = \
                (self.s.weight_decay if decayed else 0.0) if mine(name) else -1.0
        return wd

    def _elementwise(self, f: Flat, launch, mine=lambda name: True) -> list:
        """One dispatch a chunk of an elementwise optimizer, its own uniform each (rewritten every step)."""
        f.gpu.write(f.buf["weight decay"], self.decay_table(f, mine))
        self.uniforms = [(f.gpu.uniform(OPTIM_UNIFORM_BYTES), f0, k) for f0, k in f.chunks]
        state = [f.buf[r] for r in self.state_rows]
        return [launch(flat_view(f.grads, f0, k), f.buf["weight decay"], f.gate, flat_view(f.params, f0, k),
                       *[flat_view(t, f0, k) for t in state[:2]], k, u) for u, f0, k in self.uniforms]

    def write_step(self, gpu: GPU, lr: float):
        for u, f0, k in self.uniforms:
            gpu.write_uniform(u, optim_uniform(k, lr, self.s.beta1, self.s.beta2, self.s.eps, f0 // 256))


class AdamW(Optimizer):
    """TinyGPT's AdamW over every trainable parameter. Its m and v are upstream's moments: the
    .tinygpt file's state holds them where TinyGPT's readers look for them."""
    name = "adamw"
    state_rows = STATE_ROWS[name]
    upstream_moments = True

    def record(self, f: Flat) -> list:
        return self._elementwise(f, f.kn.adamw)


class Lion(Optimizer):
    name = "lion"
    state_rows = STATE_ROWS[name]
    upstream_moments = False

    def record(self, f: Flat) -> list:
        return self._elementwise(f, lambda g, wd, gate, w, m, n, u: f.kn.lion(g, wd, gate, w, m, n, u))


class Muon(Optimizer):
    """The blocks' matrices by Muon, the rest by AdamW in the same step. State: "muon m" (a
    matrix's momentum, or AdamW's m of the rest) and "muon v" (AdamW's v; zero on the matrices).
    Newton-Schulz runs in float32 whatever the run's precision (the gradients and moments are
    float32; a 16-bit copy would round every iteration), over a batch of matrices of one shape at
    a time (core.optim.ns_batches) through the shared scratch, each matrix batch_stride apart: X
    and its next value, B X, and the [r, r] A, A A and B of r = the smaller side."""
    name = "muon"
    state_rows = STATE_ROWS[name]
    upstream_moments = False
    SCRATCH = (("ns x", "NSX"), ("ns x next", "NSX"), ("ns bx", "NSX"), ("ns a", "NSG"), ("ns aa", "NSG"),
               ("ns b", "NSG"))

    def rows(self) -> tuple:
        return super().rows() + tuple(Buffer(r, (s,), "f32", "shared", OP, "training")
                                      for r, s in self.SCRATCH)

    def sizes(self, cfg: Config) -> dict:
        batches = ns_batches(param_specs(cfg))
        return {"NSX": max((len(b) * batch_stride(K * N) for (K, N), b in batches), default=0),
                "NSG": max((len(b) * batch_stride(min(K, N) ** 2) for (K, N), b in batches), default=0)}

    def record(self, f: Flat) -> list:
        kn = f.kn
        ds = self._elementwise(f, kn.adamw, mine=lambda name: not is_muon_matrix(name))
        self.update_uniform = f.gpu.uniform(16)
        G, P, Mo = f.views(f.grads), f.views(f.params), f.views(f.buf["muon m"])
        row = lambda name, n: Tensor(f.buf[name].buf, f.buf[name].offset, (n,), "f32", name)
        # the j-th matrix of a batch in a scratch row, bound alone
        slot = lambda t, j, K, N: Tensor(t.buf, t.offset + 4 * j * batch_stride(K * N), (K, N), "f32", t.name)
        for (K, N), names in ns_batches(f.specs):
            b, r = len(names), min(K, N)
            sx, sg = b * batch_stride(K * N), b * batch_stride(r * r)
            xs = [row("ns x", sx), row("ns x next", sx)]
            for j, name in enumerate(names):
                ds.append(kn.muon_momentum(G[name], f.gate, Mo[name], slot(xs[0], j, K, N), K * N,
                                           self.s.momentum, self.s.nesterov))
            ns, out = newton_schulz(kn, xs, row("ns bx", sx), row("ns a", sg), row("ns aa", sg),
                                    row("ns b", sg), K, N, b)
            ds += ns
            for j, name in enumerate(names):
                ds.append(kn.muon_update(slot(out, j, K, N), f.gate, P[name], K * N, muon_ratio((K, N)),
                                         self.update_uniform))
        return ds

    def write_step(self, gpu: GPU, lr: float):
        super().write_step(gpu, lr)
        gpu.write_uniform(self.update_uniform, pack_uniform((0, float(lr), float(self.s.weight_decay), 0)))


def newton_schulz(kn: Kernels, xs: list, bx: Tensor, A: Tensor, AA: Tensor, B: Tensor, K: int, N: int,
                  batch: int = 1):
    """(dispatches, the tensor that holds the result): xs[0], `batch` [K, N] matrices
    batch_stride(K N) apart, each normalised, then NS_STEPS quintic iterations between xs[0] and
    xs[1]; bx (as xs) and A, AA, B ([r, r] matrices, r = min(K, N), batch_stride(r r) apart) are
    scratch. reference.optim.newton_schulz is its twin."""
    a, b, c = NS_COEFFICIENTS
    n, r = K * N, min(K, N)
    ds = [kn.muon_normalize(xs[0], n, NS_EPS, batch)]
    for i in range(NS_STEPS):
        X, Y = xs[i % 2], xs[1 - i % 2]
        # A = X X^T of the wide orientation: a tall matrix [K > N] is worked on as its transpose,
        # X^T X and X B, so that no transpose is ever written
        ds.append(kn.matmul_atb(X, X, A, r, r, K, batch=batch) if K > N else
                  kn.matmul_abt(X, X, A, r, r, N, batch=batch))
        ds += [kn.matmul(A, A, None, AA, r, r, r, batch=batch), kn.ns_mix(A, AA, B, r * r, b, c, batch)]
        ds.append(kn.matmul(X, B, None, bx, K, N, N, batch=batch) if K > N else
                  kn.matmul(B, X, None, bx, K, N, K, batch=batch))
        ds.append(kn.ns_mix(X, bx, Y, n, a, 1.0, batch))
    return ds, xs[NS_STEPS % 2]


OPTIMIZERS = {c.name: c for c in (AdamW, Lion, Muon)}


def make_optimizer(settings: OptimizerSettings) -> Optimizer:
    return OPTIMIZERS[settings.name](settings)
