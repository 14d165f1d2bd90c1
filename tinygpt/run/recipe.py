"""The run a train or plan command asks for, resolved once from its options and the resumed file
into a Recipe: its config, tokenizer and schedule, LoRA adapters, accumulation, precision, loss
scale and optimizer, its settings and length, and the RunSpec the memory budget and the model
take as it is. Each piece is decided here, in one function, and make_recipe calls them all, the
same for `train`, `plan` and the Python API; start.py builds what the recipe says and train.py
runs it, deciding none of it again.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..files import checkpoint as ckpt
from ..files import lora_files
from ..files import optim_state
from .. import tokenizers
from ..core.block import BIAS_OF_TOGGLE, BLOCKS, POSITIONS
from ..core.config import PRESET_TOKENIZER, TRAIN_DEFAULTS, Config, preset
from ..core.errors import UsageError
from ..core.lora import base_hash, init_adapters, make_lora
from ..core.precision import PRECISIONS, Precision
from ..device.gpu import GPU
from ..device.kernels import LOSS_SCALE
from ..device.planner import make_plan
from ..model import optimizers
from ..model.attention import path as attention_path
from ..model.budget import device_limits, largest_fitting_batch, memory_budget
from ..model.spec import RunSpec
from .options import MAX_GRAD_ACCUM, RUN_SETTINGS, TrainOptions
from .safety import TrainingStopped
from .schedule import Schedule, resolve
from ..files.outputs import Outputs, derived, is_json_lines, is_our_png
from .runlog import claim_directory
from ..files.tokenfile import data_files, is_token_file, read_sidecar
from ..files.chat_data import is_chat_file, is_preference_file
from ..core.dpo import DPO_BETA

LORA_LR = 1e-3          # a new LoRA run's peak learning rate where the lr option is not given
LORA_STEPS = 300        # and its steps where the steps option is not (results.md's fine-tune, "LoRA")
POSITIVE = ("eval_windows", "log_every")        # the run settings that cannot be 0


def _differences(fcfg: Config, o: TrainOptions) -> list[str]:
    diffs = []
    for name in ("layers", "d_model", "heads"):
        want = getattr(o, name)
        if want is not None and want != getattr(fcfg, name):
            diffs.append(f"{{opt:{name}}} {want} (file: {getattr(fcfg, name)})")
    if o.ctx is not None and o.ctx > fcfg.ctx:      # up to the context: the run's windows (run_window)
        diffs.append(f"{{opt:ctx}} {o.ctx} (file: {fcfg.ctx}), over the model's context")
    want = o.sliding_window       # a window of ctx or more is the plain attention the file may have
    if want is not None and (want if want < fcfg.ctx else 0) != fcfg.attn_window:
        diffs.append(f"{{opt:sliding_window}} {want} (file: {fcfg.attn_window or 'none'})")
    for name, (theirs, value) in PARTS.items():
        want = getattr(o, name)
        if want is not None and value(want) != getattr(fcfg, theirs):
            diffs.append(f"{{opt:{name}}} {want} (file: {theirs} {getattr(fcfg, theirs)})")
    if o.block is not None:         # the set's parts, where no option of their own replaces them
        given = {FIELD.get(theirs, theirs) for n, (theirs, _) in PARTS.items() if getattr(o, n) is not None}
        fields = {f for parts in BLOCKS.values() for f in parts} - given
        if any(BLOCKS[o.block].get(f, getattr(Config(), f)) != getattr(fcfg, f) for f in fields):
            diffs.append(f"{{opt:block}} {o.block} (file: {fcfg.block.describe()})")
    return diffs


same = lambda v: v
# the block's options -> (the Config field each sets, its value there)
PARTS = {"norm": ("norm", same), "norm_eps": ("norm_eps", same), "position": ("position", same),
         "rope_theta": ("rope_theta", same), "mlp": ("activation", same),
         "bias": ("bias", lambda on: BIAS_OF_TOGGLE[bool(on)]), "untied_head": ("tied", lambda untied: not untied),
         "qk_norm": ("qk_norm", same), "kv_heads": ("n_kv", same), "head_dim": ("hd", same),
         "logit_softcap": ("softcap", float), "embed_norm": ("embed_norm", same)}


FIELD = {"n_kv": "kv_heads", "hd": "head_dim"}     # parts compared as the config resolves them, set as their fields


def block_parts(o: TrainOptions) -> dict:
    """The Config fields the block's options set (None: the preset's): the block's set (core.block's
    BLOCKS), each part's own option over it."""
    parts = dict(BLOCKS[o.block or "gpt2"])
    parts.update({FIELD.get(theirs, theirs): value(getattr(o, name))
                  for name, (theirs, value) in PARTS.items() if getattr(o, name) is not None})
    if o.rope_theta is not None and not POSITIONS[parts.get("position", "learned")].rotary:
        raise UsageError("{opt:rope_theta} is RoPE's base: give it with {opt:position} rope")
    return parts


def run_lora(o: TrainOptions, resume: ckpt.Checkpoint | None, label: str):
    """(the run's LoRA state or None, whether its adapters are new): the resumed file's adapters
    (the options may not contradict them), or new ones on the resumed model where the lora option is given."""
    held = lora_files.read(resume, label) if resume else None
    given = o.lora is not None or o.lora_alpha is not None or o.lora_targets is not None or o.lora_biases
    if held is not None:
        if given:
            want = make_lora(o.lora if o.lora is not None else held.lora.rank,
                             o.lora_alpha if o.lora_alpha is not None else held.lora.alpha,
                             o.lora_targets if o.lora_targets is not None else held.lora.as_dict()["targets"],
                             o.lora_biases or held.lora.biases)
            if want != held.lora:
                raise TrainingStopped(f"{label} holds LoRA adapters {held.lora.as_dict()}; the LoRA options ask for "
                                      f"{want.as_dict()}: drop them to continue these adapters", 2)
        return held, False
    if not given:
        return None, False
    if o.lora is None:
        raise UsageError("{opt:lora_alpha}, {opt:lora_targets} and {opt:lora_biases} shape LoRA adapters: give "
                         "their rank with {opt:lora}")
    lora = make_lora(o.lora, o.lora_alpha, o.lora_targets, o.lora_biases)
    if resume is None:
        raise UsageError("{opt:lora} fine-tunes a trained model: give it with {opt:resume} BASE.tinygpt (and the "
                         "fine-tune's file with {opt:out})")
    adapters = init_adapters(resume.cfg, lora)
    zeros = {n: np.zeros_like(a) for n, a in adapters.items()}
    return lora_files.LoraState(lora, adapters, zeros, {n: z.copy() for n, z in zeros.items()},
                                base_hash(resume.params, resume.cfg), resume.step), True


def run_config(o: TrainOptions, resume: ckpt.Checkpoint | None, new_lora: bool = False) -> tuple[Config, str, Schedule]:
    """(config, tokenizer name, schedule) of the run: the resumed file's, with the options that
    may change on resume, or the preset's with the options over it. New LoRA adapters on a
    resumed model are a new run on its shape: the schedule is the options' (peak lr LORA_LR)."""
    if resume is None:
        cfg = preset(o.preset, layers=o.layers, d_model=o.d_model, heads=o.heads, ctx=o.ctx,
                     batch=o.batch, grad_clip=o.grad_clip, seed=o.seed, window=o.sliding_window, **block_parts(o))
        prepared = read_sidecar(o.data)["tokenizer"] if is_token_file(o.data) else None   # a token file's own
        return cfg, o.tokenizer or prepared or PRESET_TOKENIZER.get(o.preset, (tokenizers.DEFAULT,))[0], resolve(o)
    diffs = _differences(resume.cfg, o)
    tok_file = ckpt.tokenizer_name(resume.extra, resume.cfg.vocab)
    if o.tokenizer and o.tokenizer != tok_file:
        diffs.append(f"{{opt:tokenizer}} {o.tokenizer} (file: {tok_file})")
    if diffs:
        raise TrainingStopped(f"{{opt:resume}} {o.resume}: these options contradict the file: "
                              f"{'; '.join(diffs)}; drop them to continue the saved model", 2)
    cfg = resume.cfg
    for k in ("batch", "grad_clip"):
        if getattr(o, k) is not None:
            setattr(cfg, k, getattr(o, k))
    if new_lora:
        sched = resolve(o)
        if o.lr is None:
            sched.lr = LORA_LR
            sched.min_lr = LORA_LR / 10 if o.min_lr is None else sched.min_lr
        if sched.kind == "cosine" and sched.min_lr > sched.lr:
            raise UsageError(f"{{opt:min_lr}} {sched.min_lr:g} is above the peak lr {sched.lr:g}; give a smaller "
                             "{opt:min_lr}")
        sched.total = LORA_STEPS          # its own run: the base's planned end is not its end
        return cfg, tok_file, sched
    return cfg, tok_file, resolve(o, resume.extra.get("schedule"), cfg.lr)


def run_accum(o: TrainOptions, resume: ckpt.Checkpoint | None) -> int:
    """The option's gradient accumulation, else the resumed run's, else 1; bounded."""
    accum = o.grad_accum or (resume.extra.get("gradAccum", 1) if resume else 1)
    if isinstance(accum, bool) or not isinstance(accum, int) or not 1 <= accum <= MAX_GRAD_ACCUM:
        raise UsageError(f"{{opt:grad_accum}} must be 1 to {MAX_GRAD_ACCUM}, got {accum!r}")
    return accum


def run_precision(o: TrainOptions, resume: ckpt.Checkpoint | None) -> Precision:
    """The option's precision, else the resumed run's, else fp32."""
    name = o.precision or (resume.extra.get("precision", "fp32") if resume else "fp32")
    if name not in PRECISIONS:
        raise ckpt.CheckpointError(f"{{opt:resume}} {o.resume} records the precision {name!r}, which this tinygpt "
                                   f"does not know; give {{opt:precision}} {' or '.join(PRECISIONS)}")
    return PRECISIONS[name]


def run_loss_scale(o: TrainOptions, precision: Precision) -> float:
    """The first loss scale: the option's (only where the precision has a scaler), else the default."""
    if o.loss_scale is not None and not precision.loss_scaling:
        raise UsageError(f"{{opt:loss_scale}} sets the loss scaler of {{opt:precision}} f16; this run trains in "
                         f"{precision.name}, which has none")
    return o.loss_scale if o.loss_scale is not None else LOSS_SCALE


TRAIN_WINDOW = 1024      # a saved model's training windows unless the run says: a long context is the model's


def run_window(o: TrainOptions, cfg, resume: ckpt.Checkpoint | None) -> int:
    """The tokens of the run's training windows: a new model's context; on a saved model, the ctx
    option (at most the model's context), else the resumed run's own windows, else its context up
    to TRAIN_WINDOW. The file keeps the model's context whatever the windows."""
    if resume is None:
        return cfg.ctx
    if o.ctx is not None:
        if not 2 <= o.ctx <= cfg.ctx:
            raise TrainingStopped(f"{{opt:resume}} {o.resume}: {{opt:ctx}} {o.ctx} is this run's windows, 2 to the "
                                  f"model's context ({cfg.ctx:,})", 2)
        return o.ctx
    held = resume.extra.get("trainWindow")
    if isinstance(held, int) and not isinstance(held, bool) and 2 <= held <= cfg.ctx:
        return held
    return min(cfg.ctx, TRAIN_WINDOW)


def run_spec(o: TrainOptions, cfg, accum: int, precision: Precision, lora, optimizer, window: int) -> RunSpec:
    """The run these options ask for, resolved once: what the memory budget, the model and
    `tinygpt plan` take as it is (window: its windows' tokens, run_window). A chat file's windows
    are packed, several records to a window (a preference file's pairs are not: DPO's)."""
    dpo = run_dpo(o, cfg)
    return RunSpec(cfg, o.attention, T=window, accum=accum, precision=precision,
                   loss_scale=run_loss_scale(o, precision), recompute=o.recompute, lora=lora, optimizer=optimizer,
                   dpo=dpo, packed=is_chat_file(o.data) and dpo is None)


def run_dpo(o: TrainOptions, cfg) -> float | None:
    """DPO's beta where the data is a preference file (each batch its pairs' two windows), else None."""
    if not is_preference_file(o.data):
        if o.dpo_beta is not None or o.reference is not None:
            which = "dpo_beta" if o.dpo_beta is not None else "reference"
            raise UsageError(f"{{opt:{which}}} is for a preference file's run (DPO: records of prompt, chosen and "
                             "rejected); give {opt:data} one, or drop it")
        return None
    if cfg.batch % 2:
        raise UsageError(f"{{opt:batch}} {cfg.batch}: a batch of preference pairs holds each pair's chosen and "
                         "rejected completions; give an even batch")
    return o.dpo_beta if o.dpo_beta is not None else DPO_BETA


def count(extra: dict, key: str, most: int, label: str, default: int = 0) -> int:
    v = extra.get(key, default)
    if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v <= most:
        raise ckpt.CheckpointError(f"{label}: its {key} {ckpt.show(v)} is not a count from 0 to {most}")
    return v


def run_optimizer(o: TrainOptions, resume: ckpt.Checkpoint | None, label: str, lora: bool = False):
    """(the run's optimizer settings, the resumed file's or None): the option's optimizer, else for
    a LoRA run optimizers.LORA, else the file's (optimizers.UNRECORDED where it records none), else
    optimizers.DEFAULT (every optimizer's state fits the file's moment slots: optim_state); the
    file's settings carry over where the optimizer stays and no option changes them."""
    held = (optim_state.file_settings(resume, label) or optimizers.make_settings(optimizers.UNRECORDED)) \
        if resume else None
    name = o.optimizer or (optimizers.LORA if lora else held.name if held else optimizers.DEFAULT)
    kind = optimizers.kind(name)
    same = held is not None and held.kind is kind
    given = lambda key: getattr(o, key, None)
    pick = lambda key: given(key) if given(key) is not None else getattr(held, key) if same else None
    return kind.settings(pick("weight_decay"), **{k: given(k) for k in optimizers.FLAGS if k not in kind.hypers},
                         **{k: pick(k) for k in kind.hypers}), held


@dataclass(frozen=True)
class RunSettings:
    """How a run evaluates, logs, saves and ends (options.RUN_SETTINGS), each resolved once: the
    option's, else the resumed run's (as its file kept them), else the default."""
    eval_every: int
    eval_windows: int
    log_every: int
    save_every: int
    sample_tokens: int
    sample_prompt: str
    keep_best: bool

    def record(self) -> dict:
        """What the checkpoint keeps (tinygptPy.settings), for a resumed run to take again."""
        return dataclasses.asdict(self)


assert [f.name for f in dataclasses.fields(RunSettings)] == list(RUN_SETTINGS)


def run_settings(o: TrainOptions, resume: ckpt.Checkpoint | None, label: str) -> RunSettings:
    """The run's settings (options.RUN_SETTINGS): each the option's, else the resumed run's, else
    the default."""
    saved = resume.extra.get("settings", {}) if resume else {}
    if not isinstance(saved, dict):
        raise ckpt.CheckpointError(f"{label}: its settings {ckpt.show(saved)} are not a table")
    values = {}
    for key, default in RUN_SETTINGS.items():
        v = getattr(o, key)
        if v is None and key in saved:
            v = saved[key]
            ok = isinstance(v, bool) if isinstance(default, bool) else \
                isinstance(v, str) and len(v) <= 10_000 if isinstance(default, str) else \
                isinstance(v, int) and not isinstance(v, bool) and (1 if key in POSITIVE else 0) <= v <= 1 << 31
            if not ok:
                raise ckpt.CheckpointError(f"{label}: its setting {key} {ckpt.show(v)} is not one {{opt:{key}}} takes; "
                                           f"give {{opt:{key}}} to replace it")
        values[key] = default if v is None else v
    return RunSettings(**values)


@dataclass(frozen=True)
class Length:
    """How long a run goes: to step `total`, or for `minutes` (total None: the deadline fits the
    steps); `held`, the step a resumed run's decay stays at (its planned end, unless rewarmed);
    `extension`, the banner's line for the steps past it."""
    total: int | None
    minutes: float | None
    held: int | None
    extension: str | None


def run_length(o: TrainOptions, schedule: Schedule, start: int, resumed: bool) -> Length:
    """The run's last step (the steps option, else the resumed run's planned end, else the preset's
    default; None with minutes), and how its resumed schedule continues, checked before anything
    is allocated."""
    if o.rewarm and not (resumed and start > 0):
        raise UsageError("{opt:rewarm} restarts a resumed run's schedule at its step; a new run warms up anyway: "
                         "drop {opt:rewarm}")
    if o.minutes is not None and o.steps is not None:
        raise UsageError("give {opt:steps} or {opt:minutes}, not both")
    if o.minutes is not None:
        total = None
    elif o.steps is not None:
        total = o.steps
    elif resumed:
        total = schedule.total
        if total <= start:
            raise UsageError(f"the checkpoint is at step {start}, the end of its run; give the new total with "
                             "{opt:steps}, or a time with {opt:minutes}")
    else:
        total = TRAIN_DEFAULTS[o.preset].steps
    if total is not None and total <= start:
        raise UsageError(f"the checkpoint is already at step {start}; ask for more {{opt:steps}} than that")
    held = schedule.resume_at(start, o.rewarm) if resumed and start > 0 else None
    extension = schedule.extension(start, total, held)
    if extension and start >= held and (o.lr is not None or o.warmup is not None):
        raise UsageError(f"{{opt:lr}} and {{opt:warmup}} shape a schedule this run is past (it planned its end at "
                         f"step {held:,}; the steps after run at its final lr, {{opt:min_lr}}): add "
                         "{opt:rewarm} to start a new warm-up and decay at this step")
    return Length(total, o.minutes, held, extension)


@dataclass
class Recipe:
    """A training run as its options and the resumed file ask for it, every piece resolved once
    and checked before anything is allocated: what `tinygpt train` (start.setup) builds and runs,
    the Python API's Trainer too, and what `tinygpt plan` budgets."""
    cfg: Config
    tokenizer: str                          # its name (tokenizers.NAMES)
    schedule: Schedule
    lora: lora_files.LoraState | None       # a LoRA run's adapters and their state (None: every weight trains)
    new_lora: bool                          # adapters started on the resumed model, a new run on its shape
    accum: int
    precision: Precision
    optimizer: optimizers.Settings
    held_optimizer: optimizers.Settings | None   # the resumed file's
    settings: RunSettings
    length: Length | None                   # None: a profile's or a plan's, which run no schedule
    spec: RunSpec                           # what the memory budget and the model take as it is


def make_recipe(o: TrainOptions, resume: ckpt.Checkpoint | None, label: str, steps: bool = True,
                planning: bool = False) -> Recipe:
    """The recipe of the run the options ask for, on the resumed file (or None). steps: the run
    takes its schedule's steps (a profile and a plan take none); planning: `tinygpt plan`, which
    may also ask what adapters would take without a base to put them on."""
    settings = run_settings(o, resume, label)
    if planning and resume is None and o.lora is not None:
        lora, new_lora = None, False
        adapters = make_lora(o.lora, o.lora_alpha, o.lora_targets, o.lora_biases)
    else:
        lora, new_lora = run_lora(o, resume, label)
        adapters = lora.lora if lora else None
    cfg, tokenizer, schedule = run_config(o, resume, new_lora)
    cfg.lr = schedule.lr              # the header's learningRate: the peak
    if resume is None:                # a resumed model's own: its tokenizer may be one it carries (vocab per model)
        cfg.vocab = tokenizers.kind(tokenizer).vocab
    cfg.validate()
    attention_path(o.attention).check(cfg.ctx, cfg.block.heads.q_width, cfg.heads)
    length = None if not steps else \
        run_length(o, schedule, 0 if new_lora or not resume else resume.step, resume is not None)
    accum, precision = run_accum(o, resume), run_precision(o, resume)
    optimizer, held = run_optimizer(o, resume, label, adapters is not None)
    if lora and not optimizer.kind.upstream_moments:
        raise UsageError(f"{{opt:optimizer}} {optimizer.name}: a LoRA run trains its adapters with {optimizers.LORA} "
                         "(their moments are what its file and PEFT's export carry); drop {opt:optimizer}")
    spec = run_spec(o, cfg, accum, precision, adapters, optimizer, run_window(o, cfg, resume))
    return Recipe(cfg, tokenizer, schedule, lora, new_lora, accum, precision, optimizer, held, settings, length, spec)


def run_budget(o: TrainOptions, kernels: dict):
    """`tinygpt plan`: the memory budget of the training run these options ask for, before anything
    is allocated (the resumed file's shape, precision and accumulation, or the preset's), resolved
    by train's own recipe -> (gpu, kernel plan, budget, (batch, grad_accum) that fits the same batch
    where this does not, or (None, None))."""
    resume = ckpt.load(o.resume, f"{{opt:resume}} {o.resume}", moments=False) if o.resume else None   # sizes only
    recipe = make_recipe(o, resume, f"{{opt:resume}} {o.resume}", steps=False, planning=True)
    spec, sample_tokens, cfg = recipe.spec, recipe.settings.sample_tokens, recipe.cfg
    gpu = GPU()
    plan = make_plan(gpu, kernels)
    p = memory_budget(spec, plan, device_limits(gpu), sample_tokens)
    fitting = (None, None)
    if not p.fits:
        b = largest_fitting_batch(spec, plan, p.limits, sample_tokens)
        fitting = (b, cfg.batch * recipe.accum // b) if b else (None, None)
    return gpu, plan, p, fitting


@dataclass
class TrainOutputs:
    checkpoint: Path
    plot: Path
    log: Path | None
    best: Path | None = None            # the keep-best option's checkpoint
    tensorboard: Path | None = None     # the directory of TensorBoard's event files


def output_paths(o: TrainOptions) -> TrainOutputs:
    """Claims the checkpoint, its loss-curve plot, the best checkpoint and the logs before anything
    is read or run. The checkpoint may be the resumed file (written back); nothing else may be an
    input. The best checkpoint is claimed where keep-best is given, or may be the resumed run's."""
    given = o.out or o.resume or f"runs/{o.preset}.tinygpt"
    out = Path(given)
    outs = Outputs(o.force, {"data": data_files(o.data), "val_data": data_files(o.val_data),
                             "tokenizer_file": o.tokenizer_file, "resume": o.resume, "config": o.config})
    keep_best = o.keep_best or (o.keep_best is None and o.resume)
    return TrainOutputs(outs.claim(given, "out", "checkpoint", ckpt.is_tinygpt, updates="resume"),
                        outs.claim(derived(out, ".loss.png"), "out", "loss-curve plot", is_our_png),
                        outs.claim(o.log, "log", "log", is_json_lines, append=True) if o.log else None,
                        outs.claim(best_path(out), "out", "best checkpoint", ckpt.is_tinygpt) if keep_best else None,
                        claim_directory(o.tensorboard, o.data, outs.claimed) if o.tensorboard else None)


def best_path(out: Path) -> Path:
    """Where keep-best keeps the best checkpoint: beside the run's, as OUT.best.tinygpt."""
    return derived(out, ".best.tinygpt")
