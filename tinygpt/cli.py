"""The command line: tinygpt train | plan | eval | sample | inspect | info | tune | prepare | import-hf | export.

Errors are one line on stderr with a non-zero exit code; --debug shows the traceback.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import fields
from pathlib import Path

from .version import __version__
from . import checkpoint as ckpt
from .argtypes import bounded_int, flag, lora_targets, loss_scale_float, nonneg_float, nonneg_int, \
    positive_float, positive_int, positive_ints, preset_name, seed_int, unit_float  # noqa: F401 (the scripts')
from .core.config import PRESETS, TINYGPT_LR, TRAIN_DEFAULTS, Config, TrainDefaults, n_params
from .core.errors import TinyGPTError, UsageError, set_wording, word
from .core.fs import read_user_file, writes_shown
from .core.lora import DEFAULT_TARGETS, MAX_RANK, TARGETS
from .core.precision import PRECISIONS
from .device.gpu import GPU
from .device.kernels import LOSS_SCALE, SCALE_GROWTH
from .device.plan import FAMILIES, parse_kernels
from .device.tune import tune
from .device.tuning import reset_tuning
from .export import export
from .hf import import_hf
from .info import info
from .infer import evaluate, sample
from .lens import inspect
from . import tokenizers
from .model import budget, optimizers
from .model.attention import DEFAULT as ATTENTION, IMPLS
from .options import RUN_SETTINGS, EvalOptions, ExportOptions, InspectOptions, SampleOptions, TrainOptions
from .outputs import Outputs, os_error_text
from .tables import emit
from .safety import Interrupted, stops_on_signals
from .tokenfile import data_files, is_our_sidecar, is_our_token_file, prepare, sidecar_of
from .train import MAX_GRAD_ACCUM, profile, run_budget, train

EXIT_ERROR, EXIT_USAGE, EXIT_INTERRUPT = 1, 2, 130
EXIT_BROKEN_PIPE = 128 + 13   # what a process killed by SIGPIPE returns, as `head` leaves a Unix tool
EXIT_DOES_NOT_FIT = 4          # tinygpt plan: the run it describes would be refused (docs/usage.md)


# ---- commands ----------------------------------------------------------------------------------
def cmd_info(args) -> int:
    print(info(args.model, args.json, args.brief))
    return 0


def cmd_export(args) -> int:
    with writes_shown(not args.quiet):
        export(options(ExportOptions, args))
    print(f"wrote {args.out} ({args.format})", file=sys.stderr)
    return 0


def options(cls, args):
    """The options dataclass of a command, from its parsed flags (same names)."""
    return cls(**{f.name: getattr(args, f.name) for f in fields(cls) if hasattr(args, f.name)})


def default(cls, name: str):
    """The default an options class gives a field: the flags take theirs from there, so each
    default is written once (options.py)."""
    return next(f.default for f in fields(cls) if f.name == name)


def cmd_train(args) -> int:
    o = options(TrainOptions, args)
    if args.profile:
        print(profile(o, as_json=args.json))
        return 0
    if args.json:
        raise UsageError("--json goes with --profile (its rows as JSON Lines)")
    train(o)
    return 0


def cmd_plan(args) -> int:
    gpu, plan, p, fitting = run_budget(options(TrainOptions, args), args.kernels)
    if args.json:
        d = p.as_dict()
        d["adapter"] = f"{gpu.name} ({gpu.backend})"
        if not p.fits:
            d["fitting_batch"], d["fitting_grad_accum"] = fitting
        print(json.dumps(d, indent=2))
    else:
        print(f"# {gpu.name} ({gpu.backend})\n" + budget.text(p))
    if p.fits:
        return 0
    sys.stdout.flush()
    print(f"tinygpt: {word(budget.refusal(p, plan))}", file=sys.stderr)
    return EXIT_DOES_NOT_FIT


def cmd_eval(args) -> int:
    r = evaluate(options(EvalOptions, args))
    if args.json:
        print(json.dumps(r))
    else:
        ppl = f"perplexity {r['perplexity']:.2f}" if r["perplexity"] is not None else "perplexity too large to show"
        b = f", {r['bits_per_byte']:.3f} bits/byte" if "bits_per_byte" in r else ""
        print(f"validation loss {r['loss']:.4f} nats{b} ({ppl}) over {r['windows']} windows, {r['tokens']:,} tokens "
              f"of {r['data']}")
    return 0


def cmd_sample(args) -> int:
    texts = sample(options(SampleOptions, args))
    for i, text in enumerate(texts):
        if len(texts) > 1:
            sys.stdout.write(f"---- sample {i + 1} of {len(texts)} ----\n")
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
    return 0


def cmd_inspect(args) -> int:
    _, table = inspect(options(InspectOptions, args))
    print("logit lens: the top next-token guess of each layer's residual stream\n" + table)
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


def cmd_prepare(args) -> int:
    with stops_on_signals() as stop:
        try:
            return _prepare(args)
        except KeyboardInterrupt:
            print(f"tinygpt: prepare stopped by {stop.name}; nothing was written ({args.out} is as it was)",
                  file=sys.stderr)
            return stop.exit_code


def _prepare(args) -> int:
    inputs = {f"text {i + 1}": data_files(t) for i, t in enumerate(args.text)}
    out = Outputs(args.force, {**inputs, "tokenizer_file": args.tokenizer_file})
    out.claim(args.out, "out", "token file", is_our_token_file)
    out.claim(sidecar_of(args.out), "out", "token file's sidecar", is_our_sidecar)
    side = prepare(args.text, args.out, args.tokenizer, args.tokenizer_file, show_progress=not args.quiet)
    n = side["tokens"]
    print(f"wrote {args.out}: {n:,} {side['tokenizer']} tokens ({side['dtype']}, {Path(args.out).stat().st_size:,} "
          f"bytes) from {len(side['sources'])} file{'s' * (len(side['sources']) > 1)}, "
          f"{side['split']['train']:,} for training and {side['split']['val']:,} for validation; "
          f"train with: tinygpt train --data {args.out}", file=sys.stderr)
    return 0


def cmd_import_hf(args) -> int:
    d = Path(args.directory)      # the files read inside the directory are inputs as much as it is
    inputs = {"directory": d, "directory's config.json": d / "config.json",
              "directory's model.safetensors": d / "model.safetensors"}
    out = Outputs(args.force, inputs).claim(args.out, "out", "checkpoint", ckpt.is_tinygpt)
    ck = import_hf(args.directory, quiet=args.quiet)
    with writes_shown(not args.quiet):
        ckpt.save(out, ck)
    cfg = ck.cfg
    print(f"wrote {out}: {cfg.layers} layers, d_model {cfg.d_model}, {cfg.heads} heads, ctx {cfg.ctx}, vocab "
          f"{cfg.vocab} ({n_params(cfg):,} parameters), activation {cfg.activation}, "
          f"tokenizer {ck.extra['tokenizer']}, "
          f"fresh optimizer state; "
          f"fine-tune with: tinygpt train --resume {out} --data FILE --steps N --lr X", file=sys.stderr)
    return 0


def cmd_tune(args) -> int:
    gpu = GPU()
    if args.reset:
        print(reset_tuning(gpu.key))
        return 0
    print(f"tuning kernel variants on {gpu.name} ({gpu.backend})", file=sys.stderr)
    r = tune(gpu, quick=args.quick, log=lambda m: print(m, file=sys.stderr))
    emit(r["rows"], args.json, ["kernel", "variant", "ms", "chosen"])
    if not args.json:
        print(f"chosen: {r['chosen']} -> {r['cache'] or 'not cached (see the warning)'}")
    return 0


# ---- parser -------------------------------------------------------------------------------------
class Parser(argparse.ArgumentParser):
    """Usage errors as one line on stderr (exit 2), not argparse's usage block."""

    def error(self, message):
        self.exit(EXIT_USAGE, f"tinygpt: error: {message}; see '{self.prog} --help'\n")


def kernels_arg(s):
    """--kernels matmul=vec4,attention=tiles -> {family: variant}, or a usage error listing the valid ones."""
    try:
        return parse_kernels(s)
    except TinyGPTError as e:
        raise argparse.ArgumentTypeError(e.worded(flag))


def add_kernels(p):
    p.add_argument("--kernels", type=kernels_arg, default={}, metavar="FAMILY=VARIANT,...",
                   help="force kernel variants over the plan: " + "; ".join(f"{f}={'|'.join(v)}"
                                                                      for f, v in FAMILIES.items())
                        + " (default: the plan's choice for this adapter, or tinygpt tune's)")


def add_model(p):
    p.add_argument("--model", required=True, help="the .tinygpt file (ours, or TinyGPT's own)")


def add_attention(p):
    p.add_argument("--attention", default=ATTENTION, choices=IMPLS,
                   help=f"the attention path: online (tiled, any length), naive (the score matrix) or fused_sv "
                        f"(TinyGPT's kernels); the same numbers within float32 rounding (default {ATTENTION})")


def add_tokenizer_file(p):
    p.add_argument("--tokenizer-file", metavar="PATH",
                   help="r50k_base.tiktoken, for the gpt2 tokenizer when tiktoken's cache lacks it and cannot "
                        "download it (default: tiktoken's cache)")


def base_shape(name: str) -> tuple:
    return PRESETS[name]


def add_adapters(p):
    p.add_argument("--adapters", metavar="DIR",
                   help="LoRA adapters from tinygpt export --format peft, folded into --model (the base they were "
                        "trained on, checked by its weights' hash; default: none)")


def train_flags(p, small: TrainDefaults, base: Config):
    """Every flag of `tinygpt train`: plan takes them all too, so any training command can be
    planned by changing its verb."""
    p.add_argument("--preset", default=default(TrainOptions, "preset"), type=preset_name, metavar="NAME",
                   help=f"one of {', '.join(PRESETS)} (default small)")
    p.add_argument("--config", metavar="FILE.toml",
                   help="take the settings from a TOML file, keyed by these flags' long names with _ for - "
                        "(d_model = 96, steps = 2000); flags on the command line win (default: none)")
    p.add_argument("--layers", type=positive_int,
                   help=f"transformer blocks (default: the preset's, {base_shape('small')[0]} for small; "
                        "on --resume, the file's)")
    p.add_argument("--d-model", type=positive_int,
                   help=f"the residual stream's width (default: the preset's, {base_shape('small')[1]} for small)")
    p.add_argument("--heads", type=positive_int,
                   help=f"attention heads, dividing --d-model (default: the preset's, {base_shape('small')[2]} "
                        "for small)")
    p.add_argument("--ctx", type=positive_int,
                   help=f"context length in tokens (default: the preset's, {base_shape('small')[3]} for small)")
    p.add_argument("--sliding-window", type=positive_int, metavar="N",
                   help="sliding-window attention: each position attends to its last N positions, itself included "
                        "(upstream's slidingWindow; N >= ctx is plain causal attention; default: none, or the "
                        "resumed model's)")
    p.add_argument("--batch", type=positive_int,
                   help=f"windows of --ctx tokens a step (a micro-batch with --grad-accum; default: the preset's, "
                        f"{base_shape('small')[4]} for small, or the resumed run's)")
    p.add_argument("--grad-accum", type=bounded_int(1, MAX_GRAD_ACCUM), metavar="N",
                   help="N micro-batches of --batch windows per step, their gradients summed before one update "
                        "(the step of a batch N x --batch; default 1, or the resumed run's)")
    p.add_argument("--recompute", action=argparse.BooleanOptionalAction, default=False,
                   help="save only each block's input and recompute its forward in the backward: less memory, "
                        "one more forward of the blocks a step, the same gradients bit for bit")
    p.add_argument("--lora", type=bounded_int(1, MAX_RANK), metavar="R",
                   help="fine-tune --resume's model through LoRA adapters of rank R (the base frozen, only the "
                        "adapters trained; give the fine-tune's file with --out); a LoRA checkpoint resumes its own "
                        "(default: no adapters)")
    p.add_argument("--lora-alpha", type=positive_float, metavar="A",
                   help="the adapters' alpha (scale A / R; default 2R)")
    p.add_argument("--lora-targets", type=lora_targets, metavar="T,...",
                   help=f"the matrices that get adapters, of {', '.join(TARGETS)} "
                        f"(default {','.join(DEFAULT_TARGETS)})")
    p.add_argument("--lora-biases", action=argparse.BooleanOptionalAction, default=False,
                   help="with --lora, also train every bias and LayerNorm")
    p.add_argument("--data", help="a UTF-8 text file, a directory of them, or a token file from tinygpt prepare "
                                  "(default: the built-in corpus)")
    p.add_argument("--tokenizer", choices=list(tokenizers.NAMES),
                   help=f"{tokenizers.flag_help()}; default {tokenizers.DEFAULT}, or the preset's, the token file's "
                        "or the resumed run's")
    add_tokenizer_file(p)
    p.add_argument("--steps", type=positive_int,
                   help=f"total steps (default: the preset's, {small.steps} for small; on --resume, the run's "
                        "planned end)")
    p.add_argument("--minutes", type=positive_float,
                   help="a time budget instead of --steps: the step count is fitted so the run ends on time "
                        "(default: none, --steps)")
    p.add_argument("--schedule", choices=["cosine", "constant"],
                   help=f"cosine (default: warm-up, then cosine decay to --min-lr) or constant "
                        f"(TinyGPT's, lr {TINYGPT_LR:g})")
    p.add_argument("--lr", type=positive_float,
                   help=f"peak learning rate (default: the preset's, {small.lr:g} for small)")
    p.add_argument("--warmup", type=nonneg_int,
                   help=f"linear warm-up steps (default: the preset's, {small.warmup} for small; at most a tenth "
                        "of the run)")
    p.add_argument("--min-lr", type=nonneg_float,
                   help=f"where the cosine decay ends (default: the preset's, {small.min_lr:g} for small)")
    p.add_argument("--rewarm", action=argparse.BooleanOptionalAction, default=False,
                   help="with --resume: restart the schedule at the file's step, a new warm-up to the peak lr and "
                        "a cosine to --min-lr at the new last step (default: steps past the run's planned end "
                        "continue at its final lr)")
    p.add_argument("--grad-clip", type=nonneg_float,
                   help=f"global grad-norm clip (default {base.grad_clip:g}, 0 = off)")
    p.add_argument("--seed", type=seed_int, help=f"init and data sampling seed (default {base.seed})")
    add_attention(p)
    add_kernels(p)
    p.add_argument("--precision", choices=list(PRECISIONS),
                   help="bf16, f16: matmul operands, q/k/v and saved activations stored in 16 bits, sums and "
                        "weights float32 (default fp32, or the resumed run's); f16 needs the adapter's "
                        "shader-f16 and scales the loss (--loss-scale); checkpoints stay float32")
    p.add_argument("--loss-scale", type=loss_scale_float, metavar="INIT",
                   help=f"f16's first loss scale, then halved on overflow and doubled after {SCALE_GROWTH} clean "
                        f"steps as PyTorch's GradScaler does (default {LOSS_SCALE:g}, or the resumed run's)")
    p.add_argument("--optimizer", choices=list(optimizers.NAMES),
                   help=f"{optimizers.optimizer_help()}. A new run takes {optimizers.DEFAULT}, a LoRA run "
                        f"{optimizers.LORA}, a resumed run its own ({optimizers.UNRECORDED} where its file records "
                        "none); resuming with another starts its state fresh")
    p.add_argument("--weight-decay", type=nonneg_float, metavar="WD",
                   help=f"decoupled weight decay of matrices and embeddings (default {optimizers.WEIGHT_DECAY:g}, "
                        "or the resumed run's)")
    for key in optimizers.FLAGS:          # each optimizer's hyperparameters, its room's help
        p.add_argument(f"--{key.replace('_', '-')}", type=unit_float, help=optimizers.flag_help(key))
    p.add_argument("--eval-every", type=nonneg_int,
                   help=f"evaluate --eval-windows validation windows every N steps, and the whole split at the end "
                        f"(0: never; default {RUN_SETTINGS['eval_every']}, or the resumed run's)")
    p.add_argument("--eval-windows", type=positive_int,
                   help=f"validation windows per evaluation (default {RUN_SETTINGS['eval_windows']}, "
                        "or the resumed run's)")
    p.add_argument("--log-every", type=positive_int,
                   help=f"read the loss back and show it every N steps (default {RUN_SETTINGS['log_every']}, "
                        "or the resumed run's)")
    p.add_argument("--log", "--log-file", dest="log",
                   help="append one JSON line per logged step (time, step, losses, lr, gradient norm, tokens/s) "
                        "and one for the final whole-split loss to this JSON Lines file (--log-file: the same, as "
                        "scripts/train_ddp.py spells it; default: none)")
    p.add_argument("--tensorboard", metavar="DIR",
                   help="write TensorBoard event files into DIR (tensorboard --logdir DIR): the losses, lr, gradient "
                        "norm, tokens/s and f16's loss scale (default: none)")
    p.add_argument("--keep-best", action=argparse.BooleanOptionalAction, default=None,
                   help="also keep the checkpoint of the best validation loss, as OUT.best.tinygpt beside --out "
                        "(default: off, or the resumed run's)")
    p.add_argument("--out", help="checkpoint path (default: the --resume file, else runs/PRESET.tinygpt)")
    p.add_argument("--force", action=argparse.BooleanOptionalAction, default=False,
                   help="replace --out (and its .loss.png) even if tinygpt did not write them")
    p.add_argument("--save-every", type=nonneg_int,
                   help=f"save the checkpoint every N steps as well as at the end (0: only at the end; default "
                        f"{RUN_SETTINGS['save_every']}, or the resumed run's)")
    p.add_argument("--resume", help="continue a .tinygpt checkpoint: weights, optimizer state, step, data sampling "
                                    "and the run's settings (default: a new run)")
    p.add_argument("--quiet", action=argparse.BooleanOptionalAction, default=False, help="no progress bar")
    p.add_argument("--sample-tokens", type=nonneg_int,
                   help=f"length of the greedy and the sampled text printed at the end (0: none; default "
                        f"{RUN_SETTINGS['sample_tokens']}, or the resumed run's)")
    p.add_argument("--sample-prompt",
                   help=f"what the samples at the end continue (default {RUN_SETTINGS['sample_prompt']!r}, "
                        "or the resumed run's)")
    p.add_argument("--profile", action="store_true",
                   help="run a few steps, print the GPU time, GFLOP/s, GB/s and share of the adapter's peak of "
                        "each kernel of one step, and the step's MFU, and exit")
    p.add_argument("--json", action="store_true",
                   help="JSON: with --profile, JSON Lines, one row per kernel, then the step; for plan, the budget")


class RaisingParser(Parser):
    """A parser whose errors are UsageErrors: settings given as a mapping (a TOML file, the
    Python API's keywords) are checked by the very flags that check the command line."""

    def error(self, message):
        raise UsageError(message)


NUMBER_TYPES = ("_int", "_float")      # the argument types of train's numeric flags (argtypes)
# settings of which one alone is given: the command line's drops a config file's other (it wins)
ONE_OF = (("steps", "minutes"),)


def settings_argv(mapping: dict, source: str, exclude=("profile", "json", "config")) -> list[str]:
    """A mapping of train's flags by long name ("d_model": 96, "recompute": True) as the command
    line that says the same: parsed by train's own flags, so each value is checked as the flag
    would check it, and a command line placed after it overrides it."""
    p = RaisingParser(prog="tinygpt train", add_help=False)
    train_flags(p, TRAIN_DEFAULTS["small"], Config())
    known = p._option_string_actions
    argv = []
    for key, value in mapping.items():
        name = flag(str(key))
        action = known.get(name) if key not in exclude else None
        if action is None or not str(key).isidentifier():
            raise UsageError(f"{source}: {key!r} is not a setting of tinygpt train; its settings are the long names "
                             "of its flags with _ for - (d_model, steps, lr, ...)")
        if value is None:
            continue
        if isinstance(action, (argparse._StoreTrueAction, argparse.BooleanOptionalAction)):
            if not isinstance(value, bool):
                raise UsageError(f"{source}: {key} is true or false, got {value!r}")
            argv += [name] if value else [] if isinstance(action, argparse._StoreTrueAction) else \
                [flag("no_" + str(key))]
            continue
        if isinstance(value, bool) or isinstance(value, (dict, list, tuple)) and key not in ("kernels", "lora_targets"):
            raise UsageError(f"{source}: {key} takes one value, got {value!r}")
        if isinstance(value, str) and getattr(action.type, "__name__", "").endswith(NUMBER_TYPES):
            raise UsageError(f"{source}: {key} takes a number, not the text {value!r}")
        if isinstance(value, dict):
            value = ",".join(f"{k}={v}" for k, v in value.items())
        elif isinstance(value, (list, tuple)):
            value = ",".join(map(str, value))
        argv.append(f"{name}={value}")      # one word: a value that begins with - is the value, as --flag=-x says
    try:
        p.parse_args(argv)                  # checked here, so the error names the mapping's source
    except UsageError as e:
        raise UsageError(f"{source}: {e.text}") from None
    return argv


def train_options(mapping: dict, source: str) -> TrainOptions:
    """TrainOptions from a mapping of train's settings, checked as the flags check them."""
    p = RaisingParser(prog="tinygpt train", add_help=False)
    train_flags(p, TRAIN_DEFAULTS["small"], Config())
    return options(TrainOptions, p.parse_args(settings_argv(mapping, source)))


def build_parser():
    small, base = TRAIN_DEFAULTS["small"], Config()      # the defaults the help texts name
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="show tracebacks on errors")
    ap = Parser(prog="tinygpt", description="A WebGPU trainer for small GPT models.")
    ap.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    ap.add_argument("--version", action="version", version=version(), help="the version of tinygpt and of wgpu-py")
    sub = ap.add_subparsers(dest="cmd", required=True, parser_class=Parser)

    p = sub.add_parser("train", parents=[common],
                       help="train a model (default: the small preset on the built-in corpus)")
    train_flags(p, small, base)
    p.set_defaults(fn=cmd_train)

    p = sub.add_parser("plan", parents=[common],
                       help="the memory budget of a training run (any train command's flags), buffer group by group, "
                            "against this adapter's limits")
    train_flags(p, small, base)
    p.set_defaults(fn=cmd_plan)

    p = sub.add_parser("eval", parents=[common], help="validation loss of a checkpoint")
    add_model(p)
    p.add_argument("--data", help="a text file, a directory or a token file to take the validation split of "
                                  "(default: the built-in corpus, where the model was trained on it)")
    p.add_argument("--max-windows", type=positive_int,
                   help="evaluate at most N windows of the split (default: all of them)")
    p.add_argument("--json", action="store_true", help="one JSON line instead of the sentence")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    add_attention(p)
    add_kernels(p)
    p.add_argument("--precision", choices=list(PRECISIONS), default=default(EvalOptions, "precision"),
                   help="the forward's storage: bf16 and f16 store activations and weights in 16 bits (default fp32)")
    add_tokenizer_file(p)
    add_adapters(p)
    p.set_defaults(fn=cmd_eval)

    p = sub.add_parser("sample", parents=[common], help="generate text from a checkpoint")
    add_model(p)
    p.add_argument("--prompt", default=default(SampleOptions, "prompt"),
                   help="the text to continue (default: a newline)")
    p.add_argument("--tokens", type=positive_int, default=default(SampleOptions, "tokens"),
                   help=f"tokens to generate (default {default(SampleOptions, 'tokens')})")
    p.add_argument("--temperature", type=nonneg_float, default=default(SampleOptions, "temperature"),
                   help=f"0 is greedy; higher draws more freely (default {default(SampleOptions, 'temperature')})")
    p.add_argument("--top-k", type=int, help="draw from the k most likely tokens only (default: all)")
    p.add_argument("--top-p", type=float, default=default(SampleOptions, "top_p"),
                   help="nucleus: draw from the most likely tokens that hold this share of the probability "
                        "(default 1: all)")
    p.add_argument("--num-samples", type=positive_int, default=default(SampleOptions, "num_samples"),
                   help="continuations of the prompt, in one batch (default 1)")
    p.add_argument("--no-cache", action="store_true",
                   help="recompute the whole window for every token (as --kernels decode=full)")
    p.add_argument("--seed", type=seed_int, default=default(SampleOptions, "seed"),
                   help="the same seed draws the same text (default 0)")
    p.add_argument("--precision", choices=list(PRECISIONS), default=default(SampleOptions, "precision"),
                   help="bf16 and f16 sample from a key/value cache kept in their 16 bits (default fp32)")
    add_attention(p)
    add_kernels(p)
    add_tokenizer_file(p)
    add_adapters(p)
    p.set_defaults(fn=cmd_sample)

    p = sub.add_parser("inspect", parents=[common],
                       help="attention weights of every layer and head for a prompt, and a logit lens, as a PNG")
    add_model(p)
    p.add_argument("--prompt", required=True, help="the text whose attention is drawn")
    p.add_argument("--out", required=True, help="the PNG to write")
    p.add_argument("--force", action="store_true", help="replace --out even if tinygpt did not write it")
    add_kernels(p)
    add_tokenizer_file(p)
    add_adapters(p)
    p.set_defaults(fn=cmd_inspect)

    p = sub.add_parser("info", parents=[common],
                       help="adapter, backend, features, limits and kernel plan; or a checkpoint with --model")
    p.add_argument("--model", help="describe this .tinygpt file instead (no device needed; default: the adapter)")
    p.add_argument("--json", action="store_true", help="JSON instead of the text")
    p.add_argument("--brief", action="store_true", help="one line: adapter (backend)")
    p.set_defaults(fn=cmd_info)

    p = sub.add_parser("tune", parents=[common], help="measure kernel variants on this adapter and cache the fastest")
    p.add_argument("--json", action="store_true", help="the measurements as JSON Lines")
    p.add_argument("--quick", action="store_true", help="small shapes, one repeat")
    p.add_argument("--reset", action="store_true", help="forget this adapter's cached choices and exit")
    p.set_defaults(fn=cmd_tune)

    p = sub.add_parser("prepare", parents=[common],
                       help="tokenize text files once into a token file that --data memory-maps")
    p.add_argument("text", nargs="+", help="text files, or directories of them (their files in sorted order)")
    p.add_argument("--out", required=True, help="the token file (.bin) to write, its sidecar .bin.json beside it")
    p.add_argument("--tokenizer", choices=list(tokenizers.NAMES), default=tokenizers.DEFAULT,
                   help=f"{tokenizers.flag_help()}; default {tokenizers.DEFAULT} (a token file holds uint16 ids "
                        "where the vocabulary fits them)")
    add_tokenizer_file(p)
    p.add_argument("--force", action="store_true", help="replace --out even if tinygpt did not write it")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(fn=cmd_prepare)

    p = sub.add_parser("import-hf", parents=[common],
                       help="a Hugging Face GPT2LMHeadModel directory as a .tinygpt to fine-tune")
    p.add_argument("directory", help="with config.json and model.safetensors")
    p.add_argument("--out", required=True, help="the .tinygpt to write")
    p.add_argument("--force", action="store_true", help="replace --out even if tinygpt did not write it")
    p.add_argument("--quiet", action="store_true", help="no progress bar (shown for weights of 64 MiB or more)")
    # GPT-2's tanh GELU is imported as itself now; the flag that accepted it stays accepted, unused
    p.set_defaults(fn=cmd_import_hf)

    p = sub.add_parser("export", parents=[common], help="weights as safetensors (TinyGPT's names), a Hugging Face "
                       "GPT-2 directory, or a compact fp16 .tinygpt")
    add_model(p)
    p.add_argument("--format", required=True, choices=["safetensors", "hf", "tinygpt", "tinygpt-fp16", "peft"],
                   help="tinygpt-fp16: float16 weights without optimizer state, as TinyGPT's gallery ships them; "
                        "tinygpt: float32 (with --merge, a LoRA run as a plain model TinyGPT's readers compute); "
                        "peft: a LoRA run's adapters as Hugging Face PEFT's adapter directory for --format hf's model")
    p.add_argument("--merge", action="store_true",
                   help="fold a LoRA run's adapters into the weights (W + alpha/r (B A)^T) for the other formats")
    p.add_argument("--force", action="store_true", help="replace files tinygpt did not write")
    p.add_argument("--quiet", action="store_true", help="no progress bar (shown for files of 64 MiB or more)")
    add_tokenizer_file(p)
    p.add_argument("out")
    p.set_defaults(fn=cmd_export)
    return ap


def handled(name: str, fn, debug: bool, stopped: str, traceback_hint: str) -> int:
    """fn() under the one error rule of the CLI and the scripts: every error one line on stderr with
    an exit code, no traceback unless debug; a TinyGPTError carries its own code (an Interrupted
    run has said why already)."""
    set_wording(flag)
    try:
        code = fn() or 0
        sys.stdout.flush()          # here, where a reader that left is caught, not at the exit
        return code
    except BrokenPipeError:         # `tinygpt info | head`: the reader left; end quietly, as Unix tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())     # nothing more to flush at exit
        return EXIT_BROKEN_PIPE
    except KeyboardInterrupt:
        print(f"{name}: {stopped}", file=sys.stderr)
        return EXIT_INTERRUPT
    except Exception as e:      # the last guard: one line, whatever it was
        if debug:
            raise
        if isinstance(e, TinyGPTError):
            if not isinstance(e, Interrupted):
                print(f"{name}: error: {e.worded(flag)}", file=sys.stderr)
            return e.exit_code
        if isinstance(e, OSError):
            text = os_error_text(e)
        else:
            lines = str(e).strip().splitlines()
            text = f"{lines[0] if lines else type(e).__name__} ({traceback_hint} shows the traceback)"
        print(f"{name}: error: {text}", file=sys.stderr)
        return EXIT_ERROR


def run_script(name: str, main) -> None:
    """A script's entry point under the CLI's rules (TINYGPT_DEBUG=1 shows the traceback)."""
    sys.exit(handled(name, main, bool(os.environ.get("TINYGPT_DEBUG")), "stopped", "TINYGPT_DEBUG=1"))


MAX_CONFIG_BYTES = 1 << 20


def read_config(path: str) -> dict:
    """A --config file: a TOML table of train's settings, read whole once its size is checked."""
    try:
        import tomllib
    except ImportError:                 # Python 3.10: the same parser, before the standard library took it
        import tomli as tomllib
    label = f"--config {path}"
    raw = read_user_file(path, UsageError, label, "a TOML file of train's settings", MAX_CONFIG_BYTES, "1 MiB")
    try:
        table = tomllib.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise UsageError(f"{label}: not TOML ({e}); write one setting a line, such as d_model = 96") from None
    if "config" in table:
        raise UsageError(f"{label}: a config does not name another config; copy its settings in")
    return table


def with_config(argv: list, args) -> argparse.Namespace:
    """train and plan with --config: the file's settings as flags placed before the command
    line's own, so each is checked as its flag is, and the command line wins."""
    if getattr(args, "config", None) is None:
        return args
    at = argv.index(args.cmd) + 1
    table = read_config(args.config)
    for group in ONE_OF:
        if any(getattr(args, key, None) is not None for key in group):
            table = {k: v for k, v in table.items() if k not in group}
    settings = settings_argv(table, f"--config {args.config}")
    return build_parser().parse_args(argv[:at] + settings + argv[at:])


def version() -> str:
    import platform
    import wgpu
    return f"tinygpt {__version__} (wgpu-py {wgpu.__version__}, Python {platform.python_version()})"


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)

    def run():
        args = build_parser().parse_args(argv)       # --help too: its reader may leave early
        settled = with_config(argv, args)
        return settled.fn(settled)
    return handled("tinygpt", run, "--debug" in argv,
                   "stopped at once without saving; the last checkpoint on disk is kept", "--debug")
