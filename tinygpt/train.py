"""Training, evaluation and sampling on the GPU; what the CLI calls.

The loop keeps everything on the GPU; it reads the loss back only on steps it
logs, evaluates, or saves. Checkpoints are written atomically; Ctrl-C saves
first and exits 130; a non-finite loss stops the run and keeps the last good
checkpoint on disk.
"""
from __future__ import annotations

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
from . import reference as R
from .attention import check as check_attention
from .config import Config, n_params
from .data import Dataset, get_tokenizer, read_corpus
from .gpu import GPU
from .model import Model


class TrainingStopped(RuntimeError):
    """A run ended early for a reason the user should see; exit_code says which."""

    def __init__(self, msg, exit_code=1):
        super().__init__(msg)
        self.exit_code = exit_code


def lr_at(step: int, lr: float, warmup: int, min_lr: float | None, total: int) -> float:
    """Constant lr by default (TinyGPT); with --warmup or --min-lr, linear warmup then cosine to min_lr."""
    if not warmup and min_lr is None:
        return lr
    if warmup and step < warmup:
        return lr * (step + 1) / warmup
    lo = lr * 0.1 if min_lr is None else min_lr
    span = max(1, total - warmup)
    frac = min(1.0, (step - warmup) / span)
    return lo + 0.5 * (lr - lo) * (1 + math.cos(math.pi * frac))


class StopFlag:
    """Ctrl-C during training asks to stop after the current step (never mid-step, so the
    saved data-sampling state and weights agree); a third Ctrl-C stops at once."""

    def __init__(self):
        self.requested = 0
        try:
            self.old = signal.signal(signal.SIGINT, self._handler)
        except ValueError:  # not the main thread: leave Ctrl-C alone
            self.old = None

    def _handler(self, *_):
        self.requested += 1
        if self.requested >= 3:
            raise KeyboardInterrupt

    def restore(self):
        """Put the old handler back; after a Ctrl-C, ignore further ones while the process exits
        (a late one would otherwise kill it after the save, with no exit code of ours)."""
        if self.old is not None:
            signal.signal(signal.SIGINT, signal.SIG_IGN if self.requested else self.old)
            self.old = None


@contextmanager
def no_interrupt():
    """Defer Ctrl-C while a checkpoint is written; re-raise it afterwards."""
    got = []
    try:
        old = signal.signal(signal.SIGINT, lambda *_: got.append(1))
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)
    if got:
        raise KeyboardInterrupt


@dataclass
class Run:
    cfg: Config
    model: Model
    data: Dataset
    tokenizer: object
    rng: np.random.Generator
    history: list
    extra: dict


def save_run(run: Run, path: Path):
    m, v, step = run.model.get_opt_state()
    params = run.model.get_params()
    for name, a in params.items():
        if not np.all(np.isfinite(a)):
            raise TrainingStopped(f"not saving {path}: parameter {name} holds nan/inf; the previous checkpoint is kept", 3)
    extra = dict(run.extra)
    extra["dataRngState"] = run.rng.bit_generator.state
    ck = ckpt.Checkpoint(run.cfg, params, m, v, step, run.history, extra)
    with no_interrupt():
        ckpt.save(path, ck)


def save_final(run: Run, path: Path):
    try:
        save_run(run, path)
    except OSError as e:
        keep = "the previous checkpoint there is intact" if path.exists() else "nothing was written"
        raise TrainingStopped(f"could not save {path} ({e.strerror or e}); {keep}; free space or choose another --out "
                              "and run again (with --resume if a checkpoint exists)", 1) from e


def _differences(fcfg: Config, args) -> list[str]:
    diffs = []
    for flag, name in (("layers", "layers"), ("d_model", "d_model"), ("heads", "heads"), ("ctx", "ctx")):
        want = getattr(args, flag, None)
        if want is not None and want != getattr(fcfg, name):
            diffs.append(f"--{flag.replace('_', '-')} {want} (file: {getattr(fcfg, name)})")
    return diffs


def setup(args, gpu: GPU | None = None) -> tuple[Run, int]:
    """Config, data, model and state for `tinygpt train`; returns the run and its start step."""
    from .config import preset
    resume = None
    if args.resume:
        resume = ckpt.load(args.resume)
        diffs = _differences(resume.cfg, args)
        tok_file = resume.extra.get("tokenizer", "byte")
        if args.tokenizer and args.tokenizer != tok_file:
            diffs.append(f"--tokenizer {args.tokenizer} (file: {tok_file})")
        if diffs:
            raise TrainingStopped(f"--resume {args.resume}: these flags contradict the file: {'; '.join(diffs)}; "
                                  "drop them to continue the saved model", 2)
        cfg = resume.cfg
        for k in ("batch", "lr", "grad_clip"):
            if getattr(args, k, None) is not None:
                setattr(cfg, k, getattr(args, k))
        tokenizer_name = tok_file
    else:
        cfg = preset(args.preset, layers=args.layers, d_model=args.d_model, heads=args.heads, ctx=args.ctx,
                     batch=args.batch, lr=args.lr, grad_clip=args.grad_clip, seed=args.seed)
        tokenizer_name = args.tokenizer or "byte"
    tok = get_tokenizer(tokenizer_name, getattr(args, "tokenizer_file", None))
    cfg.vocab = tok.vocab
    cfg.validate()
    check_attention(args.attention, cfg.ctx, cfg.d_model, cfg.heads)
    data_path = args.data if args.data else (resume.extra.get("data") if resume and resume.extra.get("data") else None)
    raw, name = read_corpus(data_path)
    data = Dataset(tok.encode(raw), cfg.ctx, name)
    gpu = gpu or GPU()
    model = Model(gpu, cfg, args.attention)
    extra = {"tokenizer": tok.name, "data": data_path, "attention": args.attention}
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
            rng.bit_generator.state = resume.extra["dataRngState"]
        history = list(resume.loss_history)
        start = resume.step
    else:
        model.set_params(R.init_params(cfg))
        start = 0
    return Run(cfg, model, data, tok, rng, history, extra), start


def train(args, gpu: GPU | None = None, out=None, err=None) -> dict:
    out, err = out or sys.stdout, err or sys.stderr
    run, start = setup(args, gpu)
    cfg, model, data = run.cfg, run.model, run.data
    steps = args.steps
    if steps <= start:
        raise TrainingStopped(f"the checkpoint is already at step {start}; ask for more --steps than that", 2)
    out_path = Path(args.out)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    log = open(args.log, "a") if args.log else None
    B, T = model.B, model.T
    vx, vy = data.val_windows(args.eval_windows)
    print(f"tinygpt: {cfg.layers} layers, d_model {cfg.d_model}, {cfg.heads} heads, ctx {cfg.ctx}, batch {B}, "
          f"vocab {cfg.vocab} ({n_params(cfg):,} parameters), attention {args.attention} on {model.gpu.name} "
          f"({model.gpu.backend})", file=err)
    print(f"data: {data.name}: {len(data.tokens):,} tokens ({len(data.train):,} train, {len(data.val):,} val)", file=err)
    from tqdm import tqdm
    bar = tqdm(total=steps, initial=start, file=err, unit="step", dynamic_ncols=True, disable=args.quiet,
               mininterval=0.1 if getattr(err, "isatty", lambda: False)() else 5.0)
    t_last, tok_s, step = time.time(), 0.0, start
    last = {"train": None, "val": None}
    stop = StopFlag()
    try:
        n_since = 0
        for step in range(start, steps):
            if stop.requested:
                break
            lr = lr_at(step, cfg.lr, args.warmup, args.min_lr, steps)
            x, y = data.sample(run.rng, B)
            model.step(x, y, lr)
            n_since += 1
            done = step + 1
            is_last = done == steps
            want_eval = args.eval_every and (done % args.eval_every == 0 or is_last)
            if done % args.log_every == 0 or is_last or want_eval:
                loss = model.loss()
                now = time.time()
                tok_s = n_since * B * T / max(now - t_last, 1e-9)
                t_last, n_since = now, 0
                norm = model.grad_norm()
                if not (math.isfinite(loss) and math.isfinite(norm)):
                    what = f"the loss became {loss}" if not math.isfinite(loss) else f"the gradient norm became {norm}"
                    raise TrainingStopped(f"{what} at step {done}; lower --lr (it is {lr:g}) or --grad-clip; "
                                          f"the last good checkpoint, if any, is kept at {out_path}", 3)
                rec = {"step": done, "train": loss, "lr": lr, "tokens_per_s": round(tok_s, 1)}
                if want_eval:
                    rec["val"] = model.mean_loss(vx, vy)
                    last["val"] = rec["val"]
                last["train"] = loss
                run.history.append({k: rec[k] for k in ("step", "train", "val") if k in rec})
                if log:
                    log.write(json.dumps({"step": done, "train_loss": loss, "val_loss": rec.get("val"), "lr": lr,
                                          "tokens_per_s": rec["tokens_per_s"]}) + "\n")
                    log.flush()
                bar.set_postfix_str(f"loss {loss:.4f}" + (f" val {rec['val']:.4f}" if "val" in rec else "")
                                    + f" {tok_s:,.0f} tok/s")
            bar.update(1)
            if args.save_every and done % args.save_every == 0 and not is_last:
                try:
                    save_run(run, out_path)
                except OSError as e:  # keep training: the state is in memory, the last good file on disk
                    print(f"\nwarning: could not save {out_path} at step {done} ({e.strerror or e}); the previous "
                          "checkpoint is intact, training goes on and saving is tried again", file=err)
        if stop.requested:
            bar.close()
            print(f"\ninterrupted at step {model.step_count}: saving {out_path}", file=err)
            save_final(run, out_path)
            print(f"saved; continue with: tinygpt train --resume {out_path} --steps {steps}", file=err)
            raise TrainingStopped("interrupted", 130)
    finally:
        stop.restore()
        bar.close()
        if log:
            log.close()
    save_final(run, out_path)
    png = plot_losses(run.history, out_path.with_suffix(".png"))
    sample_text = generate(model.gpu, cfg, model.get_params(), run.tokenizer, "The ", 120, 0.0, None, 0)
    summary = {"final_train_loss": last["train"], "final_val_loss": last["val"], "tokens_per_s": tok_s,
               "checkpoint": str(out_path), "plot": str(png) if png else None, "steps": steps}
    val = f"{last['val']:.4f}" if last["val"] is not None else "not evaluated (--eval-every 0)"
    print(f"final train loss {last['train']:.4f}, val loss {val}, {tok_s:,.0f} tokens/s", file=out)
    print(f"checkpoint {out_path}" + (f", loss curve {png}" if png else ""), file=out)
    print("greedy sample:\n" + sample_text, file=out)
    return summary


def profile(args, warmup: int = 3) -> str:
    """`tinygpt train --profile`: a few steps, then the per-kernel table of one step."""
    from .profile import format_profile, profile_step
    run, _ = setup(args)
    model = run.model
    if "timestamp-query" not in model.gpu.features:
        raise TrainingStopped(f"{model.gpu.name} offers no timestamp queries, so per-kernel GPU time cannot be read", 1)
    for _ in range(warmup):
        model.step(*run.data.sample(run.rng, model.B), run.cfg.lr)
    rows, total = profile_step(model, *run.data.sample(run.rng, model.B), run.cfg.lr)
    cfg = run.cfg
    head = (f"# one training step: {cfg.layers} layers, d_model {cfg.d_model}, ctx {cfg.ctx}, batch {model.B}, "
            f"attention {args.attention}, on {model.gpu.name} ({model.gpu.backend}); GPU ms per kernel "
            f"(timestamp queries, median of 5 steps after {warmup} warm-up steps)")
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
    tmp = path.with_name(path.name + ".tmp.png")
    fig.savefig(tmp, dpi=100)
    plt.close(fig)
    tmp.replace(path)
    return path


# ---- evaluation and sampling --------------------------------------------------------------------
def evaluate(gpu: GPU, ck: ckpt.Checkpoint, data_path, max_windows=None, attention="online",
             tokenizer_file=None) -> dict:
    cfg = ck.cfg
    tok = get_tokenizer(ck.extra.get("tokenizer", "byte" if cfg.vocab == 256 else "gpt2"), tokenizer_file)
    raw, _ = read_corpus(data_path if data_path else ck.extra.get("data"))
    data = Dataset(tok.encode(raw), cfg.ctx)
    xs, ys = data.val_windows(max_windows)
    model = Model(gpu, cfg, attention, B=min(cfg.batch, len(xs)), training=False)
    model.set_params(ck.params)
    loss = model.mean_loss(xs, ys)
    return {"loss": loss, "perplexity": math.exp(loss), "windows": len(xs), "tokens": len(xs) * cfg.ctx}


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
             top_k: int | None, seed: int, attention="online", model: Model | None = None) -> str:
    """prompt + n generated tokens, decoded. Each token is one forward of a [1, ctx] window on the GPU."""
    if model is None:
        model = Model(gpu, cfg, attention, B=1, training=False)
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
