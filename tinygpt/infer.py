"""Evaluation and sampling of a trained model: `tinygpt eval`, `tinygpt sample`, and the end of
`tinygpt train`.
"""
from __future__ import annotations

import math
import sys

import numpy as np

from . import checkpoint as ckpt
from .config import Config
from .data import Dataset, get_tokenizer, read_corpus
from .errors import UsageError
from .gpu import GPU
from .model import Model
from .options import EvalOptions, SampleOptions
from .plan import make_plan

# The end of a run and `tinygpt eval` read the whole validation split, up to this many windows
# (a 100 MB text has ~150,000 of ctx 64; this many give the mean to about 0.3 %).
FINAL_EVAL_WINDOWS = 8192


def data_path_for(given: str | None, recorded: str | None, source: str) -> str | None:
    """The data to read: the one given, or the built-in corpus. A path recorded in a file is
    never opened on the file's word: the user is asked to name it."""
    if given or not recorded:
        return given
    raise UsageError(f"{source} was trained on {recorded}; give {{opt:data}} {recorded} (or another text file) "
                     "to use it: tinygpt does not open paths read from a file")


def tokenizer_of(ck: ckpt.Checkpoint, tokenizer_file=None):
    """The checkpoint's tokenizer (load() has checked that it produces the file's vocabulary)."""
    return get_tokenizer(ckpt.tokenizer_name(ck.extra, ck.cfg.vocab), tokenizer_file)


def bits(loss_nats: float) -> float:
    """Nats per token as bits per token: bits per byte for the byte vocabulary (per character
    on ASCII text), the unit char-level results are usually given in."""
    return loss_nats / math.log(2)


def evaluate(o: EvalOptions, gpu: GPU | None = None, ck: ckpt.Checkpoint | None = None) -> dict:
    """Mean validation loss of a checkpoint over the whole validation split (or max_windows)."""
    ck = ck or ckpt.load(o.model, f"{{opt:model}} {o.model}")
    cfg = ck.cfg
    tok = tokenizer_of(ck, o.tokenizer_file)
    raw, _ = read_corpus(data_path_for(o.data, ck.extra.get("data"), f"{{opt:model}} {o.model}"))
    data = Dataset(tok.encode(raw), cfg.ctx)
    xs, ys = data.val_windows(o.max_windows)
    gpu = gpu or GPU()
    model = Model(gpu, cfg, o.attention, B=min(cfg.batch, len(xs)), training=False,
                  plan=make_plan(gpu, o.kernels))
    model.set_params(ck.params)
    loss = model.mean_loss(xs, ys)
    # exp overflows past ~709 nats: say so instead of failing
    ppl = math.exp(loss) if math.isfinite(loss) and loss < 700 else None
    r = {"loss": loss, "perplexity": ppl, "windows": len(xs), "tokens": len(xs) * cfg.ctx}
    if tok.name == "byte":
        r["bits_per_byte"] = bits(loss)
    return r


def pick(logits: np.ndarray, temperature: float, top_k: int | None, rng: np.random.Generator) -> int:
    """The next token: argmax at temperature 0, else a draw from softmax(logits / temperature)
    over the top_k most likely tokens (all when top_k is None)."""
    if temperature <= 0:
        return int(np.argmax(logits))
    z = logits.astype(np.float64) / temperature
    if top_k and top_k < len(z):
        kth = np.partition(z, -top_k)[-top_k]
        z = np.where(z < kth, -np.inf, z)
    p = np.exp(z - z.max())
    p /= p.sum()
    return int(rng.choice(len(p), p=p))


class Sampler:
    """A [1, ctx] forward-only copy of a model, built once and reused for several samples.
    Each new token is one forward of the last ctx tokens on the GPU."""

    def __init__(self, gpu: GPU, cfg: Config, tok, attention: str = "online", plan=None):
        self.cfg, self.tok = cfg, tok
        self.model = Model(gpu, cfg, attention, B=1, training=False, plan=plan)

    def set_params(self, params: dict):
        self.model.set_params(params)

    def next_logits(self, ids: list[int]) -> np.ndarray:
        window = ids[-self.cfg.ctx:]
        x = np.zeros((1, self.cfg.ctx), np.uint32)
        x[0, :len(window)] = window          # later positions cannot affect earlier ones (causal)
        return self.model.logits_row(x, len(window) - 1)

    def generate(self, prompt: str, n: int, temperature: float = 0.0, top_k: int | None = None,
                 seed: int = 0) -> str:
        """prompt + n generated tokens, decoded; the same seed gives the same text."""
        ids = [int(i) for i in self.tok.encode(prompt)] or [int(self.tok.encode("\n")[0])]
        rng = np.random.default_rng(seed)
        for _ in range(n):
            ids.append(pick(self.next_logits(ids), temperature, top_k, rng))
        return self.tok.decode(ids)


def sample(o: SampleOptions, gpu: GPU | None = None, err=None) -> str:
    """`tinygpt sample`: prompt + o.tokens generated tokens, decoded."""
    ck = ckpt.load(o.model, f"{{opt:model}} {o.model}")
    if o.top_k is not None and o.top_k > ck.cfg.vocab:
        raise UsageError(f"{{opt:top_k}} {o.top_k} exceeds the vocabulary ({ck.cfg.vocab})")
    tok = tokenizer_of(ck, o.tokenizer_file)
    gpu = gpu or GPU()
    print(f"sampling {o.tokens} tokens at temperature {o.temperature} on {gpu.name}", file=err or sys.stderr)
    s = Sampler(gpu, ck.cfg, tok, o.attention, make_plan(gpu, o.kernels))
    s.set_params(ck.params)
    return s.generate(o.prompt, o.tokens, o.temperature, o.top_k, o.seed)
