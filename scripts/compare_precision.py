#!/usr/bin/env python3
"""fp32 against bf16: the same model trained in both precisions from the same init, on the same
batches, with the preset's schedule; the training loss every --log-every steps, then the loss
over the whole validation split, and each run's tokens/s. Prints (or --json: JSON Lines) one
row per run with keys preset, precision, steps, train_loss (mean of the last 10 logged),
val_loss, tokens_per_s, seconds; --plot draws every run's loss curve in one PNG.

    python scripts/compare_precision.py --presets small,medium --steps 500 --data tinyshakespeare.txt --plot p.png
    python scripts/compare_precision.py --presets tiny --steps 10 --json
"""
import argparse
import sys
import time

import numpy as np

from tinygpt.core.config import preset
from tinygpt.core.init import init_params
from tinygpt.core.precision import BF16, PRECISIONS
from tinygpt.data import ByteTokenizer, Dataset, read_corpus
from tinygpt.device.gpu import GPU
from tinygpt.device.planner import make_plan
from tinygpt.model.gpt import Model
from tinygpt.options import TrainOptions
from tinygpt.schedule import resolve
from tinygpt.tables import emit
from tinygpt.outputs import claim_plot, save_png
from tinygpt.cli import positive_int, run_script, seed_int


def run(gpu, plan, cfg, name, precision, batches, xs, ys, log_every):
    sched = resolve(TrainOptions(preset=name, steps=len(batches)))
    sched.total = len(batches)
    m = Model(gpu, plan, cfg, "online", precision=PRECISIONS[precision])
    m.set_params(init_params(cfg))
    curve = []
    m.step(*batches[0], sched.at(0))           # the first step builds the pipelines: not timed
    m.loss()
    t0 = time.perf_counter()
    for i, (x, y) in enumerate(batches[1:], 1):
        m.step(x, y, sched.at(i))
        if i % log_every == 0 or i == len(batches) - 1:
            curve.append((i, m.loss()))
    secs = time.perf_counter() - t0
    ev = Model(gpu, plan, cfg, "online", B=cfg.batch, training=False, precision=PRECISIONS[precision])
    ev.set_params(m.get_params())
    val = ev.mean_loss(xs, ys)
    tokens = (len(batches) - 1) * cfg.batch * cfg.ctx
    return {"preset": name, "precision": precision, "steps": len(batches),
            "train_loss": float(np.mean([l for _, l in curve[-10:]])), "val_loss": val,
            "tokens_per_s": tokens / secs, "seconds": secs, "curve": curve}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--presets", default="small")
    ap.add_argument("--steps", type=positive_int, default=500)
    ap.add_argument("--data", help="text file (default: the built-in corpus)")
    ap.add_argument("--log-every", type=positive_int, default=10)
    ap.add_argument("--seed", type=seed_int, help="init and batch seed (default: the preset's, 1337)")
    ap.add_argument("--plot", help="write the loss curves to this PNG")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    claim_plot(args.plot, inputs={"data": args.data})   # before any work, as the CLI claims its outputs
    gpu = GPU()
    plan = make_plan(gpu)
    raw, data_name = read_corpus(args.data)
    rows = []
    for name in args.presets.split(","):
        cfg = preset(name, seed=args.seed).validate()
        why = BF16.problem(cfg.d_model, cfg.d_mlp)
        if why:
            raise SystemExit("error: " + why.replace("{opt:precision}", "--precision").replace("{opt:d_model}", "--d-model"))
        ds = Dataset(ByteTokenizer().encode(raw), cfg.ctx)
        rng = np.random.default_rng(cfg.seed)
        batches = [ds.sample(rng, cfg.batch) for _ in range(args.steps)]
        xs, ys = ds.val_windows()
        for precision in ("fp32", "bf16"):
            r = run(gpu, plan, cfg, name, precision, batches, xs, ys, args.log_every)
            rows.append(r)
            print(f"{name} {precision}: train {r['train_loss']:.4f}, val {r['val_loss']:.4f}, "
                  f"{r['tokens_per_s']:,.0f} tokens/s", file=sys.stderr)
        a, b = rows[-2], rows[-1]
        gap = np.abs(np.array([l for _, l in a["curve"]]) - np.array([l for _, l in b["curve"]]))
        b["mean_gap"], b["max_gap"] = float(gap.mean()), float(gap.max())
        b["speed_vs_fp32"] = b["tokens_per_s"] / a["tokens_per_s"]
    if args.plot:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(7, 4))
        for r in rows:
            st, ls = zip(*r["curve"])
            ax.plot(st, ls, "-" if r["precision"] == "fp32" else "--", lw=1,
                    label=f"{r['preset']} {r['precision']} (val {r['val_loss']:.3f})")
        ax.set_xlabel("step")
        ax.set_ylabel("training loss (nats/token)")
        ax.set_title(f"fp32 and bf16 from the same init and batches, on {data_name}", fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        save_png(fig, args.plot)
        print(f"wrote {args.plot}", file=sys.stderr)
    for r in rows:
        r.pop("curve") if not args.json else None
    if not args.json:
        print(f"# {gpu.name} ({gpu.backend}); {args.steps} steps, each preset's batch, ctx and schedule; {data_name}")
    emit(rows, args.json, ["preset", "precision", "steps", "train_loss", "val_loss", "tokens_per_s",
                           "speed_vs_fp32", "mean_gap", "max_gap"])


if __name__ == "__main__":
    run_script("compare_precision", main)
