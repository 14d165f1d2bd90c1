"""Sampling at the speed of the model: prefill once, then one token per submit from a key/value cache.

N sequences continue one prompt together. ctx here is the decoder's window, the spec's (spec.rows_for:
the prompt and the tokens asked, rounded up to a power of two, never over the model's context), so
the work and the buffers follow the tokens. The prefill is the model's own forward over the window
(without its head; one sequence's over its prompt's own rows, prefill_rows): each layer's key and
value activations as projected, [N, ctx, KV * hd], are the caches (a grouped-query model's hold its
KV heads alone, H / KV times less than [N, ctx, C]). A decode step runs one row per sequence
through every layer (decode.wgsl's embed_decode, kv_append and attn_decode between the usual
LayerNorm, matmul and GELU kernels), then draws the next token on the device (sample_tokens), which
the next step reads: nothing comes back to the host until the end, until the window is full, or
every few tokens where stop ids may end the run (every token for a stream). One sequence's cache
is kept after a run: a prompt that extends what it holds (a conversation's next turn) runs only
its new tokens, through the step's layers without the head.

Window policy (both modes, so that they give the same text): a token is predicted from the
tokens since the window's start s. When the sequence would exceed ctx tokens past s, s moves so
that the last ctx // 2 tokens remain (positions restart at 0 there, as the learned position
embeddings were trained, and as a rotary model's angles were), and the cache is refilled from
them by one prefill. A rotary model's step turns its new q and k at the decoded position: the
RoPE dispatches' own uniforms are rewritten with it before each token.

The full mode (the plan's decode=full, or a precision without the cached step: decode_mode) runs
the whole window's forward for every token and draws with the same kernel: the reference the
cache is tested against.
"""
from __future__ import annotations

import numpy as np

from ..core.precision import Precision
from ..device import numerics
from ..device.gpu import GPU, LimitError
from ..device.kernels import DECODE_UNIFORM_BYTES, ROPE_TURNS, decode_uniform, rope_at
from ..device.plan import KernelPlan
from . import buffers, record
from .block import BlockActs, block_forward
from .gpt import Model
from .head import Head, table_rows
from .spec import RunSpec, at_rows_params, rows_for

STOP_EVERY = 8       # tokens drawn between reads of the draws, where stop tokens may end the run
FORCED_MOST = 64     # new prompt tokens after a held prefix that go through the decode step, not a prefill
PREFILL_LEAST = 16   # the fewest rows a prompt's prefill runs over


def prefill_rows(ctx: int, n: int) -> int:
    """The rows a prompt of n tokens is prefilled over: the first of PREFILL_LEAST, then powers of
    two and one and a half times them (16, 24, 32, 48, 64, 96, ...) that holds them, never over
    ctx. A prefill's products cost as its rows do, and a power of two alone wastes up to half of
    them (37 tokens over 64 rows: SmolLM2's question); here at most a third, with two forwards to
    build an octave."""
    rows = PREFILL_LEAST                     # a power of two
    while rows < n:
        rows = rows * 3 // 2 if rows & (rows - 1) == 0 else rows * 4 // 3
    return min(int(ctx), rows)


def keep_of(ctx: int) -> int:
    return max(1, ctx // 2)


def window_start(s: int, length: int, ctx: int) -> int:
    """The window start for predicting the token after `length` tokens, given the last one `s`."""
    return s if length - s <= ctx else length - keep_of(ctx)


def decode_mode(plan: KernelPlan, precision: Precision) -> str:
    """"cache" (one token a submit from the key/value cache) where the plan chooses it and the
    precision's decode step exists, else "full" (the whole window's forward per token)."""
    return "cache" if plan.decode == "cache" and precision.decode_cache else "full"


class Decoder:
    """N sequences sampled together, on the device, from the key/value cache or by the whole
    window per token, as decode_mode says."""

    def __init__(self, gpu: GPU, plan: KernelPlan, spec: RunSpec, capacity: int = 256):
        """spec: the sampler's run (spec.decoder_spec: its B the N sequences, no training)."""
        cfg, N, precision = spec.cfg, spec.B, spec.precision
        self.gpu, self.cfg, self.N, self.capacity = gpu, cfg, N, capacity
        self.mode = decode_mode(plan, precision)
        self.cache = self.mode == "cache"
        self.model = Model(gpu, plan, spec.with_(lm_head=not self.cache))
        self.kn = self.model.kn
        self.VP = self.model.layout.VP
        self.uniform = gpu.uniform(DECODE_UNIFORM_BYTES)
        self.allocations, size = buffers.decode_rows(cfg, N, capacity, precision, self.cache, gpu.max_binding)
        self.buf = buffers.allocate(gpu, self.allocations, size)
        self.ids = self.buf["ids"]                            # next tokens [N] | history [steps, N]
        self.embed_uniforms = [(0, None, self.uniform)]       # (first token, tokens, uniform) of embed_decode
        self.rope_uniforms = []                               # the step's RoPE dispatches' (rotary models)
        self.cached = None                  # one sequence's tokens whose keys and values the cache holds
        self._prefills = {}                 # rows -> the forward over a prompt's first rows (one sequence)
        # the cache's kernels read C as q's width: a model whose head dim is set apart (H hd, not
        # d_model) gives them a uniform of their own
        self.attn_uniform = gpu.uniform(DECODE_UNIFORM_BYTES) if cfg.block.heads.apart else self.uniform
        if self.cache:
            self.steps = self._record_step()
            if precision.feature:          # the decode step's own f16 kernels, judged as the model's were
                numerics.check(gpu, plan, numerics.half_kernels(self.steps, precision.stored), precision.name)
            return
        if len(self.model.layout.logit_chunks) > 1:  # the sampler binds every logits row at once
            raise LimitError(f"{N} x {cfg.ctx} rows of {cfg.vocab}-token logits exceed one binding "
                             f"({gpu.max_binding:,} bytes): sample with the key/value cache, or fewer samples")
        self.steps = [self.kn.decoding.sample_tokens(self.model.buf["logits"], self.ids, N, self.uniform)]

    def _record_step(self) -> list:
        """One token of every sequence: embed, every block with the cache as its attention, the
        final LayerNorm, the head and the draw."""
        cfg, kn, m, b, u, N = self.cfg, self.kn, self.model, self.buf, self.uniform, self.N
        C, H, M, ua = cfg.d_model, cfg.heads, cfg.d_mlp, self.attn_uniform
        head = Head(kn, m.pk, m.P["tok_emb"], m.read[cfg.block.head], C, N, b.get("head block"))
        # one uniform per chunk of the token table (embed_decode reads which rows it holds there);
        # the first is every other kernel's
        self.embed_uniforms = [(v0, nv, u if i == 0 else self.gpu.uniform(DECODE_UNIFORM_BYTES))
                               for i, (v0, nv) in enumerate(head.vchunks)]
        emb = b["x mid"] if cfg.block.embed_norm else b["x a"]     # x mid: free until the first block
        steps = [kn.decoding.embed_decode(self.ids, table_rows(m.P["tok_emb"], v0, nv), m.P.get("pos_emb"), emb, N, C,
                                 ub) for v0, nv, ub in self.embed_uniforms]
        if emb is not b["x a"]:
            steps.append(m.pk.norm_f32(emb, m.P["ln_e"], b["x a"], b["ln stats"], N, C))
        rot = record.rotary(m, 1)                                 # one row a sequence, at the decoded position
        x, other = b["x a"], b["x b"]
        # a bf16 or f16 cache is read as stored, the attention's output written as float32 and
        # converted by the block, as in training
        append, attn = kn.decoding.kv_append, kn.decoding.attn_decode
        window = cfg.attn_window                                  # the cache's rows each query sees
        grouped = "k kv" in m.buf          # grouped-query attention: the cache holds the kv heads alone
        W = cfg.block.heads.kv_width
        # the step's k and v are its kv heads as projected [N, W], appended as they are: attn_decode
        # reads each query head's kv head in the cache, so nothing is copied to the query heads
        qkv = (b["q"], b["k"], b["v"])
        qk = ((b["q raw"], b["k raw"]), (b["q norm stats"], b["k norm stats"])) if "q raw" in b else ((), ())
        for l in range(cfg.layers):
            # the prefill's k, v as projected [N, T, W]: the cache
            kc, vc = (m.buf["k kv"][l], m.buf["v kv"][l]) if grouped else (m.buf["k"][l], m.buf["v"][l])
            attend = lambda q, k, v, out, kc=kc, vc=vc: [append(k, v, kc, vc, N, W, ua),
                                                        attn(q, kc, vc, out, b["scores"], N, H, ua, window)]
            acts = BlockActs(x, b["x mid"], other, b["ln"], b["ln stats"], qkv, b["att"], b["ln"], b["ln stats"],
                             b["pre"], b["gel"], b["branch out"], qkv, b.get("att f32", b["att"]), *qk,
                             gate=b.get("mlp gate"))
            block = block_forward(kn, m.pk, record.block_weights(m, l), acts, attend, N, C, M, rot=rot)
            self.rope_uniforms += [(d.uniform_buffer, self.gpu.uniform_bytes[d.uniform_buffer],
                                    ROPE_TURNS[d.kernel.name]) for d in block if d.kernel.name in ROPE_TURNS]
            steps += block
            x, other = other, x
        self.body = len(steps)            # a token into the cache, nothing drawn: the steps before the head
        steps.append(m.pk.layernorm(x, m.P["ln_f"], b["ln"], b["ln stats"], N, C))
        steps += head.forward(b["ln"], b["logits"], N)
        steps.append(kn.decoding.sample_tokens(b["logits"], self.ids, N, u))
        return steps

    def forget(self):
        """The next prompt is prefilled whole, whatever the cache holds (a benchmark's cold start)."""
        self.cached = None

    def set_params(self, params: dict):
        self.model.set_params(at_rows_params(self.cfg, params))
        self.cached = None

    def _set(self, pos, step, how, row0=0, row_stride=1):
        cfg = self.cfg
        for u, packed, word in self.rope_uniforms:    # the turns at the decoded position
            self.gpu.write_uniform(u, rope_at(packed, pos, word))
        at = lambda C, v0=0, vn=None: decode_uniform(
            self.N, cfg.ctx, C, cfg.heads, pos, step, cfg.vocab, self.VP, how["top_k"], row0, row_stride, how["seed"],
            how["temperature"], how["top_p"], v0, vn, cfg.n_kv)
        for v0, vn, u in self.embed_uniforms:
            self.gpu.write_uniform(u, at(cfg.d_model, v0, vn))
        if self.attn_uniform is not self.uniform:
            self.gpu.write_uniform(self.attn_uniform, at(cfg.block.heads.q_width))

    def _prefill(self, seqs, s: int, length: int):
        """Keys and values of positions s .. length-2 of every sequence into the cache. One sequence's
        prompt runs over its own length's prefill_rows, not the window's: its cache rows are the
        first rows of the model's [1, T, W] activations, which a forward over fewer rows writes."""
        n = length - 1 - s
        if n <= 0:
            return
        x = np.zeros((self.N, self.cfg.ctx), np.uint32)
        for i, seq in enumerate(seqs):
            x[i, :n] = seq[s:length - 1]
        if self.N > 1:
            self.model.forward(x)
            return
        rows = prefill_rows(self.cfg.ctx, n)
        if rows not in self._prefills:
            self._prefills[rows] = record.forward_rows(self.model, rows)
        self.model.write_batch(x)
        self.gpu.run(self._prefills[rows])

    def _fill(self, seqs, length: int, how):
        """The cache for a prompt of `length` tokens from position 0: where it already holds a
        prefix of them (one sequence: the conversation so far), only the tokens after that prefix
        go through the decode step's layers, one a submit without the head; otherwise one prefill."""
        want = seqs[0][:length - 1]
        held = self.cached or []
        p = 0
        for a, b in zip(held, want):
            if a != b:
                break
            p += 1
        new = len(want) - p
        if self.N == 1 and p and new <= max(FORCED_MOST, p // 4):
            for pos in range(p, len(want)):
                self.gpu.write(self.ids, np.full(1, want[pos], np.uint32))
                self._set(pos, 0, how)
                self.gpu.run(self.steps[:self.body])
            return
        self._prefill(seqs, 0, length)

    def _history(self, first: int, upto: int) -> np.ndarray:
        """Tokens drawn at steps first .. upto-1, [upto - first, N]."""
        return self.gpu.read(self.ids, count=(upto - first) * self.N,
                             offset_elems=self.N * (1 + first)).reshape(upto - first, self.N)

    def _take(self, seqs, done: list, upto: int, stop, ended: list, on_token):
        """The tokens drawn at steps done[0] .. upto-1 into seqs, each sequence's first stop token
        marked in `ended`, each kept token to on_token."""
        if upto <= done[0]:
            return
        for row in self._history(done[0], upto):
            for i in range(self.N):
                t = int(row[i])
                seqs[i].append(t)
                if ended[i] is None:
                    if t in stop:
                        ended[i] = len(seqs[i]) - 1
                    elif on_token is not None:
                        on_token(i, t)
        done[0] = upto

    def generate(self, prompt_ids, n: int, temperature: float = 0.0, top_k: int | None = None,
                 top_p: float = 1.0, seed: int = 0, stop=(), on_token=None) -> list[list[int]]:
        """N continuations of the prompt, up to n tokens each, as lists of ids (prompt included).
        stop: ids that end a sequence (the model's end-of-turn tokens): it ends before the first
        one drawn, which is not returned, and the run ends once every sequence has; the draws are
        read every STOP_EVERY tokens to see it. on_token(i, id): each kept token as it is drawn
        (read after every token then: a stream)."""
        if n > self.capacity:
            raise ValueError(f"{n} tokens asked of a decoder built for {self.capacity}")
        ctx, N = self.cfg.ctx, self.N
        seqs = [list(map(int, prompt_ids)) for _ in range(N)]
        length = len(seqs[0])
        plen = length
        how = {"temperature": temperature, "top_k": top_k or 0, "top_p": top_p, "seed": seed}
        stop = frozenset(int(t) for t in stop)
        ended = [None] * N                                        # where each sequence's stop token came
        every = 1 if on_token is not None else STOP_EVERY if stop else 0
        s = max(0, length - ctx)
        if self.cache:
            if s == 0:
                self._fill(seqs, length, how)
            else:
                self._prefill(seqs, s, length)
        self.cached = None
        self.gpu.write(self.ids, np.full(N, seqs[0][-1], np.uint32))     # after _fill, which writes it too
        done = [0]                                                # tokens already copied into seqs
        take = lambda upto: self._take(seqs, done, upto, stop, ended, on_token)
        steps = 0
        for step in range(n):
            ns = window_start(s, length, ctx)
            if self.cache and ns != s:                            # full: refill from the last ctx // 2
                take(step)
                s = ns
                self._prefill(seqs, s, length)
            s = ns
            if self.cache:
                self._set(length - 1 - s, step, how)
                self.gpu.run(self.steps)
            else:
                take(step)
                x = np.zeros((N, ctx), np.uint32)
                for i, seq in enumerate(seqs):
                    x[i, :length - s] = seq[s:length]
                self._set(0, step, how, row0=length - 1 - s, row_stride=ctx)
                self.model.forward(x, self.steps)
            length += 1
            steps = step + 1
            if every and steps % every == 0:
                take(steps)
                if all(e is not None for e in ended):
                    break
        take(steps)
        if self.cache and N == 1 and s == 0:
            self.cached = seqs[0][:length - 1]                    # what the cache holds, for the next prompt
        return [seq if e is None else seq[:e] for seq, e in zip(seqs, ended)]
