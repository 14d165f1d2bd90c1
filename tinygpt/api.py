"""The Python API: a GPT to load or build, run, sample from, train and save, in a few names.

    import tinygpt
    gpt = tinygpt.GPT.load("runs/small.tinygpt")         # or tinygpt.GPT.from_preset("tiny")
    gpt.loss("To be, or not to be")                      # any length up to the context
    print(gpt.generate("ROMEO:", max_new_tokens=50))     # from the key/value cache
    gpt.train(steps=10, data="tinyshakespeare.txt")      # the trainer's own step, schedule, optimizer
    gpt.save("runs/more.tinygpt")                        # a .tinygpt file, as `tinygpt train` writes

Nothing here computes on its own: a GPT holds a checkpoint (checkpoint.Checkpoint) and builds, when
first asked, the layers the CLI runs on: model.gpt.Model for logits and losses, model.decode.Decoder
for text, start.setup for training. Errors are the CLI's (core.errors.TinyGPTError and its kinds),
with the CLI's messages; options are named as the CLI's flags name them.
"""
from __future__ import annotations

import dataclasses
import functools
import os
import sys
import warnings

import numpy as np

from .files import checkpoint as ckpt
from .files import lora_files
from .core.config import PRESET_TOKENIZER, Config, mlp_width, n_params, preset
from .core.errors import TinyGPTError, UsageError
from .core.fs import available_memory
from .core.init import init_params
from .core.precision import PRECISIONS
from .commands.settings import flat_config, train_options    # the flags' own checks on every setting
from . import tokenizers
from .tokenizers import get_tokenizer
from .device.gpu import GPU
from .device.plan import parse_kernels
from .device.planner import make_plan
from .model.twincheck import blame, verify
from .run.chat import Conversation
from .tokenizers.chat import template_of
from .run.infer import check_sampling, stop_ids, texts
from .model.attention import DEFAULT as ATTENTION, IMPLS
from .model import budget
from .model.budget import device_limits
from .model.decode import Decoder
from .model.layout import flat_part
from .model.gpt import Model
from .model.spec import RunSpec, at_rows, at_rows_params, decoder_spec, rows_for
from .files.outputs import Outputs
from .run.recipe import PARTS, block_parts
from .run.safety import TrainingStopped, run_file, unhealthy
from .run.start import setup

_GPU: list = []


def default_gpu() -> GPU:
    """One device for the whole process: every GPT and trainer made without one shares it."""
    if not _GPU:
        _GPU.append(GPU())
    return _GPU[0]


# What makes a new model, given to GPT.from_preset; a trainer may not change them.
SHAPE = ("layers", "d_model", "heads", "ctx", "sliding_window", "tokenizer", "tokenizer_file", "seed")
# What only `tinygpt train`'s run does (files, its clock, its evaluations and log, its end): not the
# trainer's, which runs steps (the loop of run/train.py reads these, the trainer's run() does not).
CLI_ONLY = ("out", "force", "resume", "log", "quiet", "save_every", "minutes", "sample_tokens", "sample_prompt",
            "eval_every", "eval_windows", "log_every", "keep_best", "tensorboard", "config", "preset", "steps")


# The options whose keyword here is not the option's own name (the rest are named as they are: top_k),
# and a switch as it is turned on ("add rewarm=True").
API_NAMES = {"tokens": "max_new_tokens", "rewarm": "rewarm=True"}
# What GPT.load and GPT.from_preset pass on to GPT itself.
MODEL_KEYWORDS = ("attention", "precision", "kernels", "gpu")


def in_api_words(f):
    """Errors from a call of the API name options by its keywords (max_new_tokens, top_k, d_model),
    not as the command line names them (its flags)."""
    @functools.wraps(f)
    def call(*args, **kw):
        try:
            return f(*args, **kw)
        except TinyGPTError as e:
            e.wording = api_name
            raise
    return call


def api_name(option: str) -> str:
    return API_NAMES.get(option, option)


def _callers_level() -> int:
    """The stacklevel of the first frame outside tinygpt, for warnings.warn: the user's own line."""
    frame, level, here = sys._getframe(1), 1, os.path.dirname(os.path.abspath(__file__))
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(here):
        frame, level = frame.f_back, level + 1
    return level


def whole(value, what: str, low: int, high: int | None = None) -> int:
    """An int argument (not a bool, not a float or text), low to high."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) \
            or value < low or high is not None and value > high:
        span = f"{low:,} to {high:,}" if high is not None else f"{low:,} or more"
        raise UsageError(f"{what} must be a whole number {span}, got {value!r}")
    return int(value)


def file_name(path, what: str) -> str:
    """A path argument: text or os.PathLike, not None or a number."""
    if not isinstance(path, (str, os.PathLike)) or not str(path):
        raise UsageError(f"{what}: give a file name (str or pathlib.Path), got {path!r}")
    return os.fspath(path)


def model_keywords(kw: dict, what: str, more=()):
    """GPT's own keywords, and only those: a misspelt one (n_layer) is named, not a TypeError."""
    known = MODEL_KEYWORDS + tuple(more)
    bad = [k for k in kw if k not in known]
    if bad:
        raise UsageError(f"{what}: {bad[0]!r} is not one of its keywords ({', '.join(known)})")


class GPT:
    """A model: its weights, config and tokenizer, with the device objects that run it made
    when first needed. Make one with GPT.load or GPT.from_preset."""

    def __init__(self, checkpoint: ckpt.Checkpoint, *, source: str = "the model", recipe: dict | None = None,
                 attention: str = ATTENTION, precision: str = "fp32", kernels: dict | None = None,
                 tokenizer_file: str | None = None, gpu: GPU | None = None):
        if attention not in IMPLS:
            raise UsageError(f"{{opt:attention}} {attention!r}: choose one of {', '.join(IMPLS)}")
        if precision not in PRECISIONS:
            raise UsageError(f"{{opt:precision}} {precision!r}: choose one of {', '.join(PRECISIONS)}")
        if kernels is not None and not isinstance(kernels, (dict, str)):
            raise UsageError(f"kernels: a dict of family and variant (matmul=\"vec4\"), got {type(kernels).__name__}")
        if isinstance(kernels, dict):
            kernels = ",".join(f"{k}={v}" for k, v in kernels.items())
        kernels = parse_kernels(kernels)       # checked as the CLI checks its kernel choices
        if gpu is not None and not isinstance(gpu, GPU):
            raise UsageError(f"gpu: a tinygpt GPU (tinygpt.api.default_gpu()), got {type(gpu).__name__}")
        self._ck, self.source, self._recipe = checkpoint, source, recipe
        self.attention, self.precision, self.kernels = attention, precision, dict(kernels or {})
        self.tokenizer_file = tokenizer_file
        self.tokenizer = tokenizers.of_record(checkpoint.extra, checkpoint.cfg.vocab, tokenizer_file)
        self._gpu = gpu
        self._weights = None           # what the model computes with (a LoRA run's adapters folded in)
        self._evaluator = None         # (B, Model) for logits and losses
        self._decoder = None           # (key, Decoder) for generate and chat
        self._chat = None              # the Conversation of chat

    # ---- making one ------------------------------------------------------------------------------
    @classmethod
    @in_api_words
    def load(cls, path, **kw) -> GPT:
        """A .tinygpt file (ours, or TinyGPT's own). kw: attention, precision, kernels,
        tokenizer_file, gpu, as the CLI's eval and sample take them."""
        model_keywords(kw, "GPT.load", ("tokenizer_file",))
        label = path = file_name(path, "GPT.load")
        ck = ckpt.load(path, label)
        lora_files.finite_weights(ck, label)
        return cls(ck, source=label, tokenizer_file=kw.pop("tokenizer_file", None), **kw)

    @classmethod
    @in_api_words
    def from_preset(cls, name: str = "small", *, layers: int | None = None, d_model: int | None = None,
                    heads: int | None = None, ctx: int | None = None, sliding_window: int | None = None,
                    batch: int | None = None, tokenizer: str | None = None, tokenizer_file: str | None = None,
                    seed: int | None = None, norm: str | None = None, norm_eps: float | None = None,
                    position: str | None = None, rope_theta: float | None = None, mlp: str | None = None,
                    bias: bool | None = None, untied_head: bool | None = None, qk_norm: str | None = None,
                    kv_heads: int | None = None, logit_softcap: float | None = None, embed_norm: bool | None = None,
                    block: str | None = None, head_dim: int | None = None, **kw) -> GPT:
        """A new model of a preset's shape (core.config.PRESETS), its weights drawn as `tinygpt train`
        draws them from the seed; the shape options over it (batch: its training batch, which the
        trainer may change) and the block's parts (norm, norm_eps, position, rope_theta, mlp, bias,
        untied_head, qk_norm, kv_heads, head_dim, logit_softcap, embed_norm, or a set of them: block,
        gpt2, nanochat or llama: core.block), checked as the CLI's flags are."""
        model_keywords(kw, "GPT.from_preset", ("layers", "d_model", "heads", "ctx", "sliding_window", "batch",
                                               "tokenizer", "tokenizer_file", "seed") + tuple(PARTS))
        recipe = {k: v for k, v in dict(preset=name, layers=layers, d_model=d_model, heads=heads, ctx=ctx,
                                        sliding_window=sliding_window, batch=batch, tokenizer=tokenizer,
                                        tokenizer_file=tokenizer_file, seed=seed, norm=norm, norm_eps=norm_eps,
                                        position=position, rope_theta=rope_theta, mlp=mlp, bias=bias,
                                        untied_head=untied_head, qk_norm=qk_norm,
                                        kv_heads=kv_heads, logit_softcap=logit_softcap, head_dim=head_dim,
                                        embed_norm=embed_norm, block=block).items() if v is not None}
        o = train_options(recipe, "GPT.from_preset")
        cfg = preset(o.preset, layers=o.layers, d_model=o.d_model, heads=o.heads, ctx=o.ctx, seed=o.seed,
                     window=o.sliding_window, batch=o.batch, **block_parts(o))
        name = o.tokenizer or PRESET_TOKENIZER.get(o.preset, (tokenizers.DEFAULT,))[0]
        tok = get_tokenizer(name, o.tokenizer_file)
        cfg.vocab = tok.vocab
        cfg.validate()
        ck = ckpt.Checkpoint(cfg, init_params(cfg), extra=tok.record())
        return cls(ck, source=f"the new {o.preset} model", recipe=recipe, tokenizer_file=tokenizer_file, **kw)

    @classmethod
    @in_api_words
    def from_config(cls, config: Config, **kw) -> GPT:
        """A new model of this Config's shape (its layers, d_model, heads, ctx, window, block, batch
        and seed; its vocabulary names the tokenizer: 256 bytes, or GPT-2's 50257)."""
        if not isinstance(config, Config):
            raise UsageError(f"GPT.from_config takes a tinygpt.Config, got {type(config).__name__}")
        tokenizer = {256: "byte", 50257: "gpt2"}.get(config.vocab)
        width = mlp_width(config.d_model, config.activation)
        if tokenizer is None or config.d_mlp != width or config.block.bias.toggle is None:
            raise UsageError(f"GPT.from_config makes TinyGPT's models: vocabulary 256 or 50257 (got {config.vocab}), "
                             f"an MLP of {width} for d_model {config.d_model} (got {config.d_mlp}), biases on every "
                             f"projection or none (got "
                             f"{config.bias}); GPT-2's own weights come in through tinygpt import-hf")
        return cls.from_preset("small", layers=config.layers, d_model=config.d_model, heads=config.heads,
                               ctx=config.ctx, sliding_window=config.window or None, batch=config.batch,
                               tokenizer=tokenizer, seed=config.seed, norm=config.norm, norm_eps=config.norm_eps,
                               position=config.position, mlp=config.activation, bias=config.block.bias.toggle,
                               untied_head=not config.tied, qk_norm=config.qk_norm, kv_heads=config.kv_heads or None,
                               head_dim=config.head_dim or None,
                               logit_softcap=config.softcap, embed_norm=config.embed_norm,
                               rope_theta=config.rope_theta if config.block.position.rotary else None, **kw)

    # ---- what it is -----------------------------------------------------------------------------
    @property
    def config(self) -> Config:
        return dataclasses.replace(self._ck.cfg)

    @property
    def step(self) -> int:
        """The training steps its weights have taken."""
        return self._ck.step

    @property
    def checkpoint(self) -> ckpt.Checkpoint:
        """What save writes: weights, optimizer state, the run's records."""
        return self._ck

    def params(self) -> dict:
        """The weights it computes with, by .tinygpt name (copies; a LoRA run's adapters folded in)."""
        return {k: np.array(v) for k, v in self._params().items()}

    @property
    def gpu(self) -> GPU:
        if self._gpu is None:
            self._gpu = default_gpu()
        return self._gpu

    @in_api_words
    def encode(self, text: str) -> np.ndarray:
        """The token ids of text, int64 [T] (the tokenizer checks that it is text)."""
        return np.asarray(self.tokenizer.encode(text), np.int64)

    @in_api_words
    def decode(self, ids) -> str:
        """The text of token ids (any shape, read in order), each 0 to vocab - 1 (the tokenizer checks)."""
        return self.tokenizer.decode(ids)

    def __repr__(self):
        c = self._ck.cfg
        return (f"GPT({self.source}: {c.layers} layers, d_model {c.d_model}, {c.heads} heads, ctx {c.ctx}, "
                f"vocab {c.vocab}, step {self.step})")

    # ---- running it ------------------------------------------------------------------------------
    def _params(self) -> dict:
        if self._weights is None:
            self._weights = lora_files.model_params(self._ck, self.source)
        return self._weights

    def _adopt(self, ck: ckpt.Checkpoint):
        """New weights (after training): the device copies are made again when next needed."""
        self._ck, self._recipe, self._weights = ck, None, None
        if self._evaluator:
            self._evaluator[1].set_params(self._params())
        if self._decoder:
            self._decoder[1].set_params(self._params())

    def _ids(self, tokens, most: int, what: str) -> tuple[np.ndarray, bool]:
        """tokens (text, or ids [T] or [N, T]) as uint32 [N, T] with 1 <= T <= most, each id checked."""
        one = isinstance(tokens, str)
        a = self.encode(tokens) if one else _int_array(tokens, what)
        one = one or a.ndim == 1
        if a.ndim == 1:
            a = a[None, :]
        if a.ndim != 2 or a.size == 0 or not np.issubdtype(a.dtype, np.integer):
            raise UsageError(f"{what}: give text, or token ids as whole numbers shaped [T] or [N, T], got shape "
                             f"{a.shape} of {a.dtype}")
        if not 1 <= a.shape[1] <= most:
            raise UsageError(f"{what}: {a.shape[1]} tokens; this model takes 1 to {most} (its context is "
                             f"{self._ck.cfg.ctx})")
        if a.min() < 0 or a.max() >= self._ck.cfg.vocab:
            raise UsageError(f"{what}: token ids must be 0 to {self._ck.cfg.vocab - 1}, got {int(a.min())} to "
                             f"{int(a.max())}")
        return a.astype(np.uint32), one

    def _model(self, n: int, T: int) -> Model:
        """The forward-only model for n windows (at most the config's batch at once) of T tokens:
        over rows_for(T) positions, not the whole context, so a short text costs its own length."""
        b = max(1, min(n, self._ck.cfg.batch))
        rows = rows_for(self._ck.cfg.ctx, T)
        if self._evaluator is None or self._evaluator[0] != (b, rows):
            self._evaluator = None
            plan = make_plan(self.gpu, self.kernels)
            cfg = at_rows(self._ck.cfg, rows)
            spec = RunSpec(cfg, self.attention, B=b, training=False, precision=PRECISIONS[self.precision])
            limits = device_limits(self.gpu)
            budget.check_use(budget.eval_bytes(spec, plan, limits), 4 * n_params(cfg), limits,
                             f"a forward of {b} x {rows:,} positions", "ask for fewer or shorter windows at a time")
            verify(self.gpu, plan, spec)
            model = Model(self.gpu, plan, spec)
            model.set_params(at_rows_params(cfg, self._params()))
            self._evaluator = ((b, rows), model)
        return self._evaluator[1]

    def _batches(self, x: np.ndarray, y: np.ndarray | None):
        """(rows, x [B, R], y [B, R]) of N windows of T tokens (R: the model's rows for T): shorter
        windows are completed with token 0 after their end, which no earlier position attends to
        (causal attention), and the last batch with copies of its first row; only the given rows
        and positions are read."""
        model = self._model(len(x), x.shape[1])
        B, T = model.B, model.T
        for i in range(0, len(x), B):
            k = len(x[i:i + B])
            xb = np.zeros((B, T), np.uint32)
            yb = np.zeros((B, T), np.uint32)
            xb[:k, :x.shape[1]] = x[i:i + B]
            if y is not None:
                yb[:k, :y.shape[1]] = y[i:i + B]
            xb[k:], yb[k:] = xb[0], yb[0]
            yield model, k, xb, yb

    @in_api_words
    def logits(self, tokens) -> np.ndarray:
        """Next-token logits, float32 [N, T, vocab] for ids [N, T] ([T, vocab] for text or ids [T]);
        any N, and T up to the context."""
        x, one = self._ids(tokens, self._ck.cfg.ctx, "logits")
        T = x.shape[1]
        need = 4 * x.size * self._ck.cfg.vocab
        if need > available_memory() // 2:
            raise UsageError(f"logits: {len(x):,} x {T} x {self._ck.cfg.vocab:,} logits take {need:,} bytes, over "
                             "half the free memory; ask for fewer windows at a time")
        out = [model.logits_of(xb)[:k, :T] for model, k, xb, _ in self._batches(x, None)]
        out = np.concatenate(out)
        return out[0] if one else out

    @in_api_words
    def loss(self, tokens, targets=None) -> float:
        """Mean next-token cross-entropy in nats: of targets after tokens (both [T] or [N, T]), or,
        without targets, of each token after the ones before it (text or ids of up to ctx + 1)."""
        if targets is None:
            ids, _ = self._ids(tokens, self._ck.cfg.ctx + 1, "loss")
            if ids.shape[1] < 2:
                raise UsageError("loss: give at least two tokens (each is scored after those before it)")
            x, y = ids[:, :-1], ids[:, 1:]
        else:
            x, _ = self._ids(tokens, self._ck.cfg.ctx, "loss")
            y, _ = self._ids(targets, self._ck.cfg.ctx, "loss's targets")
            if x.shape != y.shape:
                raise UsageError(f"loss: tokens {x.shape} and targets {y.shape} differ in shape")
        T, total = x.shape[1], 0.0
        for model, k, xb, yb in self._batches(x, y):
            rows = model.row_losses(xb, yb).reshape(model.B, -1)[:k, :T]
            total += rows.astype(np.float64).sum()
        return total / x.size

    @in_api_words
    def generate(self, prompt="\n", max_new_tokens: int = 50, *, temperature: float = 0.0, top_k: int | None = None,
                 top_p: float = 1.0, seed: int = 0, num_samples: int = 1, cache: bool = True, stop=None):
        """The prompt and up to max_new_tokens tokens after it: text for a text prompt, ids for ids
        ([T + n] each; a list of them with num_samples > 1). temperature 0 is greedy; top_k and
        top_p narrow the draw; a seed gives the same tokens again. cache: from the key/value cache
        (False: the whole window's forward per token, as the sample command without its cache).
        stop: None ends each sequence at the model's end-of-turn tokens (those its file records),
        False runs to max_new_tokens, or a list of ids; the stop token is not returned."""
        check_sampling(max_new_tokens, temperature, top_k, top_p, num_samples, self._ck.cfg.vocab)
        seed = whole(seed, "generate: seed", 0, 2 ** 64 - 1)
        if not isinstance(cache, bool):
            raise UsageError(f"generate: cache is True or False, got {cache!r}")
        text = isinstance(prompt, str)
        if not text:
            a = _int_array(prompt, "generate")
            if a.ndim != 1 or a.size == 0 or not np.issubdtype(a.dtype, np.integer):
                raise UsageError(f"generate: give the prompt as text or as token ids [T], got shape {a.shape} "
                                 f"of {a.dtype}")
            if a.min() < 0 or a.max() >= self._ck.cfg.vocab:
                raise UsageError(f"generate: token ids must be 0 to {self._ck.cfg.vocab - 1}")
        stop = self._stops(stop, "generate")
        n_prompt = len(self.encode(prompt)) if text else a.size
        decoder = self._sampler(num_samples, cache, rows_for(self._ck.cfg.ctx, n_prompt + max_new_tokens),
                                max_new_tokens)
        how = (max_new_tokens, temperature, top_k, top_p, seed)
        out = texts(decoder, self.tokenizer, prompt, *how, stop) if text else \
            [np.asarray(s, np.int64) for s in decoder.generate([int(i) for i in a], *how, stop)]
        return out[0] if num_samples == 1 else out

    def _stops(self, stop, what: str) -> tuple:
        """The ids that end a reply: the model's end-of-turn tokens (stop=None), none (False or ()),
        or the ids given."""
        if stop is None:
            return stop_ids(self._ck.extra, self.tokenizer, self._ck.cfg.vocab)
        if stop is False:
            return ()
        ids = _int_array(list(stop) if isinstance(stop, (list, tuple, set, frozenset)) else stop, what)
        if ids.ndim != 1 or ids.size > 64 or (ids.size and (ids.min() < 0 or ids.max() >= self._ck.cfg.vocab)):
            raise UsageError(f"{what}: stop is None (the model's end-of-turn tokens), False, or up to 64 token ids "
                             f"from 0 to {self._ck.cfg.vocab - 1}")
        return tuple(int(i) for i in ids)

    def _sampler(self, num_samples: int, cache: bool, rows: int, tokens: int) -> Decoder:
        """The decoder for num_samples sequences over `rows` positions drawing up to `tokens`: the one
        held where it is large enough (its cache then still holds the last prompt), else a new one."""
        key = (num_samples, bool(cache))
        held = self._decoder
        if held is None or held[0][:2] != key or held[0][2] < rows or held[0][3] < tokens:
            self._decoder = None                      # its buffers go before the new one's are made
            kernels = dict(self.kernels, **({} if cache else {"decode": "full"}))
            rows = rows if held is None or held[0][:2] != key else max(rows, held[0][2])
            tokens = max(tokens, 256) if held is None or held[0][:2] != key else max(tokens, held[0][3])
            spec = decoder_spec(self._ck.cfg, self.attention, num_samples, PRECISIONS[self.precision], rows=rows)
            plan = make_plan(self.gpu, kernels)
            limits = device_limits(self.gpu)
            part = flat_part(limits["max_buffer"], limits["align"])
            budget.check_use(budget.sampler_bytes(spec, tokens, plan, limits["max_binding"], part),
                             4 * n_params(self._ck.cfg), limits,
                             f"sampling {num_samples} x {tokens} tokens over {spec.T:,} positions",
                             "ask for fewer {opt:num_samples} or {opt:tokens}, or use {opt:precision} bf16")
            verify(self.gpu, plan, spec)
            decoder = Decoder(self.gpu, plan, spec, tokens)
            decoder.set_params(self._params())
            self._decoder = (key + (spec.T, tokens), decoder)
        return self._decoder[1]

    @in_api_words
    def chat(self, messages, max_new_tokens: int = 256, *, temperature: float = 0.0, top_k: int | None = None,
             top_p: float = 1.0, seed: int = 0, stream=None) -> str:
        """The model's reply to a conversation, as text: messages as transformers takes them
        ([{"role": "system" | "user" | "assistant", "content": str}, ...]), rendered with the
        model's chat template (ChatML where it has none). The reply ends at the model's end-of-turn
        tokens (not in the text) or after max_new_tokens. The key/value cache is kept between
        calls: a conversation that goes on costs its new tokens. stream(text): each piece of the
        reply as it is drawn."""
        check_sampling(max_new_tokens, temperature, top_k, top_p, 1, self._ck.cfg.vocab)
        seed = whole(seed, "chat: seed", 0, 2 ** 64 - 1)
        if stream is not None and not callable(stream):
            raise UsageError(f"chat: stream is a function of the reply's text pieces, got {type(stream).__name__}")
        if self._chat is None:
            cfg = self._ck.cfg

            def make(rows, tokens):
                return self._sampler(1, True, rows, tokens)
            self._chat = Conversation(make, self.tokenizer, template_of(self._ck.extra, self.tokenizer),
                                      self._stops(None, "chat"), cfg.ctx)
        return self._chat.reply(messages, max_new_tokens, temperature, top_k, top_p, seed, stream)

    # ---- training and saving ---------------------------------------------------------------------
    @in_api_words
    def trainer(self, steps: int, data=None, **options) -> Trainer:
        """A training run of `steps` more steps (its schedule planned to end there), to run in
        parts with Trainer.step and Trainer.run. options: `tinygpt train`'s, by long name."""
        return Trainer(self, steps, data, options)

    @in_api_words
    def train(self, steps: int, data=None, **options) -> dict:
        """Train `steps` more steps (the CLI's steps option is the total; this is the number to run)
        with the trainer's own code: its schedule, accumulation, precision and optimizer, each
        option as `tinygpt train` takes it (lr=3e-3, batch=8, optimizer="adamw", precision="bf16",
        grad_accum=2, lora=8, ...). data: a text file, a directory or a token file (None: the
        built-in corpus). Returns the last step's loss, lr and gradient norm."""
        return self.trainer(steps, data, **options).run()

    @in_api_words
    def save(self, path, *, force: bool = False, dtype: str = "fp32"):
        """Write the model (weights, optimizer state, step) as a .tinygpt file, whole or not at all.
        An existing file tinygpt did not write is kept unless force. dtype: fp32, or fp16 for
        weights alone (as the export's tinygpt-fp16 format)."""
        path = file_name(path, "save")
        if dtype not in ckpt.ENCODED:
            raise UsageError(f"save: dtype {' or '.join(ckpt.ENCODED)}, got {dtype!r}")
        if not isinstance(force, bool):
            raise UsageError(f"save: force is True or False, got {force!r}")
        out = Outputs(force).claim(path, "path", "checkpoint", ckpt.is_tinygpt)
        ckpt.save(out, self._ck, dtype)
        return out


class Trainer:
    """One training run of a GPT, as `tinygpt train` runs it (start.setup: the same model, data,
    schedule, optimizer and resumed state); the model's weights are handed back to the GPT after
    each run() (and by sync()), so it samples, evaluates and saves what was trained."""

    def __init__(self, gpt: GPT, steps: int, data, options: dict):
        options = flat_config(options, "train")          # the recipe's group tables opened, as a config's
        if "steps" in options or "data" in options:
            raise UsageError("train: steps and data are the trainer's own arguments, not settings in a table")
        bad = [k for k in options if k in CLI_ONLY or k in SHAPE]
        if bad:     # a new model's seed would draw other weights than the ones it has: refused, as its shape
            where = "GPT.from_preset's" if bad[0] in SHAPE else "tinygpt train's own (its files and its run's end)"
            raise UsageError(f"train: {bad[0]} is {where} setting, not the trainer's")
        if isinstance(steps, bool) or not isinstance(steps, int) or not 1 <= steps <= 10 ** 9:
            raise UsageError(f"train: steps must be 1 to 1,000,000,000, got {steps!r}")
        fresh = gpt._recipe is not None
        mapping = dict(gpt._recipe or {}, attention=gpt.attention, kernels=gpt.kernels or None,
                       tokenizer_file=gpt.tokenizer_file)
        mapping.update(options, data=None if data is None else str(data), steps=gpt.step + steps, quiet=True)
        o = train_options(mapping, "train")
        if fresh:          # a new model: the run draws the same weights from the same seed, as the CLI
            o = dataclasses.replace(o, sample_tokens=0)
            run, _ = setup(o, gpt.gpu)
        else:
            o = dataclasses.replace(o, resume=gpt.source, sample_tokens=0)
            run, _ = setup(o, gpt.gpu, held=gpt._ck, label=gpt.source)
        self.gpt, self._run, self.o = gpt, run, o
        self.end = run.length.total
        if run.length.extension:    # the steps past the planned end run at its final lr: said, as the CLI says it
            warnings.warn(TinyGPTError(run.length.extension).worded(api_name), stacklevel=_callers_level())
        run.schedule.end_at(self.end, run.length.held)
        self.lr, self.best = run.schedule.lr, None

    @property
    def model(self) -> Model:
        return self._run.model

    @property
    def step_count(self) -> int:
        return self._run.model.step_count

    @in_api_words
    def step(self) -> float:
        """One step (on the device, nothing read back) -> the lr it took."""
        run, model = self._run, self._run.model
        if model.step_count >= self.end:
            raise UsageError(f"train: this run planned {self.end:,} steps and has taken them; make another trainer")
        self.lr = run.schedule.at(model.step_count)
        batch = run.data.sample(run.rng, model.B * model.spec.accum)
        model.step(*batch[:2], self.lr, *batch[2:])
        return self.lr

    @in_api_words
    def run(self, steps: int | None = None, callback=None, every: int = 10) -> dict:
        """`steps` more steps of the run (all it has left by default), then its weights handed to
        the GPT. callback(record) every `every` steps and at the last, record as run() returns."""
        left = self.end - self.step_count
        n = left if steps is None else steps
        if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= left:
            raise UsageError(f"train: run(steps) takes 0 to the {left:,} steps left, got {steps!r}")
        if callback is not None and not callable(callback):
            raise UsageError(f"train: run's callback is a function of the record, got {type(callback).__name__}")
        every = whole(every, "train: run's every", 1)
        rec = None
        for i in range(n):
            self.step()
            if callback and ((i + 1) % every == 0 or i + 1 == n):
                callback(rec := self.record())
        rec = rec if rec and rec["step"] == self.step_count else self.record() if n else None
        self.sync()
        return rec

    @in_api_words
    def record(self) -> dict:
        """The last step's loss, lr and gradient norm (one read), checked as the CLI checks them."""
        model = self._run.model
        loss, norm = model.loss(), model.grad_norm()
        why = unhealthy(loss, norm, self.best, self._run.cfg.vocab)
        if why:
            raise TrainingStopped(f"{why} at step {model.step_count}; {blame(model, self.lr)}", 3)
        self.best = loss if self.best is None else min(self.best, loss)
        return {"step": model.step_count, "loss": loss, "lr": self.lr, "grad_norm": norm}

    @in_api_words
    def val_loss(self, windows: int | None = 64) -> float:
        """Mean loss over the first `windows` windows of the validation split (None: all of it)."""
        windows = None if windows is None else whole(windows, "val_loss: windows", 1)
        return self._run.model.mean_loss(*self._run.data.val_windows(windows))

    def sync(self):
        """The run's weights and optimizer state into the GPT (one read of each)."""
        ck = run_file(self._run, self._run.model.get_params())
        self.gpt._adopt(ck)
        if self.gpt.source.startswith("the new "):
            self.gpt.source = "the model"


def _int_array(ids, what: str) -> np.ndarray:
    """Token ids as an int64 array: a ragged list or a value that is not a whole number is named, not
    left to a NumPy error."""
    try:
        a = np.asarray(ids)
    except (ValueError, TypeError):
        raise UsageError(f"{what}: token ids must be a list (or array) of whole numbers, rows of one "
                         "length") from None
    if a.size and not np.issubdtype(a.dtype, np.integer):
        raise UsageError(f"{what}: token ids must be whole numbers, got {a.dtype} values")
    return a.astype(np.int64)
