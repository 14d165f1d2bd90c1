"""Evaluation and sampling of a trained model: `tinygpt eval`, `tinygpt sample`, and the end of
`tinygpt train`.
"""
from __future__ import annotations

import math
import sys

from ..files import checkpoint as ckpt
from ..files.lora_files import model_params
from ..core.errors import UsageError
from ..core.precision import PRECISIONS
from ..files.data import progress
from .. import tokenizers
from ..device.gpu import GPU
from ..device.planner import make_plan
from ..core.config import UNSCORED, n_params, param_shapes
from ..model import budget
from ..model.budget import device_limits
from ..model.decode import Decoder
from ..model.layout import flat_part
from ..model.gpt import Model
from .options import EvalOptions, SampleOptions
from ..files.tokenfile import open_dataset
from ..files.chat_data import is_chat_file, is_preference_file, pack, packed_windows, pair_windows, read_chat_file, \
    read_preference_file
from ..core.dpo import DPO_BETA, preference_stats
from ..tokenizers.chat import template_of
from ..model.spec import RunSpec, at_rows, at_rows_params, decoder_spec, rows_for
from ..model.twincheck import verify

# The end of a run and `tinygpt eval` read the whole validation split, up to this many windows
# (a 100 MB text has ~150,000 of ctx 64; this many give the mean to about 0.3 %).
FINAL_EVAL_WINDOWS = 8192
BAR_FROM_WINDOWS = 512      # fewer take a second or two: a bar then only on a terminal
EVAL_CTX = 1024             # eval's windows of a longer-context model unless its options say (the file keeps its own)


def recorded_corpus(ck: ckpt.Checkpoint | None):
    """The corpus a file says its model was trained on, other than the built-in one: ours as the
    path our run read, upstream's as its header's corpus (a name, or an object naming one)."""
    if ck is None:
        return None
    if "data" in ck.extra:
        return ck.extra["data"]
    corpus = ck.header.get("corpus")
    if isinstance(corpus, dict):
        corpus = next((corpus[k] for k in ("name", "id", "label", "source") if isinstance(corpus.get(k), str)),
                      corpus)
    return None if corpus in (None, "", ckpt.BUILTIN_CORPUS) else corpus


def data_path_for(given: str | None, ck: ckpt.Checkpoint | None, source: str) -> str | None:
    """The data to read: the one given, or the built-in corpus where the file records no other.
    A path or name recorded in a file is never opened on the file's word: the user is asked
    to name the text."""
    recorded = recorded_corpus(ck)
    if given or not recorded:
        return given
    if isinstance(recorded, str) and ck is not None and "data" in ck.extra:
        raise UsageError(f"{source} was trained on {recorded}; give {{opt:data}} {recorded} (or another text file) "
                         "to use it: tinygpt does not open paths read from a file")
    raise UsageError(f"{source} was trained on the corpus {ckpt.show(recorded)}, not tinygpt's built-in one; give "
                     "{opt:data} FILE with that text (or another) to use it")


def tokenizer_of(ck: ckpt.Checkpoint, tokenizer_file=None):
    """The checkpoint's tokenizer (load() has checked that it produces the file's vocabulary)."""
    return tokenizers.of_record(ck.extra, ck.cfg.vocab, tokenizer_file)


def bits(loss_nats: float) -> float:
    """Nats per token as bits per token: bits per byte for the byte vocabulary (per character
    on ASCII text), the unit char-level results are usually given in."""
    return loss_nats / math.log(2)


def evaluate(o: EvalOptions, gpu: GPU | None = None, ck: ckpt.Checkpoint | None = None) -> dict:
    """Mean validation loss of a checkpoint over the whole validation split (or max_windows); of
    a chat file, over the assistant tokens of every record (a held-out file is its own split)."""
    ck = ck or ckpt.load(o.model, f"{{opt:model}} {o.model}", moments=False)
    if o.ctx is not None and not 2 <= o.ctx <= ck.cfg.ctx:
        raise UsageError(f"{{opt:ctx}} {o.ctx}: this model's windows are 2 to its context, {ck.cfg.ctx:,} tokens")
    tok = tokenizer_of(ck, o.tokenizer_file)
    path = data_path_for(o.data, ck, f"{{opt:model}} {o.model}")
    if is_preference_file(path):
        return evaluate_pairs(o, ck, tok, path, gpu)
    if o.reference is not None:
        raise UsageError("{opt:reference} is the DPO reference of a preference file's pairs; give {opt:data} one, or "
                         "drop it")
    if is_chat_file(path):
        records = read_chat_file(path, template_of(ck.extra, tok), tok, stop_ids(ck.extra, tok, ck.cfg.vocab),
                                 o.ctx or ck.cfg.ctx, o.truncate)
        longest = max(len(r.ids) - 1 for r in records)
        cfg = at_rows(ck.cfg, o.ctx or rows_for(ck.cfg.ctx, longest, 64))     # the longest record's window
        bins = pack(records, cfg.ctx)                                   # several records a window
        bins = bins[:o.max_windows] if o.max_windows else bins
        xs, ys, _, docs = packed_windows(records, bins, cfg.ctx)
        name = f"{path} ({sum(map(len, bins)):,} conversations in {len(xs):,} windows, the assistant's tokens)"
    else:
        cfg = at_rows(ck.cfg, o.ctx or min(ck.cfg.ctx, EVAL_CTX))       # the windows scored, never over the model's
        data = open_dataset(path, tok, cfg.ctx)
        xs, ys = data.val_windows(o.max_windows)
        name, docs = data.name, None
    gpu = gpu or GPU()
    plan = make_plan(gpu, o.kernels)
    spec = RunSpec(cfg, o.attention, B=min(cfg.batch, len(xs)), training=False, precision=PRECISIONS[o.precision],
                   packed=docs is not None)
    limits = device_limits(gpu)
    budget.check_use(budget.eval_bytes(spec, plan, limits), 4 * n_params(cfg), limits,
                     f"evaluating windows of {cfg.ctx:,} tokens, {spec.B} at once", "use a smaller {opt:ctx}")
    verify(gpu, plan, spec)
    model = Model(gpu, plan, spec)
    model.set_params(at_rows_params(cfg, model_params(ck, f"{{opt:model}} {o.model}", o.adapters)))
    with progress(len(xs), "evaluating", "window", o.quiet, shown_from=BAR_FROM_WINDOWS) as bar:
        loss = model.mean_loss(xs, ys, docs=docs, progress=bar)
    # exp overflows past ~709 nats: say so instead of failing
    ppl = math.exp(loss) if math.isfinite(loss) and loss < 700 else None
    r = {"loss": loss, "perplexity": ppl, "windows": len(xs), "tokens": int((ys != UNSCORED).sum()), "data": name,
         "ctx": cfg.ctx}
    if tok.token_is_byte:
        r["bits_per_byte"] = bits(loss)
    return r


def evaluate_pairs(o: EvalOptions, ck: ckpt.Checkpoint, tok, path, gpu: GPU | None = None) -> dict:
    """A preference file's DPO loss, reward accuracy and margins (core.dpo) against the reference:
    a LoRA run's base (its file's weights, the adapters off), or the reference option's model. One
    model computes both sides' log-probabilities, the policy's weights and then the reference's."""
    label = f"{{opt:model}} {o.model}"
    policy = model_params(ck, label, o.adapters)
    if o.reference is not None:
        ref = ckpt.load(o.reference, f"{{opt:reference}} {o.reference}", moments=False)
        if list(param_shapes(ref.cfg)) != list(param_shapes(ck.cfg)):
            raise UsageError(f"{{opt:reference}} {o.reference}: not the shape of {o.model}; give the model its DPO run "
                             "started from")
        reference = model_params(ref, f"{{opt:reference}} {o.reference}")
    elif policy is not ck.params:
        reference = ck.params                 # the base the adapters were trained on
    else:
        raise UsageError(f"{o.model} holds no LoRA adapters, so no base to score the pairs against; give the model "
                         "its DPO run started from with {opt:reference}")
    pairs = read_preference_file(path, template_of(ck.extra, tok), tok, stop_ids(ck.extra, tok, ck.cfg.vocab),
                                 o.ctx or ck.cfg.ctx, o.truncate)
    pairs = pairs[:max(1, o.max_windows // 2)] if o.max_windows else pairs
    longest = max(len(r.ids) - 1 for p in pairs for r in (p.chosen, p.rejected))
    cfg = at_rows(ck.cfg, o.ctx or rows_for(ck.cfg.ctx, longest, 64))
    xs, ys = pair_windows(pairs, cfg.ctx)
    gpu = gpu or GPU()
    plan = make_plan(gpu, o.kernels)
    spec = RunSpec(cfg, o.attention, B=min(cfg.batch, len(xs)), training=False, precision=PRECISIONS[o.precision])
    limits = device_limits(gpu)
    budget.check_use(budget.eval_bytes(spec, plan, limits), 8 * n_params(cfg), limits,
                     f"scoring windows of {cfg.ctx:,} tokens, {spec.B} at once", "use a smaller {opt:ctx}")
    verify(gpu, plan, spec)
    model = Model(gpu, plan, spec)
    logprobs = []
    for params in (policy, reference):
        model.set_params(at_rows_params(cfg, params))
        logprobs.append(model.window_logprobs(xs, ys))
    beta = o.dpo_beta if o.dpo_beta is not None else DPO_BETA
    return {**preference_stats(*logprobs, beta), "beta": beta, "perplexity": None, "windows": len(xs),
            "tokens": int((ys != UNSCORED).sum()), "data": f"{path} ({len(pairs):,} preference pairs)", "ctx": cfg.ctx}


def prompt_ids(tok, prompt: str) -> list[int]:
    """A text prompt's ids; an empty prompt starts from a newline, as a model needs one token."""
    return [int(i) for i in tok.encode(prompt)] or [int(tok.encode("\n")[0])]


def texts(decoder: Decoder, tok, prompt: str, n: int, temperature: float = 0.0, top_k: int | None = None,
          top_p: float = 1.0, seed: int = 0, stop=()) -> list[str]:
    """prompt + up to n generated tokens, decoded, for each of the decoder's sequences: the one way
    text is generated (the sample command, the end of a run and the Python API); a seed gives the
    same texts. stop: the ids that end a sequence (stop_ids), never part of the text."""
    return [tok.decode(seq) for seq in decoder.generate(prompt_ids(tok, prompt), n, temperature, top_k, top_p, seed,
                                                        stop)]


MAX_STOP_IDS = 64


def stop_ids(extra: dict, tok, vocab: int) -> tuple:
    """The ids that end a model's turn: those its file records (an import's generation config,
    tokenizer and GGUF name them: stopTokens), and its Hugging Face tokenizer's end of text. A
    model trained here records none: its samples run to the length asked."""
    ids = extra.get("stopTokens")
    ids = [i for i in ids[:MAX_STOP_IDS] if isinstance(i, int) and not isinstance(i, bool) and 0 <= i < vocab] \
        if isinstance(ids, list) else []
    eos = getattr(tok, "eos_id", None) if getattr(tok, "name", None) == "hf" else None
    return tuple(dict.fromkeys(ids + ([eos] if eos is not None else [])))


MAX_SAMPLE_TOKENS = 100_000
MAX_SAMPLES = 256


def check_sampling(tokens: int, temperature: float, top_k: int | None, top_p: float, num_samples: int,
                   vocab: int | None = None):
    """What `tinygpt sample` and the Python API's generate accept, checked before anything is built."""
    if isinstance(tokens, bool) or not isinstance(tokens, int) or not 1 <= tokens <= MAX_SAMPLE_TOKENS:
        raise UsageError(f"{{opt:tokens}} must be 1 to {MAX_SAMPLE_TOKENS:,}, got {tokens!r}")
    if isinstance(num_samples, bool) or not isinstance(num_samples, int) or not 1 <= num_samples <= MAX_SAMPLES:
        raise UsageError(f"{{opt:num_samples}} must be 1 to {MAX_SAMPLES}, got {num_samples!r}")
    if not isinstance(temperature, (int, float)) or not 0 <= temperature < math.inf:
        raise UsageError(f"{{opt:temperature}} must be 0 (greedy) or more, got {temperature!r}")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k <= 0):
        raise UsageError(f"{{opt:top_k}} must be positive, got {top_k!r}")
    if top_k is not None and vocab is not None and top_k > vocab:
        raise UsageError(f"{{opt:top_k}} {top_k} exceeds the vocabulary ({vocab})")
    if not isinstance(top_p, (int, float)) or not 0 < top_p <= 1:
        raise UsageError(f"{{opt:top_p}} must be in (0, 1], got {top_p!r}")


def load_model(o) -> tuple:
    """(the checkpoint without its moments, its tokenizer) of a command that runs a model."""
    ck = ckpt.load(o.model, f"{{opt:model}} {o.model}", moments=False)
    return ck, tokenizer_of(ck, o.tokenizer_file)


def decoder_for(o, ck: ckpt.Checkpoint, rows: int, tokens: int, gpu: GPU | None = None, params=None,
                N: int = 1, fix: str = "") -> Decoder:
    """A decoder of N sequences over `rows` positions drawing up to `tokens`, as the options ask
    (attention, kernels, precision, no_cache), its memory counted before anything is allocated
    (fix: the options that would make it fit), its kernels checked and its weights set."""
    gpu = gpu or GPU()
    kernels = dict(o.kernels, **({"decode": "full"} if getattr(o, "no_cache", False) else {}))
    plan = make_plan(gpu, kernels)
    spec = decoder_spec(ck.cfg, o.attention, N, PRECISIONS[o.precision], rows=rows)
    limits = device_limits(gpu)
    part = flat_part(limits["max_buffer"], limits["align"])
    budget.check_use(budget.sampler_bytes(spec, tokens, plan, limits["max_binding"], part), 4 * n_params(ck.cfg),
                     limits, f"sampling {N} x {tokens} tokens over {rows:,} positions",
                     fix or "use {opt:precision} bf16 or a smaller model")
    verify(gpu, plan, spec)                         # before the kernels are trusted
    decoder = Decoder(gpu, plan, spec, tokens)
    decoder.set_params(params if params is not None else model_params(ck, f"{{opt:model}} {o.model}", o.adapters))
    return decoder


def sample(o: SampleOptions, gpu: GPU | None = None, err=None) -> list[str]:
    """`tinygpt sample`: o.num_samples texts of prompt + up to o.tokens generated tokens (a sample
    ends at the model's end-of-turn tokens, unless o.ignore_eos)."""
    check_sampling(o.tokens, o.temperature, o.top_k, o.top_p, o.num_samples)
    ck, tok = load_model(o)
    check_sampling(o.tokens, o.temperature, o.top_k, o.top_p, o.num_samples, ck.cfg.vocab)
    ids = prompt_ids(tok, o.prompt)
    decoder = decoder_for(o, ck, rows_for(ck.cfg.ctx, len(ids) + o.tokens), o.tokens, gpu, N=o.num_samples,
                          fix="ask for fewer {opt:num_samples} or {opt:tokens}, or use {opt:precision} bf16")
    ck.params = {}                      # on the device now: the host's copy is let go
    how = {"cache": "key/value cache", "full": "the whole window per token"}[decoder.mode]
    stop = () if o.ignore_eos else stop_ids(ck.extra, tok, ck.cfg.vocab)
    ends = f", ending at {len(stop)} end-of-turn token{'s' * (len(stop) > 1)}" if stop else ""
    print(f"sampling {o.num_samples} x {o.tokens} tokens at temperature {o.temperature} on {decoder.gpu.name} "
          f"({how}, {PRECISIONS[o.precision].name}; a window of {decoder.cfg.ctx:,} positions{ends})",
          file=err or sys.stderr)
    return texts(decoder, tok, o.prompt, o.tokens, o.temperature, o.top_k, o.top_p, o.seed, stop)
