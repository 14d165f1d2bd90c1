"""Sampling at the speed of the model: prefill once, then one token per submit from a key/value cache.

N sequences continue one prompt together. The prefill is the model's own forward over a [N, ctx]
window (without its head): each layer's key and value activations [N, ctx, C] are the caches.
A decode step runs one row per sequence through every layer (decode.wgsl's embed_decode,
kv_append and attn_decode between the usual LayerNorm, matmul and GELU kernels), then draws the
next token on the device (sample_tokens), which the next step reads: nothing comes back to the
host until the end, or until the window is full.

Window policy (both paths, so that they give the same text): a token is predicted from the
tokens since the window's start s. When the sequence would exceed ctx tokens past s, s moves so
that the last ctx // 2 tokens remain (positions restart at 0 there, as the learned position
embeddings were trained), and the cache is refilled from them by one prefill.

The full path (`cache=False`, the plan's decode=full) runs the whole window's forward for every
token and draws with the same kernel: the reference the cache is tested against.
"""
from __future__ import annotations

import numpy as np

from . import kernels
from .config import Config
from .gpu import GPU, LimitError
from .model import Head, Launchers, Model


def keep_of(ctx: int) -> int:
    return max(1, ctx // 2)


def window_start(s: int, length: int, ctx: int) -> int:
    """The window start for predicting the token after `length` tokens, given the last one `s`."""
    return s if length - s <= ctx else length - keep_of(ctx)


class Decoder:
    """N sequences sampled together, on the device, with or without the key/value cache."""

    def __init__(self, gpu: GPU, cfg: Config, N: int = 1, attention: str = "online", plan=None,
                 cache: bool = True, capacity: int = 256, precision: str = "fp32"):
        self.gpu, self.cfg, self.N, self.cache, self.capacity = gpu, cfg, N, cache, capacity
        C, H, T, M = cfg.d_model, cfg.heads, cfg.ctx, cfg.d_mlp
        g = gpu
        assert precision == "fp32" or not cache, "the cached decode step is float32"
        self.model = Model(gpu, cfg, attention, B=N, T=T, training=False, plan=plan, head=not cache,
                           precision=precision)
        self.plan = self.model.plan
        self.VP = self.model.VP
        self.uniform = g.uniform(kernels.DECODE_UNIFORM_BYTES)
        self.ids = g.tensor((N + N * capacity,), "u32", "decode.ids")     # next tokens [N] | history [steps, N]
        self.embed_uniforms = [(0, None, self.uniform)]      # (first token, tokens, uniform) of embed_decode
        if not cache:   # the sampler binds every logits row at once
            if len(self.model.chunks) > 1:
                raise LimitError(f"{N} x {cfg.ctx} rows of {cfg.vocab}-token logits exceed one binding "
                                 f"({g.max_binding:,} bytes): sample with the key/value cache, or fewer samples")
            self.steps = [kernels.sample_tokens(g, self.model.logits, self.ids, N, self.uniform)]
            return
        K, m, u = Launchers(self.plan), self.model, self.uniform
        P = lambda l, n: m.P[f"h{l}.{n}"]
        act = lambda *shape, name="": g.tensor(shape, name=name)
        xa, xb, xm = act(N, C, name="dec.x"), act(N, C, name="dec.x2"), act(N, C, name="dec.xmid")
        h, stats, tmp = act(N, C), act(2, N), act(N, C)
        q, k, v, att = act(N, C), act(N, C), act(N, C), act(N, C)
        pre, gel = act(N, M), act(N, M)
        scratch = act(N, H, T, name="dec.scores")                           # [N,H,T]
        head = Head(g, self.plan, m.P["tok_emb"], C, N)
        # one uniform per chunk of the token table (embed_decode reads which rows it holds there);
        # the first is every other kernel's
        self.embed_uniforms = [(v0, nv, u if i == 0 else g.uniform(kernels.DECODE_UNIFORM_BYTES))
                               for i, (v0, nv) in enumerate(head.vchunks)]
        steps = [kernels.embed_decode(g, self.ids, head._table(m.P["tok_emb"], v0, nv), m.P["pos_emb"], xa, N, C, ub)
                 for v0, nv, ub in self.embed_uniforms]
        x = xa
        for l in range(cfg.layers):
            kc, vc = m.qkv[l][1], m.qkv[l][2]                               # the prefill's k, v [N, T, C]
            steps += [K.layernorm_forward(g, x, m._ln(l, 1), h, stats, N, C),
                      K.matmul(g, h, P(l, "Wq"), P(l, "bq"), q, N, C, C),
                      K.matmul(g, h, P(l, "Wk"), P(l, "bk"), k, N, C, C),
                      K.matmul(g, h, P(l, "Wv"), P(l, "bv"), v, N, C, C),
                      kernels.kv_append(g, k, v, kc, vc, N, C, u),
                      kernels.attn_decode(g, q, kc, vc, att, scratch, N, H, u),
                      K.matmul(g, att, P(l, "Wo"), P(l, "bo"), tmp, N, C, C),
                      K.add(g, x, tmp, xm, N * C),
                      K.layernorm_forward(g, xm, m._ln(l, 2), h, stats, N, C),
                      K.matmul(g, h, P(l, "fc_in_W"), P(l, "fc_in_b"), pre, N, M, C),
                      K.gelu_forward(g, pre, gel, N * M),
                      K.matmul(g, gel, P(l, "fc_out_W"), P(l, "fc_out_b"), tmp, N, C, M)]
            x = xb if x is xa else xa
            steps.append(K.add(g, xm, tmp, x, N * C))
        steps.append(K.layernorm_forward(g, x, m._ln(None), h, stats, N, C))
        # the sampler binds every row at once: g.tensor refuses, naming them, when they do not fit
        logits = g.tensor((N, self.VP), name=f"logits of {N} samples")                  # [N,VP]
        steps += head.forward(h, logits, N)
        steps.append(kernels.sample_tokens(g, logits, self.ids, N, u))
        self.steps = steps

    def set_params(self, params: dict):
        self.model.set_params(params)

    def _set(self, pos, step, how, row0=0, row_stride=1):
        cfg = self.cfg
        for v0, vn, u in self.embed_uniforms:
            self.gpu.queue.write_buffer(u, 0, kernels.decode_uniform(
                self.N, cfg.ctx, cfg.d_model, cfg.heads, pos, step, cfg.vocab, self.VP, how["top_k"], row0,
                row_stride, how["seed"], how["temperature"], how["top_p"], v0, vn))

    def _prefill(self, seqs, s: int, length: int):
        """Keys and values of positions s .. length-2 of every sequence into the cache."""
        if length - 1 - s <= 0:
            return
        x = np.zeros((self.N, self.cfg.ctx), np.uint32)
        for n, seq in enumerate(seqs):
            x[n, :length - 1 - s] = seq[s:length - 1]
        self.model.forward(x)

    def _history(self, steps: int) -> np.ndarray:
        return self.gpu.read(self.ids, count=steps * self.N, offset_elems=self.N).reshape(steps, self.N)

    def generate(self, prompt_ids, n: int, temperature: float = 0.0, top_k: int | None = None,
                 top_p: float = 1.0, seed: int = 0) -> list[list[int]]:
        """N continuations of the prompt, n tokens each, as lists of ids (prompt included)."""
        if n > self.capacity:
            raise ValueError(f"{n} tokens asked of a decoder built for {self.capacity}")
        ctx, N = self.cfg.ctx, self.N
        seqs = [list(map(int, prompt_ids)) for _ in range(N)]
        length = len(seqs[0])
        how = {"temperature": temperature, "top_k": top_k or 0, "top_p": top_p, "seed": seed}
        s = max(0, length - ctx)
        self.gpu.write(self.ids, np.full(N, seqs[0][-1], np.uint32))
        if self.cache:
            self._prefill(seqs, s, length)
        done = 0                                                  # tokens already copied into seqs
        for step in range(n):
            ns = window_start(s, length, ctx)
            if self.cache and ns != s:                            # full: refill from the last ctx // 2
                for t, row in enumerate(self._history(step)[done:], done):
                    for i in range(N):
                        seqs[i].append(int(row[i]))
                done = step
                s = ns
                self._prefill(seqs, s, length)
            s = ns
            if self.cache:
                self._set(length - 1 - s, step, how)
                self.gpu.run(self.steps)
            else:
                if step:
                    for i, t in enumerate(self._history(step)[step - 1]):
                        seqs[i].append(int(t))
                    done = step
                x = np.zeros((N, ctx), np.uint32)
                for i, seq in enumerate(seqs):
                    x[i, :length - s] = seq[s:length]
                self._set(0, step, how, row0=length - 1 - s, row_stride=ctx)
                self.model.forward(x, self.steps)
            length += 1
        for row in self._history(n)[done:]:
            for i in range(N):
                seqs[i].append(int(row[i]))
        return seqs
