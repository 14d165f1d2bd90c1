#!/usr/bin/env python3
"""Sweep training settings: each spec trains from the same init on the same batches (the seed's),
then scores the whole validation split as `tinygpt eval` does. How the defaults of
core.config.TRAIN_DEFAULTS were chosen (docs/results.md, "How the defaults were chosen").

    python scripts/sweep_schedule.py --data tinyshakespeare.txt \\
        "steps=2000,lr=1e-2,warmup=200,min_lr=1e-4" "steps=2000,lr=3e-4,schedule=constant" \\
        "preset=medium,steps=1000,lr=5e-3" "steps=4000,batch=8,lr=3e-3,warmup=100"

A spec is comma-separated TrainOptions fields (preset, steps, lr, warmup, min_lr, schedule, batch,
ctx, grad_clip, grad_accum, ...). Prints one row per spec (--json: JSON Lines with keys spec,
steps, seconds, train_loss, val_loss, val_bits); seconds are wall time of the training alone.
"""
import argparse
import io
import sys
import tempfile
import time
from dataclasses import fields
from pathlib import Path

from tinygpt.commands.tables import emit
from tinygpt.device.gpu import GPU
from tinygpt.run.infer import bits, evaluate
from tinygpt.run.options import EvalOptions, TrainOptions
from tinygpt.run.train import train
from tinygpt.commands.cli import run_script


def options(spec: str, data: str | None, out: str) -> TrainOptions:
    types = {f.name: f.type for f in fields(TrainOptions)}
    kw = {}
    for part in filter(None, spec.split(",")):
        key, _, value = part.partition("=")
        if key not in types:
            raise SystemExit(f"sweep_schedule: unknown field {key!r} in {spec!r}")
        t = str(types[key])
        kw[key] = int(value) if "int" in t else float(value) if "float" in t else value
    return TrainOptions(**{"data": data, "eval_every": 0, "save_every": 0, "sample_tokens": 0, "quiet": True,
                           "out": out, "force": True, **kw})


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("specs", nargs="+")
    ap.add_argument("--data", help="text file (default: the built-in corpus)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    gpu = GPU()
    rows = []
    with tempfile.TemporaryDirectory() as d:
        out = str(Path(d) / "sweep.tinygpt")
        for spec in args.specs:
            o = options(spec, args.data, out)
            t = time.perf_counter()
            s = train(o, gpu, out=io.StringIO(), err=io.StringIO())
            secs = time.perf_counter() - t
            r = evaluate(EvalOptions(model=out, data=args.data), gpu)
            rows.append({"spec": spec, "steps": s["steps"], "seconds": round(secs, 1),
                         "train_loss": s["final_train_loss"], "val_loss": r["loss"], "val_bits": bits(r["loss"])})
            print(f"{spec}: val {r['loss']:.4f} over {r['windows']} windows ({secs:.0f} s)", file=sys.stderr)
    emit(rows, args.json, ["spec", "steps", "seconds", "train_loss", "val_loss", "val_bits"])


if __name__ == "__main__":
    run_script("sweep_schedule", main)
