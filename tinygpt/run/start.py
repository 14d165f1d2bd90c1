"""A run's start: the model, the data and their state that a train command's recipe asks for,
built once and restored from the resumed file (setup is what `tinygpt train` and the
Python API's train both call), and the steps it plans. The pieces are decided in recipe.py; the
steps are run in train.py.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np

from ..files import checkpoint as ckpt
from ..files import lora_files
from ..files import optim_state
from ..core.config import Config, param_shapes
from ..core.errors import UsageError
from ..core.init import init_params
from ..core.lora import merged
from ..files.data import Dataset
from ..device.gpu import GPU
from ..device.kernels import SCALE_GROWTH
from ..device.planner import make_plan
from .infer import data_path_for, stop_ids
from ..model import optimizers
from ..model.budget import device_limits, memory_budget, refusal
from ..model.gpt import Model
from ..model.twincheck import verify
from .options import TrainOptions
from ..files.outputs import same_file
from .recipe import Length, Recipe, RunSettings, count, make_recipe
from .schedule import Schedule
from ..files.tokenfile import open_dataset
from ..files.chat_data import ChatData, PreferenceData, chat_dataset, is_chat_file, preference_dataset
from ..model.spec import rows_for
from .preference import set_reference
from ..tokenizers.chat import template_of
from .. import tokenizers
from ..tokenizers import get_tokenizer


@dataclass
class Run:
    cfg: Config
    model: Model
    data: Dataset
    tokenizer: object
    rng: np.random.Generator
    history: list
    extra: dict
    schedule: Schedule
    header: dict = field(default_factory=dict)    # the resumed file's header: upstream's fields kept
    lora: lora_files.LoraState | None = None      # a LoRA run: its settings, base identity and step
    frozen: tuple | None = None                   # (m, v) of its base as the file held them, written back as read
    optimizer: optimizers.Settings = field(default_factory=lambda: optimizers.make_settings(optimizers.UNRECORDED))
    notes: list = field(default_factory=list)     # what the banner says of the resume (a fresh optimizer state)
    settings: RunSettings | None = None           # how it evaluates, logs, saves and ends
    length: Length | None = None                  # how long it goes (None: a profile's few steps)
    data_path: str | None = None                  # the data option (a file's own is never opened)

    def checkpoint(self, params: dict, state: dict, steps: int, step: int, extra: dict) -> ckpt.Checkpoint:
        """The file of this run: its weights and its optimizer's state (optim_state: in the moment
        slots of upstream's layout, whatever the optimizer) after `steps` updates; a LoRA
        run's base in the state (its frozen moments as read), its adapters and their moments in
        tinygptPy.lora."""
        fields, m, v = optim_state.written(self.optimizer, state, steps)
        extra = dict(extra, **fields)
        if self.lora is None:       # (a LoRA run's optimizer keeps upstream's moments: setup refuses others)
            return ckpt.Checkpoint(self.cfg, params, m, v, step, self.history, extra, self.header)
        names = [n for n, _, _ in param_shapes(self.cfg)]
        fm, fv = self.frozen
        keep = lambda d, frozen, n: d[n] if n in d else frozen[n] if frozen is not None else np.zeros_like(params[n])
        adapters = [n for n in params if n not in set(names)]
        st = lora_files.LoraState(self.lora.lora, {n: params[n] for n in adapters}, {n: m[n] for n in adapters},
                                  {n: v[n] for n in adapters}, self.lora.base, self.lora.base_step)
        extra = dict(extra, lora=lora_files.record(st))
        return ckpt.Checkpoint(self.cfg, {n: params[n] for n in names}, {n: keep(m, fm, n) for n in names},
                               {n: keep(v, fv, n) for n in names}, step, self.history, extra, self.header)

    def model_params(self, params: dict) -> dict:
        """What the model computes with: the weights, a LoRA run's with its adapters folded in."""
        return params if self.lora is None else merged(params, self.cfg, self.lora.lora)


def _restore(model: Model, rng: np.random.Generator, resume: ckpt.Checkpoint, label: str, scale_given: bool,
             held: optimizers.Settings, notes: list):
    """The resumed file's weights, optimizer state, step, loss scaler and data-sampling state into
    the model and rng. Another optimizer than the file's starts its state fresh, and says so."""
    model.set_params(resume.params)
    model.step_count = resume.step
    opt = model.optimizer.s
    if held.name == opt.name:
        state, steps, start = optim_state.read(resume, opt, model.layout.trainable, label)
    else:
        state, steps, start = None, 0, resume.step
        notes.append(optim_state.fresh_note(held.name, opt, resume.step))
    model.set_opt_state(state or {}, steps)
    model.moments_from = start
    if model.spec.scaled:
        scale = resume.extra.get("lossScale")
        if scale is not None and not scale_given:
            if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not 2.0 ** -126 <= scale <= 2.0 ** 127:
                raise ckpt.CheckpointError(f"{label}: its lossScale {ckpt.show(scale)} is not a positive float32")
            model.set_gate(scale=float(scale), clean=count(resume.extra, "lossScaleClean", SCALE_GROWTH, label))
        model.set_gate(skipped=count(resume.extra, "skippedSteps", resume.step, label))
    if "dataRngState" in resume.extra:
        try:
            rng.bit_generator.state = resume.extra["dataRngState"]
        except (TypeError, ValueError, KeyError) as e:
            raise ckpt.CheckpointError(f"{label}: its data-sampling state is malformed") from e


def setup(o: TrainOptions, gpu: GPU | None = None, held: ckpt.Checkpoint | None = None,
          label: str | None = None, steps: bool = True) -> tuple[Run, int]:
    """Config, data, model and state for `tinygpt train`, each piece resolved once (recipe.py);
    returns the run and its start step. held: the checkpoint to continue, already in memory (the
    Python API's model; its arrays are not changed), instead of the resume option's file; label
    names it in errors. steps: the run takes its schedule's steps (a profile takes a few of its own)."""
    label = label or f"{{opt:resume}} {o.resume}"
    resume = ckpt.load(o.resume, label) if o.resume and held is None else held
    if held is not None:            # _start folds a LoRA run's adapters into the file's dicts
        resume = dataclasses.replace(held, params=dict(held.params), m=held.m and dict(held.m),
                                     v=held.v and dict(held.v))
    if resume:
        lora_files.finite_weights(resume, label)      # before a step: NaN weights only ever train to NaN
    r = make_recipe(o, resume, label, steps)
    if r.new_lora and held is None and (not o.out or same_file(o.out, o.resume)):
        raise UsageError(f"{{opt:lora}} starts adapters on {o.resume}, which stays as it is: give the fine-tune's "
                         "own file with {opt:out}")
    # a resumed model's own (an imported model's tokenizer.json travels in its file), else the recipe's
    tok = tokenizers.of_record(resume.extra, resume.cfg.vocab, o.tokenizer_file) if resume else \
        get_tokenizer(r.tokenizer, o.tokenizer_file)
    assert tok.vocab == r.cfg.vocab, (tok.name, tok.vocab, r.cfg.vocab)      # the kind's, as plan budgets it
    data_path = data_path_for(o.data, resume, label)
    data = _open_data(o, r, tok, data_path, resume)
    if isinstance(data, (ChatData, PreferenceData)) and o.ctx is None:     # windows of the records at hand
        data.T = rows_for(r.spec.T, data.longest(), CHAT_LEAST)
        r = dataclasses.replace(r, spec=r.spec.with_(T=data.T))
    assert r.spec.packed == isinstance(data, ChatData), (r.spec.packed, type(data))   # recipe.run_spec's decision
    gpu = gpu or GPU()
    plan = make_plan(gpu, o.kernels)
    mem = memory_budget(r.spec, plan, device_limits(gpu), r.settings.sample_tokens)
    if not mem.fits:                              # before anything is allocated: the budget's message
        raise UsageError(refusal(mem, plan))
    verify(gpu, plan, r.spec)                     # every kernel the plan picked, against the reference
    model = Model(gpu, plan, r.spec)
    extra = _extra(o, r, tok, data_path, resume)
    rng = np.random.default_rng([r.cfg.seed, 1])  # data sampling; init draws from default_rng(seed)
    notes = []
    frozen, start, history = _start(model, rng, resume, r.lora, r.new_lora, label, o.loss_scale is not None,
                                    r.held_optimizer, notes)
    if isinstance(data, PreferenceData):          # the reference's log-probabilities, once, kept in the file
        notes.append(f"dpo: beta {r.spec.dpo:g}, the reference: "
                     f"{set_reference(model, data, o.reference, resume, r.new_lora, label)}")
        extra["dpoReference"] = data.reference_record()
    header = resume.header if resume else {}
    if r.new_lora:      # the base run's own results are not the fine-tune's
        header = {k: v for k, v in header.items() if k not in ("bestVal", "sample", "finalLoss")}
    return Run(r.cfg, model, data, tok, rng, history, extra, r.schedule, header, r.lora, frozen, r.optimizer, notes,
               r.settings, r.length, data_path), start


CHAT_LEAST = 16             # a chat run's shortest window: its records' longest, rounded up to a power of two
CHAT_FIELDS = ("chatTemplate", "stopTokens", "tokenizerBos")     # what chat needs of a file (files.hf, gguf_read)


def _open_data(o: TrainOptions, r: Recipe, tok, data_path, resume):
    """The run's data: a chat or preference file rendered with the model's template and stop tokens
    (ChatML's for a new model), else a text's (or token file's) windows."""
    if is_chat_file(data_path):
        extra = resume.extra if resume else {}
        make = preference_dataset if r.spec.dpo is not None else chat_dataset
        return make(data_path, template_of(extra, tok), tok, stop_ids(extra, tok, r.cfg.vocab), r.spec.T,
                    bool(o.truncate), o.val_data)
    if o.val_data or o.truncate:
        which = "val_data" if o.val_data else "truncate"
        raise UsageError(f"{{opt:{which}}} is for a chat file's records; give {{opt:data}} a chat file (.jsonl), "
                         "or leave it out (a text's windows are cut from it, its last 10 % validates)")
    return open_dataset(data_path, tok, r.spec.T)   # the run's windows (a saved model's may be shorter than its ctx)


def _extra(o: TrainOptions, r: Recipe, tok, data_path, resume) -> dict:
    """What the checkpoint records of the run beyond upstream's fields. It stays float32 whatever
    the precision: a bf16 run resumes in fp32 and back."""
    extra = {**tok.record(), "data": data_path, "attention": o.attention, "gradAccum": r.accum,
             "precision": r.precision.name, "recompute": o.recompute, "evalEvery": r.settings.eval_every,
             "settings": r.settings.record()}
    if r.spec.T < r.cfg.ctx:
        extra["trainWindow"] = r.spec.T             # a resumed run trains the same windows
    for key in CHAT_FIELDS:                         # an imported model's chat template and end-of-turn ids
        if resume and key in resume.extra:
            extra[key] = resume.extra[key]
    if resume and isinstance(resume.extra.get("tensorboardRun"), str):
        extra["tensorboardRun"] = resume.extra["tensorboardRun"]      # its folder of event files (runlog)
    if resume and isinstance(resume.header.get("corpus"), str) and \
            ("data" not in resume.extra or resume.extra.get("corpusKept")):
        extra["corpusKept"] = True    # another writer's corpus (upstream's: the training text) stays
    return extra


def _start(model: Model, rng, resume, lora, new_lora: bool, label: str, scale_given: bool, held, notes: list):
    """The model's weights and state at the first step -> (the base's moments a LoRA run writes back
    as the file held them, or None; the start step; the loss history)."""
    frozen = None
    if lora:
        frozen = (resume.m, resume.v)
        if resume.m is not None:
            resume.m = {**resume.m, **lora.m}
            resume.v = {**resume.v, **lora.v}
        resume.params = {**resume.params, **lora.params}
    if new_lora:        # a new run on the base: step 0, fresh moments and data sampling, its own history
        model.set_params(resume.params)
        return frozen, 0, []
    if resume:
        _restore(model, rng, resume, label, scale_given, held, notes)
        return frozen, resume.step, list(resume.loss_history)
    model.set_params(init_params(model.cfg))
    return frozen, 0, []
