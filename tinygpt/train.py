"""`tinygpt train`: what the CLI calls with an options object.

The loop keeps everything on the device; it reads the loss back only on steps it logs,
evaluates, or saves. Every output is claimed before the first step (outputs.Outputs). What keeps
the files whole (signals, the health check before a save, the rescue of a failed final save) is
safety.py's.
"""
from __future__ import annotations

import dataclasses
import json
import shlex
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from . import lora_files
from . import checkpoint as ckpt
from . import optim_state
from .core.config import TRAIN_DEFAULTS, Config, n_params, param_specs
from .core.errors import UsageError, word
from .core.init import init_params
from .core.lora import merged, trainable_specs
from .core.precision import Precision
from .data import Dataset
from .tokenizers import get_tokenizer
from .device.gpu import GPU
from .device.kernels import SCALE_GROWTH
from .device.planner import make_plan
from .device.tune import cached_peaks
from .infer import FINAL_EVAL_WINDOWS, Sampler, bits, data_path_for
from .model import optimizers
from .model.attention import path as attention_path
from .model.budget import device_limits, memory_budget, refusal
from .model.gpt import Model
from .model.profile import format_profile, over_peak, profile_step, with_peaks
from .options import RUN_SETTINGS, TrainOptions
from .outputs import Outputs, derived, is_json_lines, is_our_png, same_file, save_png
from .runlog import RunLog, claim_directory, run_folder
from .safety import Interrupted, Saver, SideWriter, StopFlag, TrainingStopped, unhealthy
from .schedule import Deadline, Schedule
from .tokenfile import data_files, open_dataset
from .model.twincheck import blame, verify
from .recipe import count, run_accum, run_config, run_lora, run_optimizer, \
    run_precision, run_settings, run_spec


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
    o: TrainOptions | None = None                 # the options, each run setting given (run_settings)

    def checkpoint(self, params: dict, state: dict, steps: int, step: int, extra: dict) -> ckpt.Checkpoint:
        """The file of this run: its weights and its optimizer's state (optim_state: in the moment
        slots of upstream's layout, whatever the optimizer) after `steps` updates; a LoRA
        run's base in the state (its frozen moments as read), its adapters and their moments in
        tinygptPy.lora."""
        opt = self.optimizer
        extra = dict(extra, optimizer=optim_state.record(opt, steps))
        m, v = optim_state.slots(opt, state)
        if not opt.kind.upstream_moments:       # (a LoRA run's optimizer has them: setup refuses others)
            return ckpt.Checkpoint(self.cfg, params, m, v, step, self.history, extra, self.header)
        extra["adamSteps"] = int(steps)
        if self.lora is None:
            return ckpt.Checkpoint(self.cfg, params, m, v, step, self.history, extra, self.header)
        names = [n for n, _, _ in param_specs(self.cfg)]
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
    outs = Outputs(o.force, {"data": data_files(o.data), "tokenizer_file": o.tokenizer_file, "resume": o.resume,
                             "config": o.config})
    keep_best = o.keep_best or (o.keep_best is None and o.resume)
    return TrainOutputs(outs.claim(given, "out", "checkpoint", ckpt.is_tinygpt, updates="resume"),
                        outs.claim(derived(out, ".loss.png"), "out", "loss-curve plot", is_our_png),
                        outs.claim(o.log, "log", "log", is_json_lines, append=True) if o.log else None,
                        outs.claim(best_path(out), "out", "best checkpoint", ckpt.is_tinygpt) if keep_best else None,
                        claim_directory(o.tensorboard, o.data) if o.tensorboard else None)


def best_path(out: Path) -> Path:
    """Where keep-best keeps the best checkpoint: beside the run's, as OUT.best.tinygpt."""
    return derived(out, ".best.tinygpt")


def _restore(model: Model, rng: np.random.Generator, resume: ckpt.Checkpoint, label: str, scale_given: bool,
             held: optimizers.Settings, notes: list):
    """The resumed file's weights, optimizer state, step, loss scaler and data-sampling state into
    the model and rng. Another optimizer than the file's starts its state fresh, and says so."""
    model.set_params(resume.params)
    model.step_count = resume.step
    opt = model.optimizer.s
    if held.name == opt.name:
        state, steps, start = optim_state.read(resume, opt, model.specs, label)
    else:
        state, steps, start = None, 0, resume.step
        notes.append(optim_state.fresh_note(held.name, opt, resume.step))
    model.set_opt_state(state or {}, steps)
    model.moments_from = start
    if model.scaled:
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
          label: str | None = None) -> tuple[Run, int]:
    """Config, data, model and state for `tinygpt train`; returns the run and its start step.
    held: the checkpoint to continue, already in memory (the Python API's model; its arrays are
    not changed), instead of the resume option's file; label names it in errors."""
    label = label or f"{{opt:resume}} {o.resume}"
    resume = ckpt.load(o.resume, label) if o.resume and held is None else held
    if held is not None:            # _start folds a LoRA run's adapters into the file's dicts
        resume = dataclasses.replace(held, params=dict(held.params), m=held.m and dict(held.m),
                                     v=held.v and dict(held.v))
    if resume:
        lora_files.finite_weights(resume, label)      # before a step: NaN weights only ever train to NaN
    o = run_settings(o, resume, label)
    lora, new_lora = run_lora(o, resume, label)
    if new_lora and held is None and (not o.out or same_file(o.out, o.resume)):
        raise UsageError(f"{{opt:lora}} starts adapters on {o.resume}, which stays as it is: give the fine-tune's "
                         "own file with {opt:out}")
    cfg, tokenizer_name, schedule = run_config(o, resume, new_lora)
    cfg.lr = schedule.lr              # the header's learningRate: the peak
    tok = get_tokenizer(tokenizer_name, o.tokenizer_file)
    cfg.vocab = tok.vocab
    cfg.validate()
    attention_path(o.attention).check(cfg.ctx, cfg.d_model, cfg.heads)
    data_path = data_path_for(o.data, resume, label)
    data = open_dataset(data_path, tok, cfg.ctx)
    accum = run_accum(o, resume)
    precision = run_precision(o, resume)
    optimizer, held = run_optimizer(o, resume, label, lora is not None)
    if lora and not optimizer.kind.upstream_moments:
        raise UsageError(f"{{opt:optimizer}} {optimizer.name}: a LoRA run trains its adapters with {optimizers.LORA} "
                         "(their moments are what its file and PEFT's export carry); drop {opt:optimizer}")
    gpu = gpu or GPU()
    plan = make_plan(gpu, o.kernels)
    spec = run_spec(o, cfg, accum, precision, lora.lora if lora else None, optimizer)
    mem = memory_budget(spec, plan, device_limits(gpu), o.sample_tokens)
    if not mem.fits:                              # before anything is allocated: the budget's message
        raise UsageError(refusal(mem, plan))
    verify(gpu, plan, spec)                       # every kernel the plan picked, against the reference
    model = Model(gpu, plan, spec)
    extra = _extra(o, tok, data_path, accum, precision, resume)
    rng = np.random.default_rng([cfg.seed, 1])  # data sampling; init draws from default_rng(seed)
    notes = []
    frozen, start, history = _start(model, rng, resume, lora, new_lora, label, o.loss_scale is not None, held, notes)
    header = resume.header if resume else {}
    if new_lora:        # the base run's own results are not the fine-tune's
        header = {k: v for k, v in header.items() if k not in ("bestVal", "sample", "finalLoss")}
    return Run(cfg, model, data, tok, rng, history, extra, schedule, header, lora, frozen, optimizer, notes, o), start


def _extra(o: TrainOptions, tok, data_path, accum: int, precision: Precision, resume) -> dict:
    """What the checkpoint records of the run beyond upstream's fields. It stays float32 whatever
    the precision: a bf16 run resumes in fp32 and back."""
    extra = {"tokenizer": tok.name, "data": data_path, "attention": o.attention, "gradAccum": accum,
             "precision": precision.name, "recompute": o.recompute, "evalEvery": o.eval_every,
             "settings": {k: getattr(o, k) for k in RUN_SETTINGS}}
    if tok.source:
        extra["tokenizerSource"] = tok.source
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


def planned_total(o: TrainOptions, run: Run, start: int) -> int | None:
    """The last step: the steps option, else the resumed run's planned end, else the preset's default;
    None with minutes (the deadline sets it)."""
    if o.rewarm and not (o.resume and start > 0):
        raise UsageError("{opt:rewarm} restarts a resumed run's schedule at its step; a new run warms up anyway: "
                         "drop {opt:rewarm}")
    if o.minutes is not None:
        if o.steps is not None:
            raise UsageError("give {opt:steps} or {opt:minutes}, not both")
        return None
    if o.steps is not None:
        total = o.steps
    elif o.resume:
        total = run.schedule.total
        if total <= start:
            raise UsageError(f"the checkpoint is at step {start}, the end of its run; give the new total with "
                             "{opt:steps}, or a time with {opt:minutes}")
    else:
        total = TRAIN_DEFAULTS[o.preset].steps
    if total <= start:
        raise UsageError(f"the checkpoint is already at step {start}; ask for more {{opt:steps}} than that")
    return total


def hold_schedule(o: TrainOptions, run: Run, start: int, total: int | None) -> tuple[int | None, str | None]:
    """(the step a resumed run's decay stays at, the banner's line for steps past it): a resumed
    run keeps its schedule's past, its decay held at the planned end unless rewarmed."""
    sched = run.schedule
    held = sched.resume_at(start, o.rewarm) if o.resume and start > 0 else None
    extension = sched.extension(start, total, held)
    if extension and start >= held and (o.lr is not None or o.warmup is not None):
        raise UsageError(f"{{opt:lr}} and {{opt:warmup}} shape a schedule this run is past (it planned its end at "
                         f"step {held:,}; the steps after run at its final lr, {{opt:min_lr}}): add "
                         "{opt:rewarm} to start a new warm-up and decay at this step")
    return held, extension


UNPLANNED = 10 ** 9
def clock_text(seconds: float) -> str:
    s = max(0, int(round(seconds)))
    return f"{s // 60} min {s % 60:02d} s" if s >= 60 else f"{s} s"


class Loop:
    """One `tinygpt train` from its first step to its report: the steps, the logged and evaluated
    ones, the periodic saves, then the final save, evaluation and samples."""

    def __init__(self, o: TrainOptions, run: Run, start: int, outs: TrainOutputs, err, clock, t0: float):
        self.o, self.run, self.start, self.outs, self.err, self.clock = o, run, start, outs, err, clock
        model, sched = run.model, run.schedule
        total = planned_total(o, run, start)
        self.deadline = Deadline(60 * o.minutes, clock, t0) if total is None else None
        self.held, self.extension = hold_schedule(o, run, start, total)
        self._end_at(total if total is not None else start + UNPLANNED)     # until the deadline's first estimate
        self.side = SideWriter(err)
        self.tb_run = None
        if outs.tensorboard:      # a folder per run; a resumed run's own again
            self.tb_run = run_folder(outs.tensorboard, run.extra.get("tensorboardRun"), outs.checkpoint.stem)
            run.extra["tensorboardRun"] = self.tb_run.name
        self.log = RunLog(self.side, outs.log, self.tb_run, resumed_from=start or None)
        # keep-best: the lowest validation loss of the run so far, the resumed run's past included
        vals = [h["val"] for h in run.history if isinstance(h.get("val"), (int, float))]
        self.best_val = min(vals) if vals and outs.best and outs.best.exists() else None
        self.best_step = None
        self.val = run.data.val_windows(o.eval_windows)
        self.final_val = run.data.val_windows(FINAL_EVAL_WINDOWS)
        # the samples at the end: float32 from the key/value cache, whatever the run's precision
        self.sampler = Sampler(model.gpu, model.plan, run.cfg, run.tokenizer, o.attention, 1, o.sample_tokens) \
            if o.sample_tokens else None
        self.stop = StopFlag()
        self.saver = Saver(run, outs.checkpoint, self.stop)
        self.last = {"train": None, "val": None}
        self.tok_s, self.x, self.y, self.lr = 0.0, None, None, sched.lr
        self.png = self.samples = None

    def _end_at(self, end: int):
        """The run's last step; the decay ends there too unless the resumed schedule holds it."""
        self.end = end
        self.run.schedule.end_at(end, self.held)

    def banner(self):
        o, run, err = self.o, self.run, self.err
        cfg, model, data, sched = run.cfg, run.model, run.data, run.schedule
        accum_text = f" x {model.accum} micro-batches" if model.accum > 1 else ""
        print(f"tinygpt: {cfg.layers} layers, d_model {cfg.d_model}, {cfg.heads} heads, ctx {cfg.ctx}, batch "
              f"{model.B}{accum_text}, vocab {cfg.vocab} ({n_params(cfg):,} parameters), attention {o.attention}, "
              f"{model.precision.name} on {model.gpu.name} ({model.gpu.backend}, {model.gpu.engine_label})", file=err)
        print(f"kernels: {model.plan.describe()}", file=err)
        print(f"optimizer: {run.optimizer.describe()}", file=err)
        for note in run.notes:
            print(note, file=err)
        if run.lora:
            lo = run.lora.lora
            n_train = sum(int(np.prod(sh)) for _, sh, _ in trainable_specs(cfg, lo))
            print(f"lora: rank {lo.rank}, alpha {lo.alpha:g} on {','.join(lo.as_dict()['targets'])}"
                  f"{', biases and LayerNorms' if lo.biases else ''}: {n_train:,} trainable parameters, the base's "
                  f"{n_params(cfg):,} frozen", file=err)
        print(f"data: {data.name}: {len(data.tokens):,} tokens ({len(data.train):,} train, {len(data.val):,} val)",
              file=err)
        if self.deadline:
            self.deadline.reserve = end_cost(model, self.sampler, *self.final_val, o, self.clock)
            print(f"schedule: {sched.describe().split(' at step')[0]} at the last step; steps fitted to "
                  f"{o.minutes:g} min", file=err)
        else:
            print(f"schedule: {sched.describe()}", file=err)
        if self.extension:
            print(word(self.extension), file=err)

    def run_all(self):
        """The steps, then the end of the run; Interrupted after a signal, once the model is saved."""
        from tqdm import tqdm
        o = self.o
        self.bar = tqdm(total=None if self.deadline else self.end, initial=self.start, file=self.err, unit="step",
                        dynamic_ncols=True, disable=o.quiet,
                        mininterval=0.1 if getattr(self.err, "isatty", lambda: False)() else 5.0)
        try:
            self._steps()
            self.bar.close()
            self._finish()
        finally:
            self.bar.close()
            self.log.close()
            self.stop.restore()

    def _steps(self):
        o, run, model, sched = self.o, self.run, self.run.model, self.run.schedule
        n_since, step, t_last = 0, self.start, self.clock()
        if self.deadline:
            self.deadline.start(self.start)
        while step < self.end and not self.stop.requested:
            self.lr = sched.at(step)
            self.x, self.y = run.data.sample(run.rng, model.B * model.accum)   # one batch of accum x B windows
            model.step(self.x, self.y, self.lr)
            n_since += 1
            step = done = step + 1
            if self.deadline and (done - self.start < 200 or done % o.log_every == 0):
                fitted = self.deadline.last_step(done)
                if fitted is not None and fitted != self.end:
                    self._end_at(max(fitted, done))
                    self.bar.total = self.end
            is_last = done == self.end
            want_eval = o.eval_every and (done % o.eval_every == 0 or is_last)
            if done % o.log_every == 0 or is_last or want_eval:
                now = self.clock()
                self.tok_s = n_since * model.accum * model.B * model.T / max(now - t_last, 1e-9)
                t_last, n_since = now, 0
                self._record(done, want_eval)
            self.bar.update(1)
            if o.save_every and done % o.save_every == 0 and not is_last:
                self._save_periodic(done)

    def _record(self, done: int, want_eval: bool):
        """A logged step: the loss read back and checked, the history, the log line, the bar."""
        run, model, saver, lr = self.run, self.run.model, self.saver, self.lr
        loss = model.loss()
        norm = model.grad_norm()
        why = unhealthy(loss, norm, saver.best, run.cfg.vocab)
        if why:
            raise TrainingStopped(f"{why} at step {done}; {blame(model, lr, (self.x, self.y))}; "
                                  f"{saver.kept_text()}", 3)
        saver.best = loss if saver.best is None else min(saver.best, loss)
        rec = {"step": done, "train": loss, "lr": lr, "tokens_per_s": round(self.tok_s, 1)}
        scaler = model.gate_state() if model.scaled else None      # read with the loss, when shown
        if want_eval:
            rec["val"] = self.last["val"] = model.mean_loss(*self.val)
        self.last["train"] = loss
        run.history.append({k: rec[k] for k in ("step", "train", "val") if k in rec})
        row = {"step": done, "train_loss": loss, "val_loss": rec.get("val"), "lr": lr, "grad_norm": norm,
               "tokens_per_s": rec["tokens_per_s"]}
        if scaler:
            row.update(loss_scale=scaler["scale"], skipped_steps=int(scaler["skipped"]))
        self.log.row(row)
        if self.outs.best and "val" in rec and (self.best_val is None or rec["val"] < self.best_val):
            self._save_best(done, rec["val"])
        self.bar.set_postfix_str(f"loss {loss:.4f}" + (f" val {rec['val']:.4f}" if "val" in rec else "")
                                 + f" {self.tok_s:,.0f} tok/s"
                                 + (f" scale {scaler['scale']:g} skipped {int(scaler['skipped'])}" if scaler else "")
                                 + (f", {clock_text(self.deadline.left())} left" if self.deadline else ""))

    def progress(self, total: int, what: str, unit: str):
        """A bar for a phase of the end of the run (the whole-split evaluation), as the steps' bar."""
        from tqdm import tqdm
        return tqdm(total=total, desc=what, unit=unit, file=self.err, disable=self.o.quiet, leave=False,
                    dynamic_ncols=True, mininterval=0.1 if getattr(self.err, "isatty", lambda: False)() else 5.0)

    def files(self) -> list[str]:
        """What the run wrote, as the report names it."""
        outs, best = self.outs, self.outs.best
        files = [f"checkpoint {outs.checkpoint}"]
        if best and self.best_step is not None:
            files.append(f"best checkpoint {best} (step {self.best_step:,}, val {self.best_val:.4f})")
        elif best and best.exists():
            files.append(f"best checkpoint {best} (kept from before: this run's validation losses were higher)")
        files += [f"loss curve {self.png}"] if self.png else []
        files += [f"log {outs.log}"] if outs.log else []
        files += [f"TensorBoard logs in {self.tb_run} (run {self.tb_run.name})"] if self.tb_run else []
        return files

    def _save_best(self, done: int, val: float):
        """keep-best: this step's weights, whose validation loss is the run's lowest yet."""
        params = self.saver.checked_params(self.x, self.y, self.lr, done)
        try:
            self.saver.save(params, self.outs.best)
        except OSError as e:      # the run's own checkpoint is what matters: warn, go on
            print(f"\nwarning: could not save the best checkpoint {self.outs.best} at step {done} "
                  f"({e.strerror or e}); training goes on", file=self.err)
            return
        self.best_val, self.best_step = val, done

    def _save_periodic(self, done: int):
        params = self.saver.checked_params(self.x, self.y, self.lr, done)
        try:
            self.saver.save(params)
        except OSError as e:  # keep training: the state is in memory, the last good file on disk
            print(f"\nwarning: could not save {self.outs.checkpoint} at step {done} ({e.strerror or e}); "
                  f"{self.saver.kept_text()}; training goes on and saving is tried again", file=self.err)

    def _finish(self):
        """The final save: after the last step, or after a signal. The handlers stay in place
        until the file is whole, so a signal here is deferred, not fatal."""
        o, run, model, stop, out_path = self.o, self.run, self.run.model, self.stop, self.outs.checkpoint
        if self.end >= self.start + UNPLANNED:      # stopped before the deadline's first estimate
            self._end_at(model.step_count)
        if stop.requested:
            print(f"\n{stop.name}: stopping at step {model.step_count}; saving {out_path}", file=self.err)
        params = self.saver.checked_params(self.x, self.y, self.lr, model.step_count) if self.x is not None \
            else model.get_params()
        try:
            if not stop.requested and o.eval_every:
                # the whole split before the save: the file's last point (finalLoss.val, and bestVal
                # where it is the lowest) holds the loss the run prints and eval computes, not the
                # 64 windows' estimate
                with self.progress(len(self.final_val[0]), "evaluating the validation split", "window") as bar:
                    self.last["val_full"] = model.mean_loss(*self.final_val, progress=bar)
                self.log.row({"step": model.step_count, "final_train_loss": self.last["train"],
                              "final_val_loss": self.last["val_full"], "val_windows": len(self.final_val[0])})
                last = run.history[-1] if run.history else None
                if last is not None and last.get("step") == model.step_count:
                    last["val"] = self.last["val_full"]
        finally:            # saved whatever the evaluation did: the weights were read before it
            self.saver.save_final(params)
        if not stop.requested:
            self.png = self.side.attempt("loss-curve plot", plot_losses, run.history, self.outs.plot)
            if self.sampler:
                self.sampler.set_params(run.model_params(params))
                self.samples = [self.sampler.generate(o.sample_prompt, o.sample_tokens, 0.0)[0],
                                self.sampler.generate(o.sample_prompt, o.sample_tokens, SAMPLE_TEMPERATURE,
                                                      SAMPLE_TOP_K, seed=run.cfg.seed)[0]]
        if stop.requested:   # before the save, or during the plot or sample after it
            data = f" {{opt:data}} {shlex.quote(str(self.o.data))}" if self.o.data else ""   # not read from the file
            for key, value in (("log", self.outs.log), ("tensorboard", self.outs.tensorboard)):
                data += f" {{opt:{key}}} {shlex.quote(str(value))}" if value else ""     # the logs go on too
            print(word(f"saved; continue with: tinygpt train {{opt:resume}} {shlex.quote(str(out_path))}{data}"),
                  file=self.err)
            raise Interrupted("interrupted", stop.exit_code)


def train(o: TrainOptions, gpu: GPU | None = None, out=None, err=None, clock=time.monotonic) -> dict:
    """`tinygpt train`. clock: seconds, monotonic; the deadline and the reported time read it."""
    t0 = clock()
    out, err = out or sys.stdout, err or sys.stderr
    outs = output_paths(o)                       # every output checked before anything is read
    run, start = setup(o, gpu)
    o = run.o
    if not o.keep_best:                 # claimed for a resumed run that turned out not to keep one
        outs.best = None
    loop = Loop(o, run, start, outs, err, clock, t0)
    loop.banner()
    loop.run_all()
    seconds = clock() - t0
    report(out, run, o, loop.last, len(loop.final_val[0]), loop.tok_s, seconds, loop.files(), loop.samples)
    return {"final_train_loss": loop.last["train"], "final_val_loss": loop.last.get("val_full"),
            "val_windows": len(loop.final_val[0]), "tokens_per_s": loop.tok_s, "checkpoint": str(outs.checkpoint),
            "plot": str(loop.png) if loop.png else None,
            "best": str(outs.best) if outs.best and loop.best_step is not None else None,
            "steps": run.model.step_count, "seconds": seconds,
            "samples": loop.samples}


SAMPLE_TEMPERATURE, SAMPLE_TOP_K = 0.8, 40      # the sampled text at the end of a run


def end_cost(model: Model, sampler: Sampler | None, fx, fy, o: TrainOptions, clock) -> float:
    """Seconds the end of a run will take after its last step, measured before the first step:
    one batch of evaluation and one sampled token, times how many the end runs, plus a margin
    for the save and the plot."""
    def timed(fn, *a):               # the second of two calls: the first one warms up
        fn(*a)
        t = clock()
        fn(*a)
        return clock() - t
    cost = timed(model.mean_loss, fx[:model.B], fy[:model.B]) * -(-len(fx) // model.B) if o.eval_every else 0.0
    if sampler:
        probe = min(8, o.sample_tokens)
        cost += 2 * o.sample_tokens / probe * timed(sampler.generate, o.sample_prompt, probe)
    return 1.05 * cost + 0.5


def report(out, run: Run, o: TrainOptions, last: dict, windows: int, tok_s: float, seconds: float,
           files: list, samples):
    """The end of a run: losses (val over the whole split, in bits too for bytes), time, files, samples."""
    val = last.get("val_full")
    if val is None:
        val_text = word("not evaluated ({opt:eval_every} 0)")
    else:
        unit = f" = {bits(val):.3f} bits/byte" if run.tokenizer.token_is_byte else ""
        val_text = f"{val:.4f} nats{unit} (whole validation split, {windows:,} windows)"
    train_text = f"{last['train']:.4f}" if last["train"] is not None else "-"
    print(f"final train loss {train_text}, val loss {val_text}", file=out)
    print(f"{run.model.step_count:,} steps in {clock_text(seconds)}, {tok_s:,.0f} tokens/s; " + ", ".join(files),
          file=out)
    if samples:
        print("greedy sample (temperature 0):\n" + samples[0], file=out)
        print(f"sample (temperature {SAMPLE_TEMPERATURE}, top-k {SAMPLE_TOP_K}, seed {run.cfg.seed}):\n"
              + samples[1], file=out)


def profile(o: TrainOptions, warmup: int = 3, as_json: bool = False) -> str:
    """`tinygpt train` with the profile option: a few steps, then the per-kernel table of one step
    (as_json: JSON Lines, one per kernel, then one for the whole step)."""
    run, _ = setup(o)
    model = run.model
    if "timestamp-query" not in model.gpu.features:
        raise TrainingStopped(f"{model.gpu.name} offers no timestamp queries, so per-kernel GPU time cannot be read", 1)
    for _ in range(warmup):
        model.step(*run.data.sample(run.rng, model.B * model.accum), run.schedule.lr)
    peaks = cached_peaks(model.gpu)
    rows, summary = profile_step(model, *run.data.sample(run.rng, model.B), run.schedule.lr, peaks=peaks)
    if over_peak(rows, summary):        # the cached peaks were read on a busy minute: measure them again
        with_peaks(rows, summary, cached_peaks(model.gpu, again=True))
        summary["peaks_reliable"] = not over_peak(rows, summary)
    if as_json:
        return "\n".join([json.dumps(r) for r in rows] + [json.dumps(dict(summary, kernel="step"))])
    cfg = run.cfg
    head = (f"# one training step: {cfg.layers} layers, d_model {cfg.d_model}, ctx {cfg.ctx}, batch {model.B}, "
            f"attention {o.attention}, on {model.gpu.name} ({model.gpu.backend}); GPU ms per kernel "
            f"(timestamp queries, median of 5 steps after {warmup} warm-up steps)\n# kernels: {model.plan.describe()}")
    return head + "\n" + format_profile(rows, summary)


def plot_losses(history, path: Path):
    pts = [h for h in history if h.get("train") is not None]
    if not pts:
        return None
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot([h["step"] for h in pts], [h["train"] for h in pts], label="train")
    val = [h for h in history if h.get("val") is not None]
    if val:
        ax.plot([h["step"] for h in val], [h["val"] for h in val], "o-", label="validation")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats/token)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    return save_png(fig, path)

