"""`tinygpt train`: what the CLI calls with an options object.

The loop keeps everything on the device; it reads the loss back only on steps it logs,
evaluates, or saves. Every output is claimed before the first step (outputs.Outputs). What keeps
the files whole (signals, the health check before a save, the rescue of a failed final save) is
safety.py's.
"""
from __future__ import annotations

import json
import shlex
import sys
import time

import numpy as np

from ..core.config import n_params
from ..core.errors import UsageError, word
from ..core.dpo import preference_stats
from ..core.lora import trainable_shapes
from ..device.gpu import GPU
from ..device.tune import cached_peaks
from .infer import FINAL_EVAL_WINDOWS, bits, prompt_ids, stop_ids, texts
from ..model.decode import Decoder
from ..model.gpt import Model
from ..model.spec import decoder_spec, sampler_rows
from ..model.profile import format_profile, over_peak, profile_step, with_peaks
from .options import TrainOptions
from .recipe import RunSettings, TrainOutputs, output_paths
from .runlog import RunLog, plot_losses, run_folder
from .safety import Interrupted, Saver, SideWriter, StopFlag, TrainingStopped, unhealthy
from .schedule import Deadline
from .start import Run, setup
from ..model.twincheck import blame


UNPLANNED = 10 ** 9


def clock_text(seconds: float) -> str:
    s = max(0, int(round(seconds)))
    return f"{s // 60} min {s % 60:02d} s" if s >= 60 else f"{s} s"


class Loop:
    """One `tinygpt train` from its first step to its report: the steps, the logged and evaluated
    ones, the periodic saves, then the final save, evaluation and samples."""

    def __init__(self, run: Run, start: int, outs: TrainOutputs, err, clock, t0: float, quiet: bool = False):
        self.run, self.start, self.outs, self.err, self.clock, self.quiet = run, start, outs, err, clock, quiet
        model, sched, length = run.model, run.schedule, run.length
        self.s = s = run.settings          # how it evaluates, logs, saves and ends
        self.deadline = Deadline(60 * length.minutes, clock, t0) if length.total is None else None
        self._end_at(length.total if length.total is not None else start + UNPLANNED)   # until the deadline's estimate
        self.side = SideWriter(err)
        self.tb_run = None
        if outs.tensorboard:      # a folder per run; a resumed run's own again
            self.tb_run = run_folder(outs.tensorboard, run.extra.get("tensorboardRun"), outs.checkpoint.stem)
            run.extra["tensorboardRun"] = self.tb_run.name
        self.log = RunLog(self.side, outs.log, self.tb_run, resumed_from=start or None)
        # keep-best: the lowest validation loss of the run so far, the resumed run's past included,
        # like with like: the best file's loss over the same windows (its record, keepBest), never
        # the end's whole-split loss nor an estimate over another number of windows
        held = run.extra.get("keepBest")
        same = isinstance(held, dict) and held.get("windows") == s.eval_windows \
            and isinstance(held.get("val"), (int, float)) and not isinstance(held.get("val"), bool)
        self.best_val = float(held["val"]) if same and outs.best and outs.best.exists() else None
        self.best_step = None
        self.val = run.data.val_windows(s.eval_windows)
        self.final_val = run.data.val_windows(FINAL_EVAL_WINDOWS)
        # the samples at the end: float32 from the key/value cache, whatever the run's precision
        self.reply = run.data.reply_prompt()     # a chat run's end answers a held-back conversation
        prompt = self.reply or prompt_ids(run.tokenizer, s.sample_prompt)
        rows = sampler_rows(run.cfg.ctx, s.sample_tokens, len(prompt)) if s.sample_tokens else 0
        self.sampler = Decoder(model.gpu, model.plan, decoder_spec(run.cfg, model.spec.attention, rows=rows),
                               s.sample_tokens) if s.sample_tokens else None
        self.stop = StopFlag()
        self.saver = Saver(run, outs.checkpoint, self.stop)
        self.last = {"train": None, "val": None}
        self.tok_s, self.x, self.y, self.refs, self.docs, self.lr = 0.0, None, None, None, None, sched.lr
        self.png = self.samples = None

    def _end_at(self, end: int):
        """The run's last step; the decay ends there too unless the resumed schedule holds it."""
        self.end = end
        self.run.schedule.end_at(end, self.run.length.held)

    def banner(self):
        run, err = self.run, self.err
        cfg, model, data, sched = run.cfg, run.model, run.data, run.schedule
        accum_text = f" x {model.spec.accum} micro-batches" if model.spec.accum > 1 else ""
        window = f" (windows of {model.T:,})" if model.T < cfg.ctx else ""
        print(f"tinygpt: {cfg.layers} layers, d_model {cfg.d_model}, {cfg.heads} heads, ctx {cfg.ctx}{window}, batch "
              f"{model.B}{accum_text}, vocab {cfg.vocab} ({n_params(cfg):,} parameters), attention "
              f"{model.spec.attention.name}, {model.precision.name} on {model.gpu.name} ({model.gpu.backend}, "
              f"{model.gpu.engine_label})", file=err)
        print(f"block: {cfg.block.describe()}", file=err)
        print(f"kernels: {model.plan.describe()}", file=err)
        print(f"optimizer: {run.optimizer.describe()}", file=err)
        for note in run.notes:
            print(note, file=err)
        if run.lora:
            lo = run.lora.lora
            n_train = sum(int(np.prod(sh)) for _, sh, _ in trainable_shapes(cfg, lo))
            print(f"lora: rank {lo.rank}, alpha {lo.alpha:g} on {','.join(lo.as_dict()['targets'])}"
                  f"{', biases and LayerNorms' if lo.biases else ''}: {n_train:,} trainable parameters, the base's "
                  f"{n_params(cfg):,} frozen", file=err)
        print(data.describe(), file=err)
        if self.deadline:
            self.deadline.reserve = end_cost(model, self.sampler, *self.final_val[:2], self.s, self.clock,
                                             run.tokenizer)
            print(f"schedule: {sched.describe().split(' at step')[0]} at the last step; steps fitted to "
                  f"{run.length.minutes:g} min", file=err)
        else:
            print(f"schedule: {sched.describe()}", file=err)
        if run.length.extension:
            print(word(run.length.extension), file=err)

    def run_all(self):
        """The steps, then the end of the run; Interrupted after a signal, once the model is saved."""
        from tqdm import tqdm
        self.bar = tqdm(total=None if self.deadline else self.end, initial=self.start, file=self.err, unit="step",
                        dynamic_ncols=True, disable=self.quiet,
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
        s, run, model, sched = self.s, self.run, self.run.model, self.run.schedule
        n_since, step, t_last = 0, self.start, self.clock()
        if self.deadline:
            self.deadline.start(self.start)
        while step < self.end and not self.stop.requested:
            self.lr = sched.at(step)
            batch = run.data.sample(run.rng, model.B * model.spec.accum)   # one batch of accum x B windows
            self.x, self.y = batch[:2]
            self.refs = batch[2] if len(batch) > 2 else None          # a DPO batch's pairs' reference log-probs
            self.docs = batch[3] if len(batch) > 3 else None          # a chat batch's positions in its records
            model.step(self.x, self.y, self.lr, *batch[2:])
            n_since += 1
            step = done = step + 1
            if self.deadline and (done - self.start < 200 or done % s.log_every == 0):
                fitted = self.deadline.last_step(done)
                if fitted is not None and fitted != self.end:
                    self._end_at(max(fitted, done))
                    self.bar.total = self.end
            is_last = done == self.end
            want_eval = s.eval_every and (done % s.eval_every == 0 or is_last)
            if done % s.log_every == 0 or is_last or want_eval:
                now = self.clock()
                self.tok_s = n_since * model.spec.accum * model.B * model.T / max(now - t_last, 1e-9)
                t_last, n_since = now, 0
                self._record(done, want_eval)
            self.bar.update(1)
            if s.save_every and done % s.save_every == 0 and not is_last:
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
        scaler = model.gate_state() if model.spec.scaled else None      # read with the loss, when shown
        pairs = {}
        if want_eval and model.spec.dpo is not None:        # DPO: the reward accuracy and margin beside the loss
            xs, ys, refs = self.val
            pairs = preference_stats(model.window_logprobs(xs, ys), refs, model.spec.dpo)
            rec["val"] = self.last["val"] = pairs["loss"]
        elif want_eval:
            rec["val"] = self.last["val"] = model.mean_loss(*self.val)
        self.last["train"] = loss
        run.history.append({k: rec[k] for k in ("step", "train", "val") if k in rec})
        row = {"step": done, "train_loss": loss, "val_loss": rec.get("val"), "lr": lr, "grad_norm": norm,
               "tokens_per_s": rec["tokens_per_s"],
               **{f"val_{k}": pairs[k] for k in ("reward_accuracy", "reward_margin") if k in pairs}}
        if scaler:
            row.update(loss_scale=scaler["scale"], skipped_steps=int(scaler["skipped"]))
        self.log.row(row)
        if self.outs.best and "val" in rec and (self.best_val is None or rec["val"] < self.best_val):
            self._save_best(done, rec["val"])
        self.bar.set_postfix_str(f"loss {loss:.4f}" + (f" val {rec['val']:.4f}" if "val" in rec else "")
                                 + (f" acc {pairs['reward_accuracy']:.2f} margin {pairs['reward_margin']:+.3f}"
                                    if pairs else "")
                                 + f" {self.tok_s:,.0f} tok/s"
                                 + (f" scale {scaler['scale']:g} skipped {int(scaler['skipped'])}" if scaler else "")
                                 + (f", {clock_text(self.deadline.left())} left" if self.deadline else ""))

    def progress(self, total: int, what: str, unit: str):
        """A bar for a phase of the end of the run (the whole-split evaluation), as the steps' bar."""
        from tqdm import tqdm
        return tqdm(total=total, desc=what, unit=unit, file=self.err, disable=self.quiet, leave=False,
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
        params = self.saver.checked_params(self.x, self.y, self.lr, refs=self.refs, docs=self.docs, done=done)
        before = self.run.extra.get("keepBest")     # the record goes in the best file and in the run's
        self.run.extra["keepBest"] = {"val": val, "windows": self.s.eval_windows, "step": done}
        try:
            self.saver.save(params, self.outs.best)
        except OSError as e:      # the run's own checkpoint is what matters: warn, go on
            self.run.extra.pop("keepBest") if before is None else self.run.extra.update(keepBest=before)
            print(f"\nwarning: could not save the best checkpoint {self.outs.best} at step {done} "
                  f"({e.strerror or e}); training goes on", file=self.err)
            return
        self.best_val, self.best_step = val, done

    def _save_periodic(self, done: int):
        params = self.saver.checked_params(self.x, self.y, self.lr, refs=self.refs, docs=self.docs, done=done)
        try:
            self.saver.save(params)
        except OSError as e:  # keep training: the state is in memory, the last good file on disk
            print(f"\nwarning: could not save {self.outs.checkpoint} at step {done} ({e.strerror or e}); "
                  f"{self.saver.kept_text()}; training goes on and saving is tried again", file=self.err)

    def _finish(self):
        """The final save: after the last step, or after a signal. The handlers stay in place
        until the file is whole, so a signal here is deferred, not fatal."""
        s, run, model, stop, out_path = self.s, self.run, self.run.model, self.stop, self.outs.checkpoint
        if self.end >= self.start + UNPLANNED:      # stopped before the deadline's first estimate
            self._end_at(model.step_count)
        if stop.requested:
            print(f"\n{stop.name}: stopping at step {model.step_count}; saving {out_path}", file=self.err)
        params = self.saver.checked_params(self.x, self.y, self.lr, refs=self.refs, docs=self.docs,
                                           done=model.step_count) if self.x is not None else model.get_params()
        try:
            if not stop.requested and s.eval_every:
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
                tok = run.tokenizer
                self.samples = [draw(self.sampler, tok, s, self.reply, run.extra), draw(
                    self.sampler, tok, s, self.reply, run.extra, SAMPLE_TEMPERATURE, SAMPLE_TOP_K, run.cfg.seed)]
        if stop.requested:   # before the save, or during the plot or sample after it
            given = run.data_path         # not read from the file: given again
            data = f" {{opt:data}} {shlex.quote(str(given))}" if given else ""
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
    if not run.settings.keep_best:      # claimed for a resumed run that turned out not to keep one
        outs.best = None
    loop = Loop(run, start, outs, err, clock, t0, o.quiet)
    loop.banner()
    loop.run_all()
    seconds = clock() - t0
    report(out, run, loop.last, len(loop.final_val[0]), loop.tok_s, seconds, loop.files(), loop.samples)
    return {"final_train_loss": loop.last["train"], "final_val_loss": loop.last.get("val_full"),
            "val_windows": len(loop.final_val[0]), "tokens_per_s": loop.tok_s, "checkpoint": str(outs.checkpoint),
            "plot": str(loop.png) if loop.png else None,
            "best": str(outs.best) if outs.best and loop.best_step is not None else None,
            "steps": run.model.step_count, "seconds": seconds,
            "samples": loop.samples}


SAMPLE_TEMPERATURE, SAMPLE_TOP_K = 0.8, 40      # the sampled text at the end of a run


def draw(sampler, tok, s, reply, extra: dict, temperature: float = 0.0, top_k=None, seed: int = 0) -> str:
    """The end of a run's sample: the prompt's continuation, or a chat run's reply to its held-back
    conversation (ended at the model's stop tokens, shown without them)."""
    if reply is None:
        return texts(sampler, tok, s.sample_prompt, s.sample_tokens, temperature, top_k, seed=seed)[0]
    seq = sampler.generate(reply, s.sample_tokens, temperature, top_k, 1.0, seed, stop_ids(extra, tok, tok.vocab))[0]
    return tok.decode(seq[len(reply):], skip_special=True)


def end_cost(model: Model, sampler: Decoder | None, fx, fy, s: RunSettings, clock, tok) -> float:
    """Seconds the end of a run will take after its last step, measured before the first step:
    one batch of evaluation and one sampled token, times how many the end runs, plus a margin
    for the save and the plot."""
    def timed(fn, *a):               # the second of two calls: the first one warms up
        fn(*a)
        t = clock()
        fn(*a)
        return clock() - t
    cost = timed(model.mean_loss, fx[:model.B], fy[:model.B]) * -(-len(fx) // model.B) if s.eval_every else 0.0
    if sampler:
        probe = min(8, s.sample_tokens)
        cost += 2 * s.sample_tokens / probe * timed(texts, sampler, tok, s.sample_prompt, probe)
    return 1.05 * cost + 0.5


def report(out, run: Run, last: dict, windows: int, tok_s: float, seconds: float,
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
    if samples and run.data.reply_prompt():
        print("greedy reply to the first held-back conversation:\n" + samples[0], file=out)
        print(f"sampled reply (temperature {SAMPLE_TEMPERATURE}, top-k {SAMPLE_TOP_K}, seed {run.cfg.seed}):\n"
              + samples[1], file=out)
    elif samples:
        print("greedy sample (temperature 0):\n" + samples[0], file=out)
        print(f"sample (temperature {SAMPLE_TEMPERATURE}, top-k {SAMPLE_TOP_K}, seed {run.cfg.seed}):\n"
              + samples[1], file=out)


def profile(o: TrainOptions, warmup: int = 3, as_json: bool = False) -> str:
    """`tinygpt train` with the profile option: a few steps, then the per-kernel table of one step
    (as_json: JSON Lines, one per kernel, then one for the whole step)."""
    run, _ = setup(o, steps=False)
    model = run.model
    if "timestamp-query" not in model.gpu.features:
        raise TrainingStopped(f"{model.gpu.name} offers no timestamp queries, so per-kernel GPU time cannot be read", 1)
    if model.spec.dpo is not None:
        raise UsageError("{opt:profile} times a step of text or chat data; a preference file's (DPO) step is not "
                         "profiled")
    for _ in range(warmup):
        batch = run.data.sample(run.rng, model.B * model.spec.accum)
        model.step(*batch[:2], run.schedule.lr, *batch[2:])
    peaks = cached_peaks(model.gpu)
    rows, summary = profile_step(model, *run.data.sample(run.rng, model.B)[:2], run.schedule.lr, peaks=peaks)
    if over_peak(rows, summary):        # the cached peaks were read on a busy minute: measure them again
        with_peaks(rows, summary, cached_peaks(model.gpu, again=True))
        summary["peaks_reliable"] = not over_peak(rows, summary)
    if as_json:
        return "\n".join([json.dumps(r) for r in rows] + [json.dumps(dict(summary, kernel="step"))])
    cfg = run.cfg
    head = (f"# one training step: {cfg.layers} layers, d_model {cfg.d_model}, ctx {cfg.ctx}, batch {model.B}, "
            f"attention {model.spec.attention.name}, on {model.gpu.name} ({model.gpu.backend}); GPU ms per kernel "
            f"(timestamp queries, median of 5 steps after {warmup} warm-up steps)\n# kernels: {model.plan.describe()}")
    return head + "\n" + format_profile(rows, summary)

