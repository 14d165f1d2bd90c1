"""Training, evaluation and sampling on the GPU; what the CLI calls with an options object.

The loop keeps everything on the GPU; it reads the loss back only on steps it
logs, evaluates, or saves. Every output is claimed before the first step
(files.Outputs). A checkpoint is saved only after the weights it holds pass a
health check; Ctrl-C or SIGTERM, at any moment, ends in a whole checkpoint
(exit 130 or 143); a failed final save puts the model where it can go.
"""
from __future__ import annotations

import io
import json
import math
import signal
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import checkpoint as ckpt
from . import memory
from .attention import check as check_attention
from .config import PRESET_TOKENIZER, TRAIN_DEFAULTS, Config, n_params
from .data import Dataset, get_tokenizer, read_corpus
from .errors import TinyGPTError, UsageError, word
from .files import WRITER, Outputs, advice, atomic_write, derived, is_json_lines, is_our_png, rescue_paths
from .gpu import GPU
from .infer import FINAL_EVAL_WINDOWS, Sampler, bits, data_path_for
from .model import Model, bf16_problem
from .options import TrainOptions
from .plan import make_plan
from .prep import init_params
from .schedule import Budget, Schedule, resolve


class TrainingStopped(TinyGPTError):
    """A run ended early for a reason the user should see; exit_code says which."""


class Interrupted(TrainingStopped):
    """Stopped by a signal after saving (the lines before it said so); exit 130 or 143."""


class StopFlag:
    """Ctrl-C (SIGINT) or SIGTERM (systemd, Slurm, `timeout`, containers) asks to stop after the
    current step, never mid-step, so the saved sampling state and weights agree. A third signal
    stops at once without saving, except while a checkpoint is written: then it waits."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self):
        self.requested, self.signum, self._saving, self.old = 0, None, False, {}
        try:
            for s in self.SIGNALS:
                self.old[s] = signal.signal(s, self._handler)
        except ValueError:  # not the main thread: leave signals alone
            self.old = {}

    def _handler(self, signum, _frame):
        self.requested += 1
        self.signum = self.signum or signum
        if self.requested >= 3 and not self._saving:
            raise KeyboardInterrupt

    @property
    def exit_code(self) -> int:
        return 128 + int(self.signum or signal.SIGINT)   # 130 for Ctrl-C, 143 for SIGTERM

    @property
    def name(self) -> str:
        return "SIGTERM" if self.signum == signal.SIGTERM else "Ctrl-C"

    @contextmanager
    def saving(self):
        """While a checkpoint is written, signals only count."""
        was, self._saving = self._saving, True
        try:
            yield
        finally:
            self._saving = was

    def restore(self):
        """Put the old handlers back; after a signal, ignore further ones while the process exits
        (a late one would otherwise kill it after the save, with no exit code of ours)."""
        for s, old in self.old.items():
            signal.signal(s, signal.SIG_IGN if self.requested else old)
        self.old = {}


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


def unhealthy(loss: float, norm: float | None, best: float | None, vocab: int) -> str | None:
    """Why the model has diverged, or None. Exploding: worse than 3 x ln V (uniform guessing
    scores ln V), or worse than guessing and more than twice the best loss of this run."""
    if not math.isfinite(loss):
        return f"the loss became {loss}"
    if norm is not None and not math.isfinite(norm):
        return f"the gradient norm became {norm}"
    guess = math.log(vocab)
    if loss > 3 * guess:
        return f"the loss exploded to {loss:.4g} (uniform guessing scores {guess:.3g})"
    if best is not None and loss > guess and loss > 2 * best:
        return f"the loss jumped to {loss:.4g}, over twice this run's best ({best:.4g})"
    return None


class Saver:
    """Writes the run's checkpoint to one path, only after the weights pass the health check,
    and remembers which step the file on disk holds (for messages after a refusal)."""

    def __init__(self, run: Run, path: Path, stop: StopFlag):
        self.run, self.path, self.stop = run, path, stop
        self.kept = ckpt.peek_step(path) if ckpt.is_tinygpt(path) else None
        self.best = None                       # the best train loss seen in this run

    def kept_text(self) -> str:
        if self.kept is None:
            return f"no checkpoint was saved at {self.path}"
        return f"{self.path} keeps the checkpoint of step {self.kept}"

    def checked_params(self, x, y, lr: float, done: int) -> dict:
        """The current (updated) weights, read once, after checking them and their loss on the
        last batch: a step that diverged is never saved over a good checkpoint."""
        model = self.run.model
        loss = model.evaluate(x, y)
        params = model.get_params()
        why = unhealthy(loss, None, self.best, self.run.cfg.vocab)
        if why is None:
            bad = [n for n, a in params.items() if not np.all(np.isfinite(a))]
            why = f"parameter {bad[0]} holds nan/inf" if bad else None
        if why:
            raise TrainingStopped(f"{why} after step {done}; not saved: {self.kept_text()}; lower {{opt:lr}} "
                                  f"(it is {lr:g}) or {{opt:grad_clip}}", 3)
        return params

    def save(self, params: dict, path: Path | None = None):
        run, path = self.run, path or self.path
        m, v, step = run.model.get_opt_state()
        extra = dict(run.extra)
        extra["dataRngState"] = run.rng.bit_generator.state
        extra["schedule"] = run.schedule.as_dict()
        ck = ckpt.Checkpoint(run.cfg, params, m, v, step, run.history, extra)
        with self.stop.saving():
            ckpt.save(path, ck)
        if path == self.path:
            self.kept = step

    def save_final(self, params: dict):
        """Save, or put the model where it can go and say where (exit 1 either way on failure)."""
        try:
            self.save(params)
            return
        except OSError as e:
            reason = f"could not save {self.path} ({e.strerror or e}; {advice(e)})"
            tried = []
            for alt in rescue_paths(self.path):
                try:
                    self.save(params, alt)
                except OSError:
                    tried.append(str(alt))
                    continue
                raise TrainingStopped(f"{reason}; the model was saved to {alt} instead: move it, or continue with "
                                      f"{{opt:resume}} {alt}", 1) from e
            raise TrainingStopped(f"{reason}, nor at {', '.join(tried)}; {self.kept_text()}", 1) from e


class SideWriter:
    """The log and the plot: a failure warns once and the run goes on."""

    def __init__(self, err):
        self.err, self.warned = err, set()

    def attempt(self, what: str, fn, *a):
        if what in self.warned:
            return None
        try:
            return fn(*a)
        except Exception as e:  # a plot or a log line never kills a run
            self.warned.add(what)
            print(f"\nwarning: could not write the {what} ({getattr(e, 'strerror', None) or e}); "
                  "training goes on without it", file=self.err)
            return None


def _differences(fcfg: Config, o: TrainOptions) -> list[str]:
    diffs = []
    for name in ("layers", "d_model", "heads", "ctx"):
        want = getattr(o, name)
        if want is not None and want != getattr(fcfg, name):
            diffs.append(f"{{opt:{name}}} {want} (file: {getattr(fcfg, name)})")
    return diffs


@dataclass
class TrainOutputs:
    checkpoint: Path
    plot: Path
    log: Path | None


def output_paths(o: TrainOptions) -> TrainOutputs:
    """Claims the checkpoint, its loss-curve plot and the log before anything is read or run.
    The checkpoint may be the resumed file (written back); nothing else may be an input."""
    out = Path(o.out or o.resume or f"runs/{o.preset}.tinygpt")
    outs = Outputs(o.force, {"data": o.data, "tokenizer_file": o.tokenizer_file, "resume": o.resume})
    return TrainOutputs(outs.claim(out, "out", "checkpoint", ckpt.is_tinygpt, updates="resume"),
                        outs.claim(derived(out, ".loss.png"), "out", "loss-curve plot", is_our_png),
                        outs.claim(o.log, "log", "log", is_json_lines, append=True) if o.log else None)


def setup(o: TrainOptions, gpu: GPU | None = None) -> tuple[Run, int]:
    """Config, data, model and state for `tinygpt train`; returns the run and its start step."""
    from .config import preset
    resume = None
    if o.resume:
        resume = ckpt.load(o.resume, f"{{opt:resume}} {o.resume}")
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
        tokenizer_name = tok_file
        schedule = resolve(o, resume.extra.get("schedule"), cfg.lr)
    else:
        cfg = preset(o.preset, layers=o.layers, d_model=o.d_model, heads=o.heads, ctx=o.ctx,
                     batch=o.batch, grad_clip=o.grad_clip, seed=o.seed)
        tokenizer_name = o.tokenizer or PRESET_TOKENIZER.get(o.preset, "byte")
        schedule = resolve(o)
    cfg.lr = schedule.lr              # the header's learningRate: the peak
    tok = get_tokenizer(tokenizer_name, o.tokenizer_file)
    cfg.vocab = tok.vocab
    cfg.validate()
    check_attention(o.attention, cfg.ctx, cfg.d_model, cfg.heads)
    data_path = data_path_for(o.data, resume.extra.get("data") if resume else None, f"{{opt:resume}} {o.resume}")
    raw, name = read_corpus(data_path)
    data = Dataset(tok.encode(raw), cfg.ctx, name)
    accum = o.grad_accum or (int(resume.extra.get("gradAccum", 1)) if resume else 1)
    if not 1 <= accum <= 4096:
        raise UsageError(f"{{opt:grad_accum}} must be 1 to 4096, got {accum}")
    gpu = gpu or GPU()
    precision = o.precision or (resume.extra.get("precision", "fp32") if resume else "fp32")
    mem = memory.plan(cfg, cfg.batch, o.attention, accum, memory.device_limits(gpu), o.sample_tokens, precision)
    if not mem.fits:                              # before anything is allocated: the plan's message
        raise UsageError(memory.refusal(mem))
    plan = make_plan(gpu, o.kernels)
    if precision == "bf16" and bf16_problem(plan, cfg.d_model, cfg.d_mlp):
        raise UsageError(bf16_problem(plan, cfg.d_model, cfg.d_mlp))
    model = Model(gpu, cfg, o.attention, plan=plan, accum=accum, precision=precision)
    # the checkpoint stays float32 whatever the precision: a bf16 run resumes in fp32 and back
    extra = {"tokenizer": tok.name, "data": data_path, "attention": o.attention, "gradAccum": accum,
             "precision": precision}
    if tok.name == "gpt2":
        extra["tokenizerSource"] = "r50k_base"
    rng = np.random.default_rng([cfg.seed, 1])  # data sampling; init draws from default_rng(seed)
    history = []
    if resume:
        model.set_params(resume.params)
        if resume.m is not None:
            model.set_opt_state(resume.m, resume.v, resume.step)
        else:
            model.step_count = resume.step
        if "dataRngState" in resume.extra:
            try:
                rng.bit_generator.state = resume.extra["dataRngState"]
            except (TypeError, ValueError, KeyError) as e:
                raise ckpt.CheckpointError(f"{{opt:resume}} {o.resume}: its data-sampling state is malformed") from e
        history = list(resume.loss_history)
        start = resume.step
    else:
        model.set_params(init_params(cfg))
        start = 0
    return Run(cfg, model, data, tok, rng, history, extra, schedule), start


def planned_total(o: TrainOptions, run: Run, start: int) -> int | None:
    """The last step: the steps option, else the resumed run's planned end, else the preset's default;
    None with minutes (the budget sets it)."""
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


UNPLANNED = 10 ** 9


def clock_text(seconds: float) -> str:
    s = max(0, int(round(seconds)))
    return f"{s // 60} min {s % 60:02d} s" if s >= 60 else f"{s} s"


def train(o: TrainOptions, gpu: GPU | None = None, out=None, err=None, clock=time.monotonic) -> dict:
    """`tinygpt train`. clock: seconds, monotonic; the time budget and the reported time read it."""
    t0 = clock()
    out, err = out or sys.stdout, err or sys.stderr
    outs = output_paths(o)                       # every output checked before anything is read
    out_path = outs.checkpoint
    run, start = setup(o, gpu)
    cfg, model, data, sched = run.cfg, run.model, run.data, run.schedule
    total = planned_total(o, run, start)
    budget = Budget(60 * o.minutes, clock, t0) if total is None else None
    sched.total = total if total is not None else start + UNPLANNED     # until the budget's first estimate
    side = SideWriter(err)
    log = side.attempt("log", open, outs.log, "a") if outs.log else None
    B, T = model.B, model.T
    vx, vy = data.val_windows(o.eval_windows)
    fx, fy = data.val_windows(FINAL_EVAL_WINDOWS)
    sampler = Sampler(model.gpu, cfg, run.tokenizer, o.attention, model.plan, 1, o.sample_tokens) \
        if o.sample_tokens else None
    accum_text = f" x {model.accum} micro-batches" if model.accum > 1 else ""
    print(f"tinygpt: {cfg.layers} layers, d_model {cfg.d_model}, {cfg.heads} heads, ctx {cfg.ctx}, batch {B}{accum_text}, "
          f"vocab {cfg.vocab} ({n_params(cfg):,} parameters), attention {o.attention}, {model.precision} "
          f"on {model.gpu.name} ({model.gpu.backend})", file=err)
    print(f"kernels: {model.plan.describe()}", file=err)
    print(f"data: {data.name}: {len(data.tokens):,} tokens ({len(data.train):,} train, {len(data.val):,} val)", file=err)
    if budget:
        budget.reserve = end_cost(model, sampler, fx, fy, o, clock)
        print(f"schedule: {sched.describe().split(' at step')[0]} at the last step; steps fitted to "
              f"{o.minutes:g} min", file=err)
    else:
        print(f"schedule: {sched.describe()}", file=err)
    from tqdm import tqdm
    bar = tqdm(total=total, initial=start, file=err, unit="step", dynamic_ncols=True, disable=o.quiet,
               mininterval=0.1 if getattr(err, "isatty", lambda: False)() else 5.0)
    t_last, tok_s = clock(), 0.0
    last = {"train": None, "val": None}
    stop = StopFlag()
    saver = Saver(run, out_path, stop)
    x = y = None
    lr = sched.lr
    png = sample_text = None
    try:
        n_since, step = 0, start
        if budget:
            budget.start(start)
        while step < sched.total:
            if stop.requested:
                break
            lr = sched.at(step)
            x, y = data.sample(run.rng, B * model.accum)     # the windows of one batch of accum x B
            model.step(x, y, lr)
            n_since += 1
            step = done = step + 1
            if budget and (done - start < 200 or done % o.log_every == 0):
                fitted = budget.plan(done)
                if fitted is not None and fitted != sched.total:
                    sched.total = max(fitted, done)
                    bar.total = sched.total
            is_last = done == sched.total
            want_eval = o.eval_every and (done % o.eval_every == 0 or is_last)
            if done % o.log_every == 0 or is_last or want_eval:
                loss = model.loss()
                now = clock()
                tok_s = n_since * model.accum * B * T / max(now - t_last, 1e-9)
                t_last, n_since = now, 0
                norm = model.grad_norm()
                why = unhealthy(loss, norm, saver.best, cfg.vocab)
                if why:
                    raise TrainingStopped(f"{why} at step {done}; lower {{opt:lr}} (it is {lr:g}) or "
                                          f"{{opt:grad_clip}}; {saver.kept_text()}", 3)
                saver.best = loss if saver.best is None else min(saver.best, loss)
                rec = {"step": done, "train": loss, "lr": lr, "tokens_per_s": round(tok_s, 1)}
                if want_eval:
                    rec["val"] = model.mean_loss(vx, vy)
                    last["val"] = rec["val"]
                last["train"] = loss
                run.history.append({k: rec[k] for k in ("step", "train", "val") if k in rec})
                if log:
                    line = json.dumps({"step": done, "train_loss": loss, "val_loss": rec.get("val"), "lr": lr,
                                       "tokens_per_s": rec["tokens_per_s"]}) + "\n"
                    if side.attempt("log", lambda: (log.write(line), log.flush())) is None:
                        log = None
                bar.set_postfix_str(f"loss {loss:.4f}" + (f" val {rec['val']:.4f}" if "val" in rec else "")
                                    + f" {tok_s:,.0f} tok/s"
                                    + (f", {clock_text(budget.left())} left" if budget else ""))
            bar.update(1)
            if o.save_every and done % o.save_every == 0 and not is_last:
                params = saver.checked_params(x, y, lr, done)
                try:
                    saver.save(params)
                except OSError as e:  # keep training: the state is in memory, the last good file on disk
                    print(f"\nwarning: could not save {out_path} at step {done} ({e.strerror or e}); "
                          f"{saver.kept_text()}; training goes on and saving is tried again", file=err)
        bar.close()
        # The final save: after the last step, or after a signal. The handlers stay in place
        # until the file is whole, so a signal here is deferred, not fatal.
        if sched.total >= start + UNPLANNED:      # stopped before the budget's first estimate
            sched.total = model.step_count
        if stop.requested:
            print(f"\n{stop.name}: stopping at step {model.step_count}; saving {out_path}", file=err)
        params = saver.checked_params(x, y, lr, model.step_count) if x is not None else model.get_params()
        saver.save_final(params)
        if not stop.requested:
            png = side.attempt("loss-curve plot", plot_losses, run.history, outs.plot)
            if o.eval_every:
                last["val_full"] = model.mean_loss(fx, fy)
            if sampler:
                sampler.set_params(params)
                sample_text = [sampler.generate(o.sample_prompt, o.sample_tokens, 0.0)[0],
                               sampler.generate(o.sample_prompt, o.sample_tokens, SAMPLE_TEMPERATURE, SAMPLE_TOP_K,
                                                seed=cfg.seed)[0]]
        if stop.requested:   # before the save, or during the plot or sample after it
            print(word(f"saved; continue with: tinygpt train {{opt:resume}} {out_path}"), file=err)
            raise Interrupted("interrupted", stop.exit_code)
    finally:
        bar.close()
        if log:
            side.attempt("log", log.close)
        stop.restore()
    seconds = clock() - t0
    report(out, run, o, last, len(fx), tok_s, seconds, out_path, png, sample_text)
    return {"final_train_loss": last["train"], "final_val_loss": last.get("val_full"), "val_windows": len(fx),
            "tokens_per_s": tok_s, "checkpoint": str(out_path), "plot": str(png) if png else None,
            "steps": model.step_count, "seconds": seconds, "samples": sample_text}


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
           out_path: Path, png, samples):
    """The end of a run: losses (val over the whole split, in bits too for bytes), time, files, samples."""
    val = last.get("val_full")
    if val is None:
        val_text = word("not evaluated ({opt:eval_every} 0)")
    else:
        unit = f" = {bits(val):.3f} bits/byte" if run.tokenizer.name == "byte" else ""
        val_text = f"{val:.4f} nats{unit} (whole validation split, {windows:,} windows)"
    train_text = f"{last['train']:.4f}" if last["train"] is not None else "-"
    print(f"final train loss {train_text}, val loss {val_text}", file=out)
    print(f"{run.model.step_count:,} steps in {clock_text(seconds)}, {tok_s:,.0f} tokens/s; checkpoint {out_path}"
          + (f", loss curve {png}" if png else ""), file=out)
    if samples:
        print("greedy sample (temperature 0):\n" + samples[0], file=out)
        print(f"sample (temperature {SAMPLE_TEMPERATURE}, top-k {SAMPLE_TOP_K}, seed {run.cfg.seed}):\n"
              + samples[1], file=out)


def profile(o: TrainOptions, warmup: int = 3, as_json: bool = False) -> str:
    """`tinygpt train` with the profile option: a few steps, then the per-kernel table of one step
    (as_json: JSON Lines, one per kernel, then one for the whole step)."""
    import json
    from .profile import format_profile, profile_step
    from .tune import cached_peaks
    run, _ = setup(o)
    model = run.model
    if "timestamp-query" not in model.gpu.features:
        raise TrainingStopped(f"{model.gpu.name} offers no timestamp queries, so per-kernel GPU time cannot be read", 1)
    for _ in range(warmup):
        model.step(*run.data.sample(run.rng, model.B * model.accum), run.schedule.lr)
    peaks = cached_peaks(model.gpu)
    rows, summary = profile_step(model, *run.data.sample(run.rng, model.B), run.schedule.lr, peaks=peaks)
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
    buf = io.BytesIO()
    fig.savefig(buf, dpi=100, format="png", metadata={"Software": WRITER})  # marks the file as ours
    plt.close(fig)
    atomic_write(path, buf.getvalue())
    return path
