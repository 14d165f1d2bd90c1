#!/usr/bin/env python3
"""fp32 against bf16 and f16: the same model trained in each precision from the same init, on the
same batches, with the preset's schedule; the training loss every --log-every steps, then the loss
over the whole validation split, and each run's tokens/s. Prints (or --json: JSON Lines) one
row per run with keys preset, seed, precision, steps, train_loss (mean of the last 10 logged),
val_loss, val_vs_fp32 (its ratio to the fp32 run's of the same preset and seed), tokens_per_s,
seconds, and f16's loss scale and skipped steps at the end; --plot draws every run's loss curve.

    python scripts/compare_precision.py --presets small,medium --steps 500 --data tinyshakespeare.txt --plot p.png
    python scripts/compare_precision.py --presets small --precisions fp32,f16 --seeds 1,2,3 --steps 500
    python scripts/compare_precision.py --presets tiny --steps 10 --json
    python scripts/compare_precision.py --presets small --steps 300 --precisions fp32,bf16,f16 --optimizer muon

--optimizer NAME (one of tinygpt's optimizers) trains every run with it (its default schedule for the preset).
"""
import argparse
import sys
import time

import numpy as np

from tinygpt.core.config import preset
from tinygpt.core.init import init_params
from tinygpt.model.optimizers import NAMES as OPT_NAMES
from tinygpt.model.optimizers import make_settings
from tinygpt.core.precision import PRECISIONS
from tinygpt.files.data import Dataset, read_corpus
from tinygpt.tokenizers import ByteTokenizer
from tinygpt.device.gpu import GPU
from tinygpt.device.planner import make_plan
from tinygpt.model.gpt import Model
from tinygpt.run.options import TrainOptions
from tinygpt.run.schedule import resolve
from tinygpt.commands.tables import emit
from tinygpt.files.tokenfile import data_files
from tinygpt.files.outputs import claim_plot, save_png
from tinygpt.commands.argtypes import positive_int, seed_int
from tinygpt.commands.cli import run_script
from tinygpt.model.spec import RunSpec


def run(gpu, plan, cfg, name, precision, batches, xs, ys, log_every, optimizer="adamw"):
    sched = resolve(TrainOptions(preset=name, steps=len(batches), optimizer=optimizer))
    sched.total = len(batches)
    m = Model(gpu, plan, RunSpec(cfg, "online", precision=PRECISIONS[precision], optimizer=make_settings(optimizer)))
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
    scaler = m.gate_state() if m.spec.scaled else None
    ev = Model(gpu, plan, RunSpec(cfg, "online", B=cfg.batch, training=False, precision=PRECISIONS[precision]))
    ev.set_params(m.get_params())
    val = ev.mean_loss(xs, ys)
    tokens = (len(batches) - 1) * cfg.batch * cfg.ctx
    row = {"preset": name, "seed": cfg.seed, "optimizer": optimizer, "precision": precision, "steps": len(batches),
           "train_loss": float(np.mean([l for _, l in curve[-10:]])), "val_loss": val,
           "tokens_per_s": tokens / secs, "seconds": secs, "curve": curve}
    if scaler:
        row.update(loss_scale=scaler["scale"], skipped_steps=int(scaler["skipped"]))
    return row


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--presets", default="small")
    ap.add_argument("--steps", type=positive_int, default=500)
    ap.add_argument("--data", help="text file (default: the built-in corpus)")
    ap.add_argument("--log-every", type=positive_int, default=10)
    ap.add_argument("--seeds", default="", help="init and batch seeds, comma-separated (default: the preset's, 1337)")
    ap.add_argument("--precisions", default="fp32,bf16", help="comma-separated, fp32 first (default fp32,bf16)")
    ap.add_argument("--optimizer", default="adamw", choices=list(OPT_NAMES))
    ap.add_argument("--plot", help="write the loss curves to this PNG")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    precisions = [p.strip() for p in args.precisions.split(",") if p.strip()]
    if not precisions or precisions[0] != "fp32" or not set(precisions) <= set(PRECISIONS) \
            or len(set(precisions)) < len(precisions):
        raise SystemExit(f"error: --precisions takes fp32 first, then any of {', '.join(PRECISIONS)}, "
                         f"got {args.precisions!r}")
    try:
        seeds = [seed_int(x) for x in args.seeds.split(",") if x.strip()] or [None]
    except Exception as e:
        raise SystemExit(f"error: --seeds takes whole numbers below 2**63, comma-separated ({e})")
    if len(seeds) > 10:
        raise SystemExit("error: --seeds takes at most 10 seeds")
    claim_plot(args.plot, inputs={"data": data_files(args.data)})   # before any work, as the CLI claims its outputs
    gpu = GPU()
    plan = make_plan(gpu)
    raw, data_name = read_corpus(args.data)
    rows = []
    for name in args.presets.split(","):
        for seed in seeds:
            cfg = preset(name, seed=seed).validate()
            for p in precisions:
                why = PRECISIONS[p].problem(cfg.d_model, cfg.d_mlp)
                if why:
                    raise SystemExit("error: " + why.replace("{opt:precision}", "--precision")
                                     .replace("{opt:d_model}", "--d-model"))
            ds = Dataset(ByteTokenizer().encode(raw), cfg.ctx)
            rng = np.random.default_rng(cfg.seed)
            batches = [ds.sample(rng, cfg.batch) for _ in range(args.steps)]
            xs, ys = ds.val_windows()
            base = None
            for precision in precisions:
                r = run(gpu, plan, cfg, name, precision, batches, xs, ys, args.log_every, args.optimizer)
                rows.append(r)
                print(f"{name} seed {cfg.seed} {precision}: train {r['train_loss']:.4f}, val {r['val_loss']:.4f}, "
                      f"{r['tokens_per_s']:,.0f} tokens/s", file=sys.stderr)
                if base is None:
                    base = r
                    continue
                gap = np.abs(np.array([l for _, l in base["curve"]]) - np.array([l for _, l in r["curve"]]))
                r["mean_gap"], r["max_gap"] = float(gap.mean()), float(gap.max())
                r["speed_vs_fp32"] = r["tokens_per_s"] / base["tokens_per_s"]
                r["val_vs_fp32"] = r["val_loss"] / base["val_loss"]
    if args.plot:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(7, 4))
        for r in rows:
            st, ls = zip(*r["curve"])
            ax.plot(st, ls, "-" if r["precision"] == "fp32" else "--", lw=1,
                    label=f"{r['preset']} seed {r['seed']} {r['precision']} (val {r['val_loss']:.3f})")
        ax.set_xlabel("step")
        ax.set_ylabel("training loss (nats/token)")
        ax.set_title(f"{', '.join(precisions)} from the same init and batches, on {data_name}", fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        save_png(fig, args.plot)
        print(f"wrote {args.plot}", file=sys.stderr)
    for r in rows:
        r.pop("curve") if not args.json else None
    if not args.json:
        print(f"# {gpu.name} ({gpu.backend}); {args.steps} steps, each preset's batch, ctx and schedule; {data_name}")
    emit(rows, args.json, ["preset", "seed", "optimizer", "precision", "steps", "train_loss", "val_loss", "val_vs_fp32",
                           "tokens_per_s", "speed_vs_fp32", "mean_gap", "max_gap", "loss_scale", "skipped_steps"])


if __name__ == "__main__":
    run_script("compare_precision", main)
