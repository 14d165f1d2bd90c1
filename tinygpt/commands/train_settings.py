"""tinygpt train's settings: the flags that define them (each one's help, default and check),
and the same check for any mapping of them (a --config file, the Python API's keywords), so
that a setting is checked alike wherever it comes from. The command line (cli.py) and the
Python API (api.py) both take train's settings from here; neither reads the other.
"""
from __future__ import annotations

import argparse
import re
from dataclasses import fields

from .. import tokenizers
from .argtypes import bounded_int, flag, lora_targets, loss_scale_float, nonneg_float, nonneg_int, \
    positive_float, positive_int, preset_name, seed_int, unit_float
from ..core.config import PRESETS, TINYGPT_LR, TRAIN_DEFAULTS, Config, TrainDefaults
from ..core.errors import TinyGPTError, UsageError
from ..core.fs import read_user_file
from ..core.lora import DEFAULT_TARGETS, MAX_RANK, TARGETS
from ..core.precision import PRECISIONS
from ..device.kernels import LOSS_SCALE, SCALE_GROWTH
from ..device.plan import FAMILIES, parse_kernels
from ..model import optimizers
from ..model.attention import DEFAULT as ATTENTION, IMPLS
from ..run.options import GROUP_OF, GROUPS, RUN_SETTINGS, TrainOptions
from ..run.recipe import MAX_GRAD_ACCUM

EXIT_USAGE = 2


def options(cls, args):
    """The options dataclass of a command, from its parsed flags (same names)."""
    return cls(**{f.name: getattr(args, f.name) for f in fields(cls) if hasattr(args, f.name)})


def base_shape(name: str) -> tuple:
    return PRESETS[name]


def default(cls, name: str):
    """The default an options class gives a field: the flags take theirs from there, so each
    default is written once (options.py)."""
    return next(f.default for f in fields(cls) if f.name == name)


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


def add_attention(p):
    p.add_argument("--attention", default=ATTENTION, choices=IMPLS,
                   help=f"the attention path: online (tiled, any length), naive (the score matrix) or fused_sv "
                        f"(TinyGPT's kernels); the same numbers within float32 rounding (default {ATTENTION})")


def add_tokenizer_file(p):
    p.add_argument("--tokenizer-file", metavar="PATH",
                   help="r50k_base.tiktoken, for the gpt2 tokenizer when tiktoken's cache lacks it and cannot "
                        "download it (default: tiktoken's cache)")


class Sections:
    """A parser whose flags of train's settings land in the section of the recipe's group they set
    (options.GROUPS), so that --help shows the recipe as it is grouped; any other flag stays in
    the parser's own."""

    def __init__(self, p):
        self.p = p
        self.sections = {g: p.add_argument_group(title) for g, (title, _) in GROUPS.items()}

    def add_argument(self, *names, **kw):
        dest = kw.get("dest") or next(n for n in names if n.startswith("--"))[2:].replace("-", "_")
        group = GROUP_OF.get(dest)
        return (self.sections[group] if group else self.p).add_argument(*names, **kw)


def train_flags(p, small: TrainDefaults, base: Config):
    """Every flag of `tinygpt train`: plan takes them all too, so any training command can be
    planned by changing its verb."""
    p = Sections(p)
    _shape_flags(p, base)
    _data_and_schedule_flags(p, small, base)
    _numerics_flags(p)
    _run_flags(p)


def _shape_flags(p, base: Config):
    """The model, the batch and LoRA."""
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


def _data_and_schedule_flags(p, small: TrainDefaults, base: Config):
    """The data and its tokenizer, how long, the learning-rate schedule, the clip and the seed."""
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


def _numerics_flags(p):
    """The kernels: attention, the plan, the precision and the optimizer."""
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
                   help=f"{optimizers.optimizer_help()}; default {optimizers.DEFAULT} for a new run, "
                        f"{optimizers.LORA} for a LoRA run, a resumed run's own ({optimizers.UNRECORDED} where its "
                        "file records none); resuming with another starts its state fresh")
    p.add_argument("--weight-decay", type=nonneg_float, metavar="WD",
                   help=f"decoupled weight decay of matrices and embeddings (default {optimizers.WEIGHT_DECAY:g}, "
                        "or the resumed run's)")
    for key in optimizers.FLAGS:          # each optimizer's hyperparameters, its room's help
        p.add_argument(f"--{key.replace('_', '-')}", type=unit_float, help=optimizers.flag_help(key))


def _run_flags(p):
    """Evaluation, logs, the checkpoint, the resume, samples and the profile."""
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


def flat_config(table: dict, label: str) -> dict:
    """Train's settings by name, from a config file's tables or the API's keywords: bare keys as
    they are, a table named as a group of the recipe ([training], [optimization], ...:
    options.GROUPS) opened, each key in the table of its group."""
    flat = {k: v for k, v in table.items() if not (k in GROUPS and isinstance(v, dict))}
    for group in (k for k, v in table.items() if k in GROUPS and isinstance(v, dict)):
        for key, value in table[group].items():
            if GROUP_OF.get(key) != group:
                where = f"it belongs in [{GROUP_OF[key]}] or outside any table" if key in GROUP_OF else \
                    "it is not a setting of tinygpt train"
                raise UsageError(f"{label}: [{group}] holds {key!r}, but {where}")
            if key in flat:
                raise UsageError(f"{label}: {key} is given twice, in [{group}] and outside it")
            flat[key] = value
    return flat


def settings_argv(mapping: dict, source: str, exclude=("profile", "json", "config")) -> list[str]:
    """A mapping of train's flags by long name ("d_model": 96, "recompute": True) as the command
    line that says the same: parsed by train's own flags, so each value is checked as the flag
    would check it, and a command line placed after it overrides it."""
    p = RaisingParser(prog="tinygpt train", add_help=False)
    train_flags(p, TRAIN_DEFAULTS["small"], Config())
    known = p._option_string_actions
    argv = []
    for key, value in flat_config(mapping, source).items():
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
        raise UsageError(f"{source}: {by_key(e.text)}") from None
    return argv


def by_key(message: str) -> str:
    """argparse's "argument --d-model: must be positive" as a mapping names it: "d_model: must be
    positive" (a TOML file's key, the API's keyword), not as the command line's flag."""
    m = re.match(r"argument --([a-z0-9-]+)(?:/-\w+)?: ", message)
    return f"{m.group(1).replace('-', '_')}: {message[m.end():]}" if m else message


def train_options(mapping: dict, source: str) -> TrainOptions:
    """TrainOptions from a mapping of train's settings, checked as the flags check them."""
    p = RaisingParser(prog="tinygpt train", add_help=False)
    train_flags(p, TRAIN_DEFAULTS["small"], Config())
    return options(TrainOptions, p.parse_args(settings_argv(mapping, source)))


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
