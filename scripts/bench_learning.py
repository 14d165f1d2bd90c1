#!/usr/bin/env python3
"""Learning, not just speed: the same model trained by this WebGPU trainer (with each optimizer of
--optimizers) and by PyTorch on the CPU (AdamW), from the same init, on the same batches; all
evaluated on the same validation windows every --eval-every steps. Each optimizer runs its own
default schedule (model.optimizers.schedule; --lr overrides every peak). Prints (or --json: JSON Lines) one row per
evaluation with keys trainer, step, seconds, val_loss, and plots val loss against steps and
against training seconds (evaluation time left out) in one PNG.

    python scripts/bench_learning.py --data tinyshakespeare.txt --plot learning.png
    python scripts/bench_learning.py --preset tiny --steps 20 --eval-every 10 --json
    python scripts/bench_learning.py --data tinyshakespeare.txt --trainers webgpu \
        --optimizers adamw,lion,muon --plot optimizers.png

PyTorch is optional (pip install torch); without it only the WebGPU trainer runs. The dashed
line is nanoGPT's own figure for its CPU recipe on Tiny Shakespeare (val 1.88 in about 3 min on
a laptop CPU, from its README), a reference we did not measure.
"""
import argparse
import importlib.util
import sys
import time

import numpy as np

from tinygpt.commands.tables import emit
from tinygpt.files.tokenfile import data_files
from tinygpt.files.outputs import claim_plot, save_png
from tinygpt.commands.argtypes import nonneg_int, positive_float, positive_int
from tinygpt.commands.cli import run_script
from tinygpt.commands.settings import add_setting
from tinygpt.core.config import TRAIN_DEFAULTS, preset
from tinygpt.core.errors import UsageError
from tinygpt.model.optimizers import NAMES as OPT_NAMES
from tinygpt.model.optimizers import make_settings
from tinygpt.files.data import Dataset, read_corpus
from tinygpt.tokenizers import ByteTokenizer
from tinygpt.device.gpu import GPU
from tinygpt.model.gpt import Model
from tinygpt.run.options import TrainOptions
from tinygpt.device.planner import make_plan
from tinygpt.core.init import init_params
from tinygpt.run.schedule import resolve
from tinygpt.model.spec import RunSpec

NANOGPT_CPU = (1.88, 180.0)   # nanoGPT README: val 1.88 after ~3 minutes on a CPU (reported, not measured here)


def eval_windows(ds: Dataset, n: int):
    """n windows spread evenly over the whole validation split (all of them if n is 0)."""
    xs, ys = ds.val_windows()
    if n and n < len(xs):
        idx = np.linspace(0, len(xs) - 1, n).round().astype(int)
        xs, ys = xs[idx], ys[idx]
    return xs, ys


class WebGPUTrainer:
    name = "webgpu"

    def __init__(self, cfg, params, kernels, optimizer="adamw"):
        gpu = GPU()
        settings = make_settings(optimizer)
        self.m = Model(gpu, make_plan(gpu, kernels), RunSpec(cfg, "online", optimizer=settings))
        self.m.set_params(params)
        self.name = "webgpu" if optimizer == "adamw" else f"webgpu {optimizer}"
        self.what = f"{gpu.name} ({gpu.backend}), {settings.describe()}"

    def step(self, x, y, lr):
        self.m.step(x, y, lr)

    def sync(self):
        self.m.loss()           # a readback waits for every submitted step

    def val(self, xs, ys):
        return self.m.mean_loss(xs, ys)


class TorchTrainer:
    name = "torch"

    def __init__(self, cfg, params, kernels, optimizer="adamw"):
        import torch
        from torch_model import TorchGPT
        self.torch, self.m, self.B = torch, TorchGPT(cfg, params, 1e-3), cfg.batch
        self.what = f"PyTorch {torch.__version__} CPU, {torch.get_num_threads()} threads"

    def step(self, x, y, lr):
        self.m.step(x, y, lr)

    def sync(self):
        pass

    def val(self, xs, ys):
        import torch.nn.functional as F
        total = 0.0
        with self.torch.no_grad():
            for i in range(0, len(xs), self.B):
                logits = self.m.forward(self.torch.as_tensor(xs[i:i + self.B].astype(np.int64)))
                y = self.torch.as_tensor(ys[i:i + self.B].astype(np.int64))
                total += float(F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1), reduction="sum"))
        return total / ys.size


def run(trainer, batches, sched, xs, ys, every):
    """Rows (trainer, step, seconds, val_loss): seconds of training only, evaluation excluded."""
    rows, spent = [], 0.0
    rows.append({"trainer": trainer.name, "step": 0, "seconds": 0.0, "val_loss": trainer.val(xs, ys)})
    t = time.perf_counter()
    for step, (x, y) in enumerate(batches, 1):
        trainer.step(x, y, sched.at(step - 1))
        if step % every == 0 or step == len(batches):
            trainer.sync()
            spent += time.perf_counter() - t
            rows.append({"trainer": trainer.name, "step": step, "seconds": round(spent, 3),
                         "val_loss": trainer.val(xs, ys)})
            print(f"{trainer.name}: step {step}, {spent:.1f} s, val {rows[-1]['val_loss']:.4f}", file=sys.stderr)
            t = time.perf_counter()
    return rows


def plot(rows, path, title):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for name in dict.fromkeys(r["trainer"] for r in rows):
        pts = [r for r in rows if r["trainer"] == name]
        axes[0].plot([r["step"] for r in pts], [r["val_loss"] for r in pts], "o-", ms=3, label=name)
        axes[1].plot([r["seconds"] for r in pts], [r["val_loss"] for r in pts], "o-", ms=3, label=name)
    val, secs = NANOGPT_CPU
    for ax in axes:
        ax.axhline(val, color="gray", ls="--", lw=1, label=f"nanoGPT CPU recipe, reported: {val}")
        ax.set_ylabel("validation loss (nats/token)")
        ax.grid(alpha=0.3)
        ax.set_ylim(top=min(ax.get_ylim()[1], 3.5))
    axes[1].plot([secs], [val], "x", color="gray")
    axes[0].set_xlabel("step")
    axes[1].set_xlabel("training seconds (evaluation excluded)")
    axes[0].legend()
    import textwrap
    fig.suptitle("\n".join(textwrap.fill(line, 150) for line in title.split("\n")), fontsize=9)
    fig.tight_layout()
    save_png(fig, path)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="small")
    ap.add_argument("--data", help="text file (default: the built-in corpus)")
    ap.add_argument("--steps", type=positive_int, help="default: the preset's")
    ap.add_argument("--eval-every", type=nonneg_int, default=100)
    ap.add_argument("--eval-windows", type=nonneg_int, default=256, help="spread over the validation split; 0 = all")
    ap.add_argument("--trainers", default="webgpu,torch")
    ap.add_argument("--optimizers", default="adamw",
                    help=f"the WebGPU trainer's, comma-separated: {', '.join(OPT_NAMES)}")
    ap.add_argument("--lr", type=positive_float, help="every run's peak learning rate (default: each optimizer's)")
    ap.add_argument("--plot", help="write the two-panel PNG here")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--replot", metavar="FILE.jsonl", help="only draw --plot from the rows a --json run printed")
    add_setting(ap, "kernels")
    args = ap.parse_args(argv)
    # before any work, as the CLI claims its outputs
    claim_plot(args.plot, inputs={"data": data_files(args.data), "replot": args.replot})
    if args.replot:
        import json
        from pathlib import Path
        rows = [json.loads(line) for line in Path(args.replot).read_text().splitlines() if line.strip()]
        plot(rows, args.plot, f"{args.replot}: the rows of an earlier run")
        return
    cfg = preset(args.preset).validate()
    opts = args.optimizers.split(",")
    unknown = [o for o in opts if o not in OPT_NAMES]
    if unknown:
        raise UsageError(f"--optimizers takes {', '.join(OPT_NAMES)}; got {','.join(unknown)}")
    total = args.steps or TRAIN_DEFAULTS[args.preset].steps
    scheds = {o: resolve(TrainOptions(preset=args.preset, optimizer=o, lr=args.lr)) for o in opts}
    for s in scheds.values():
        s.total = total
    raw, name = read_corpus(args.data)
    ds = Dataset(ByteTokenizer().encode(raw), cfg.ctx, name)
    rng = np.random.default_rng([cfg.seed, 1])            # tinygpt train's sampling stream
    batches = [ds.sample(rng, cfg.batch) for _ in range(total)]
    xs, ys = eval_windows(ds, args.eval_windows)
    params = init_params(cfg)
    kinds = {"webgpu": WebGPUTrainer, "torch": TorchTrainer}
    rows, whats = [], []
    for tname in args.trainers.split(","):
        if tname == "torch" and importlib.util.find_spec("torch") is None:
            print("torch is not importable: its rows are skipped (pip install torch)", file=sys.stderr)
            continue
        for o in opts if tname == "webgpu" else ["adamw"]:
            trainer = kinds[tname](cfg, params, args.kernels, o)
            whats.append(f"{trainer.name}: {trainer.what}, {scheds.get(o, scheds[opts[0]]).describe()}")
            rows += run(trainer, batches, scheds.get(o, scheds[opts[0]]), xs, ys, args.eval_every)
    title = (f"preset {args.preset} on {name}: {total} steps of batch {cfg.batch} x ctx {cfg.ctx}; "
             f"val over {len(xs)} windows\n" + "; ".join(whats))
    if not args.json:
        print("# " + title.replace("\n", "\n# "))
    emit(rows, args.json, ["trainer", "step", "seconds", "val_loss"])
    if args.plot:
        plot(rows, args.plot, title)


if __name__ == "__main__":
    run_script("bench_learning", main)
