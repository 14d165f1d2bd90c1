#!/usr/bin/env python3
"""Sampling speed: tokens per second with the key/value cache and with the whole window's forward
per token, same model (the preset's initial weights), same prompt, same seed; both paths must
produce the same tokens, which the script checks before it reports.

    python scripts/bench_sample.py --presets small,mega --tokens 256
    python scripts/bench_sample.py --presets tiny --tokens 20 --json

JSON Lines keys: preset, cache, tokens, tokens_per_s (and seconds, num_samples, same_text).
"""
import argparse
import sys
import time

from tinygpt.commands.tables import emit
from tinygpt.commands.argtypes import nonneg_float, positive_int, seed_int
from tinygpt.commands.cli import run_script
from tinygpt.commands.settings import add_setting
from tinygpt.core.config import PRESETS, preset
from tinygpt.model.decode import Decoder
from tinygpt.device.gpu import GPU
from tinygpt.device.planner import make_plan
from tinygpt.core.init import init_params
from tinygpt.model.spec import decoder_spec


def run(gpu, cfg, params, cache, n, num, plan, temperature, seed):
    d = Decoder(gpu, plan.with_(decode="cache" if cache else "full"), decoder_spec(cfg, "online", num), capacity=n)
    d.set_params(params)
    d.generate([10], 2, temperature, 40, 1.0, seed)          # pipelines built, caches warm
    t = time.perf_counter()
    seqs = d.generate([10], n, temperature, 40, 1.0, seed)
    gpu.sync()
    return time.perf_counter() - t, seqs


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--presets", default="small,mega")
    ap.add_argument("--tokens", type=positive_int, default=256)
    ap.add_argument("--num-samples", type=positive_int, default=1)
    ap.add_argument("--temperature", type=nonneg_float, default=0.8)
    ap.add_argument("--seed", type=seed_int, default=0)
    ap.add_argument("--json", action="store_true")
    add_setting(ap, "kernels")
    args = ap.parse_args(argv)
    gpu = GPU()
    plan = make_plan(gpu, args.kernels)
    rows = []
    for name in args.presets.split(","):
        if name not in PRESETS:
            ap.error(f"unknown preset {name!r}; choose from {', '.join(PRESETS)}")
        cfg = preset(name).validate()
        params = init_params(cfg)
        out = {}
        for cache in (True, False):
            secs, out[cache] = run(gpu, cfg, params, cache, args.tokens, args.num_samples, plan,
                                   args.temperature, args.seed)
            tokens = args.tokens * args.num_samples
            rows.append({"preset": name, "cache": cache, "tokens": tokens, "tokens_per_s": tokens / secs,
                         "seconds": secs, "num_samples": args.num_samples})
            print(f"{name} cache={cache}: {tokens / secs:,.1f} tokens/s ({secs:.2f} s)", file=sys.stderr)
        same = out[True] == out[False]
        for r in rows[-2:]:
            r["same_text"] = same
            r["speedup"] = rows[-1]["seconds"] / r["seconds"]
        if not same:
            print(f"{name}: the cached and the full-window paths drew different tokens", file=sys.stderr)
    if not args.json:
        print(f"# {gpu.name} ({gpu.backend}); {args.tokens} tokens x {args.num_samples} from a 1-token prompt, "
              f"temperature {args.temperature}, top-k 40, initial weights; ctx per preset")
    emit(rows, args.json, ["preset", "cache", "tokens", "tokens_per_s", "seconds", "speedup", "same_text"])
    return 0 if all(r["same_text"] for r in rows) else 1


if __name__ == "__main__":
    run_script("bench_sample", main)
