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
from .attention import check as check_attention
from .config import Config, n_params
from .data import Dataset, get_tokenizer, read_corpus
from .errors import TinyGPTError, UsageError, word
from .files import WRITER, Outputs, advice, atomic_write, derived, is_json_lines, is_our_png, rescue_paths
from .gpu import GPU
from .model import Model
from .options import EvalOptions, SampleOptions, TrainOptions
from .plan import make_plan
from .prep import init_params


class TrainingStopped(TinyGPTError):
    """A run ended early for a reason the user should see; exit_code says which."""


class Interrupted(TrainingStopped):
    """Stopped by a signal after saving (the lines before it said so); exit 130 or 143."""


def lr_at(step: int, lr: float, warmup: int, min_lr: float | None, total: int) -> float:
    """Constant lr by default (TinyGPT); with warmup or min_lr, linear warmup then cosine to min_lr."""
    if not warmup and min_lr is None:
        return lr
    if warmup and step < warmup:
        return lr * (step + 1) / warmup
    lo = lr * 0.1 if min_lr is None else min_lr
    span = max(1, total - warmup)
    frac = min(1.0, (step - warmup) / span)
    return lo + 0.5 * (lr - lo) * (1 + math.cos(math.pi * frac))


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


def data_path_for(given: str | None, recorded: str | None, source: str) -> str | None:
    """The data to read: the one given, or the built-in corpus. A path recorded in a file is
    never opened on the file's word: the user is asked to name it."""
    if given or not recorded:
        return given
    raise UsageError(f"{source} was trained on {recorded}; give {{opt:data}} {recorded} (or another text file) "
                     "to use it: tinygpt does not open paths read from a file")


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
        for k in ("batch", "lr", "grad_clip"):
            if getattr(o, k) is not None:
                setattr(cfg, k, getattr(o, k))
        tokenizer_name = tok_file
    else:
        cfg = preset(o.preset, layers=o.layers, d_model=o.d_model, heads=o.heads, ctx=o.ctx,
                     batch=o.batch, lr=o.lr, grad_clip=o.grad_clip, seed=o.seed)
        tokenizer_name = o.tokenizer or "byte"
    tok = get_tokenizer(tokenizer_name, o.tokenizer_file)
    cfg.vocab = tok.vocab
    cfg.validate()
    check_attention(o.attention, cfg.ctx, cfg.d_model, cfg.heads)
    data_path = data_path_for(o.data, resume.extra.get("data") if resume else None, f"{{opt:resume}} {o.resume}")
    raw, name = read_corpus(data_path)
    data = Dataset(tok.encode(raw), cfg.ctx, name)
    gpu = gpu or GPU()
    model = Model(gpu, cfg, o.attention, plan=make_plan(gpu, o.kernels))
    extra = {"tokenizer": tok.name, "data": data_path, "attention": o.attention}
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
    return Run(cfg, model, data, tok, rng, history, extra), start


def train(o: TrainOptions, gpu: GPU | None = None, out=None, err=None) -> dict:
    out, err = out or sys.stdout, err or sys.stderr
    outs = output_paths(o)                       # every output checked before anything is read
    out_path = outs.checkpoint
    run, start = setup(o, gpu)
    cfg, model, data = run.cfg, run.model, run.data
    steps = o.steps
    if steps <= start:
        raise UsageError(f"the checkpoint is already at step {start}; ask for more {{opt:steps}} than that")
    side = SideWriter(err)
    log = side.attempt("log", open, outs.log, "a") if outs.log else None
    B, T = model.B, model.T
    vx, vy = data.val_windows(o.eval_windows)
    print(f"tinygpt: {cfg.layers} layers, d_model {cfg.d_model}, {cfg.heads} heads, ctx {cfg.ctx}, batch {B}, "
          f"vocab {cfg.vocab} ({n_params(cfg):,} parameters), attention {o.attention} on {model.gpu.name} "
          f"({model.gpu.backend})", file=err)
    print(f"kernels: {model.plan.describe()}", file=err)
    print(f"data: {data.name}: {len(data.tokens):,} tokens ({len(data.train):,} train, {len(data.val):,} val)", file=err)
    from tqdm import tqdm
    bar = tqdm(total=steps, initial=start, file=err, unit="step", dynamic_ncols=True, disable=o.quiet,
               mininterval=0.1 if getattr(err, "isatty", lambda: False)() else 5.0)
    t_last, tok_s = time.time(), 0.0
    last = {"train": None, "val": None}
    stop = StopFlag()
    saver = Saver(run, out_path, stop)
    x = y = None
    lr = cfg.lr
    try:
        n_since = 0
        for step in range(start, steps):
            if stop.requested:
                break
            lr = lr_at(step, cfg.lr, o.warmup, o.min_lr, steps)
            x, y = data.sample(run.rng, B)
            model.step(x, y, lr)
            n_since += 1
            done = step + 1
            is_last = done == steps
            want_eval = o.eval_every and (done % o.eval_every == 0 or is_last)
            if done % o.log_every == 0 or is_last or want_eval:
                loss = model.loss()
                now = time.time()
                tok_s = n_since * B * T / max(now - t_last, 1e-9)
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
                                    + f" {tok_s:,.0f} tok/s")
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
        if stop.requested:
            print(f"\n{stop.name}: stopping at step {model.step_count}; saving {out_path}", file=err)
        params = saver.checked_params(x, y, lr, model.step_count) if x is not None else model.get_params()
        saver.save_final(params)
        if not stop.requested:
            png = side.attempt("loss-curve plot", plot_losses, run.history, outs.plot)
            sample_text = generate(model.gpu, cfg, params, run.tokenizer, "The ", 120, 0.0, None, 0,
                                   o.attention, model.plan)
        if stop.requested:   # before the save, or during the plot or sample after it
            print(word(f"saved; continue with: tinygpt train {{opt:resume}} {out_path} {{opt:steps}} {steps}"),
                  file=err)
            raise Interrupted("interrupted", stop.exit_code)
    finally:
        bar.close()
        if log:
            side.attempt("log", log.close)
        stop.restore()
    summary = {"final_train_loss": last["train"], "final_val_loss": last["val"], "tokens_per_s": tok_s,
               "checkpoint": str(out_path), "plot": str(png) if png else None, "steps": steps}
    val = f"{last['val']:.4f}" if last["val"] is not None else word("not evaluated ({opt:eval_every} 0)")
    print(f"final train loss {last['train']:.4f}, val loss {val}, {tok_s:,.0f} tokens/s", file=out)
    print(f"checkpoint {out_path}" + (f", loss curve {png}" if png else ""), file=out)
    print("greedy sample:\n" + sample_text, file=out)
    return summary


def profile(o: TrainOptions, warmup: int = 3) -> str:
    """`tinygpt train` with the profile option: a few steps, then the per-kernel table of one step."""
    from .profile import format_profile, profile_step
    run, _ = setup(o)
    model = run.model
    if "timestamp-query" not in model.gpu.features:
        raise TrainingStopped(f"{model.gpu.name} offers no timestamp queries, so per-kernel GPU time cannot be read", 1)
    for _ in range(warmup):
        model.step(*run.data.sample(run.rng, model.B), run.cfg.lr)
    rows, total = profile_step(model, *run.data.sample(run.rng, model.B), run.cfg.lr)
    cfg = run.cfg
    head = (f"# one training step: {cfg.layers} layers, d_model {cfg.d_model}, ctx {cfg.ctx}, batch {model.B}, "
            f"attention {o.attention}, on {model.gpu.name} ({model.gpu.backend}); GPU ms per kernel "
            f"(timestamp queries, median of 5 steps after {warmup} warm-up steps)\n# kernels: {model.plan.describe()}")
    return head + "\n" + format_profile(rows, total)


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


# ---- evaluation and sampling --------------------------------------------------------------------
def tokenizer_of(ck: ckpt.Checkpoint, tokenizer_file=None):
    """The checkpoint's tokenizer (load() has checked that it produces the file's vocabulary)."""
    return get_tokenizer(ckpt.tokenizer_name(ck.extra, ck.cfg.vocab), tokenizer_file)


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
    return {"loss": loss, "perplexity": ppl, "windows": len(xs), "tokens": len(xs) * cfg.ctx}


def sample(o: SampleOptions, gpu: GPU | None = None, err=None) -> str:
    """`tinygpt sample`: prompt + o.tokens generated tokens, decoded."""
    ck = ckpt.load(o.model, f"{{opt:model}} {o.model}")
    if o.top_k is not None and o.top_k > ck.cfg.vocab:
        raise UsageError(f"{{opt:top_k}} {o.top_k} exceeds the vocabulary ({ck.cfg.vocab})")
    tok = tokenizer_of(ck, o.tokenizer_file)
    gpu = gpu or GPU()
    print(f"sampling {o.tokens} tokens at temperature {o.temperature} on {gpu.name}", file=err or sys.stderr)
    return generate(gpu, ck.cfg, ck.params, tok, o.prompt, o.tokens, o.temperature, o.top_k, o.seed, o.attention,
                    make_plan(gpu, o.kernels))


def pick(logits: np.ndarray, temperature: float, top_k: int | None, rng: np.random.Generator) -> int:
    if temperature <= 0:
        return int(np.argmax(logits))
    z = logits.astype(np.float64) / temperature
    if top_k and top_k < len(z):
        kth = np.partition(z, -top_k)[-top_k]
        z = np.where(z < kth, -np.inf, z)
    p = np.exp(z - z.max())
    p /= p.sum()
    return int(rng.choice(len(p), p=p))


def generate(gpu: GPU, cfg: Config, params: dict, tok, prompt: str, n: int, temperature: float,
             top_k: int | None, seed: int, attention="online", plan=None) -> str:
    """prompt + n generated tokens, decoded. Each token is one forward of a [1, ctx] window on the GPU."""
    model = Model(gpu, cfg, attention, B=1, training=False, plan=plan)
    model.set_params(params)
    ids = [int(i) for i in tok.encode(prompt)] or [int(tok.encode("\n")[0])]
    rng = np.random.default_rng(seed)
    for _ in range(n):
        window = ids[-cfg.ctx:]
        x = np.zeros((1, cfg.ctx), np.uint32)
        x[0, :len(window)] = window          # later positions cannot affect earlier ones (causal)
        logits = model.logits_row(x, len(window) - 1)
        ids.append(pick(logits, temperature, top_k, rng))
    return tok.decode(ids)
