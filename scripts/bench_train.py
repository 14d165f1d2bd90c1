#!/usr/bin/env python3
"""Training throughput: the WebGPU trainer, a trainer on the NumPy reference
(float32), and the same model in PyTorch on the CPU when torch is importable.

Same shapes, same batch, same init, same batches: tokens/s and the loss after
the same steps, to show they train alike.

    python scripts/bench_train.py --preset small --steps 20
    python scripts/bench_train.py --preset tiny --steps 5 --json
    python scripts/bench_train.py --preset gpt2 --steps 3 --trainers webgpu,torch

Token ids come from the corpus's bytes whatever the preset's vocabulary (gpt2's is 50257): a
step's time does not depend on which ids it sees.

--precision fp32,bf16,f16 --interleave builds one model each on one device and alternates their steps,
each timed to its loss: on a machine whose speed drifts, every round of steps shares one moment.
tokens_per_s then comes from the median step, and over_fp32 is the median of the rounds' ratios.
--blocks with --interleave does the same for the blocks, each against GPT-2's step of the same round.

    python scripts/bench_train.py --preset small --steps 60 --trainers webgpu --precision fp32,bf16,f16 --interleave
    python scripts/bench_train.py --preset small --steps 60 --trainers webgpu --blocks gpt2,nanochat,llama --interleave

--lora R adds a row per precision for a LoRA step (adapters of rank R on --lora-targets, the base
frozen: no weight gradients, two small matmuls a target) beside the full step, with its speed-up
over the full step (lora_over_full); --rounds interleaves the two.

    python scripts/bench_train.py --preset medium --steps 30 --trainers webgpu --lora 8 --rounds 3

--optimizers adamw,lion,muon adds a WebGPU row per optimizer (webgpu-lion, webgpu-muon) with its
tokens/s over AdamW's step (over_adamw); --rounds interleaves them.

    python scripts/bench_train.py --preset small --steps 40 --trainers webgpu --optimizers adamw,lion,muon --rounds 3

--blocks gpt2,nanochat,llama adds a WebGPU row per block (core.block's BLOCKS: webgpu-nanochat,
webgpu-llama), and with the torch trainer a PyTorch row (torch-nanochat, ...), of the preset's shape,
with its parameter count and its tokens/s over GPT-2's block (over_gpt2); --rounds interleaves them.

    python scripts/bench_train.py --preset small --steps 40 --trainers webgpu --blocks gpt2,nanochat,llama --rounds 3
"""
import argparse
import sys
import time

import numpy as np

from tinygpt.commands.argtypes import lora_targets, positive_float, positive_int
from tinygpt.commands.cli import run_script
from tinygpt.commands.settings import add_setting
from tinygpt.core.block import BLOCKS
from tinygpt.core.config import n_params, preset
from tinygpt.core.init import init_params
from tinygpt.core.lora import init_adapters, make_lora
from tinygpt.model.optimizers import NAMES as OPT_NAMES
from tinygpt.model.optimizers import make_settings
from tinygpt.core.precision import PRECISIONS
from tinygpt.files.data import Dataset, read_corpus
from tinygpt.tokenizers import ByteTokenizer
from tinygpt.device.gpu import GPU
from tinygpt.device.planner import make_plan
from tinygpt.model.gpt import Model
from tinygpt.reference import gpt as RG
from tinygpt.commands.tables import emit
from tinygpt.model.spec import RunSpec


def batches(cfg, steps, data_path, seed):
    raw, _ = read_corpus(data_path)
    ds = Dataset(ByteTokenizer().encode(raw), cfg.ctx)
    rng = np.random.default_rng(seed)
    return [ds.sample(rng, cfg.batch) for _ in range(steps)]


def run_webgpu(cfg, params, data, lr, attention, kernels=None, precision="fp32", lora=None, optimizer="adamw"):
    gpu = GPU()
    m = Model(gpu, make_plan(gpu, kernels), RunSpec(cfg, attention, precision=PRECISIONS[precision], lora=lora,
                                                    optimizer=make_settings(optimizer)))
    m.set_params({**params, **init_adapters(cfg, lora)} if lora else params)
    m.step(*data[0], lr)
    m.loss()                        # the first step pays for first use (lavapipe compiles a pipeline then)
    t0 = time.perf_counter()
    for x, y in data[1:]:
        m.step(x, y, lr)
    loss = m.loss()  # waits for the GPU
    secs = (time.perf_counter() - t0) * len(data) / max(1, len(data) - 1)   # every step at the others' pace
    lo = f", LoRA rank {lora.rank} on {','.join(lora.as_dict()['targets'])}" if lora else ""
    return secs, loss, (f"{gpu.name} ({gpu.backend}), attention {attention}, {precision}{lo}, {optimizer}, kernels "
                        f"{m.plan.describe()}, timed after the first step")


def run_interleaved(runs, lr, attention, kernels, data):
    """One model per run on one device, their steps alternated; runs: {key: (cfg, params, precision)}
    -> {key: (step seconds, final loss, what)}."""
    gpu = GPU()
    plan = make_plan(gpu, kernels)
    models = {k: Model(gpu, plan, RunSpec(c, attention, precision=PRECISIONS[p])) for k, (c, _, p) in runs.items()}
    times = {k: [] for k in runs}
    for k, m in models.items():
        m.set_params(runs[k][1])
    for x, y in data:
        for k, m in models.items():
            gpu.sync()
            t0 = time.perf_counter()
            m.step(x, y, lr)
            m.loss()                            # waits for the GPU
            times[k].append(time.perf_counter() - t0)
    what = f"{gpu.name} ({gpu.backend}), attention {attention}, kernels {plan.describe()}, steps interleaved"
    return {k: (np.array(times[k]), models[k].loss(), what) for k in runs}


def run_numpy(cfg, params, data, lr):
    p = {k: v.copy() for k, v in params.items()}
    opt = RG.new_opt_state(p, make_settings("adamw"))
    t0 = time.perf_counter()
    for x, y in data:
        _, loss, cache = RG.forward(p, cfg, x, y)
        RG.clip_and_step(p, RG.backward(p, cfg, cache), opt, cfg, lr, make_settings("adamw"))
    return time.perf_counter() - t0, float(loss), "NumPy reference, float32"


def run_torch(cfg, params, data, lr):
    import torch
    from torch_model import TorchGPT
    m = TorchGPT(cfg, params, lr)
    t0 = time.perf_counter()
    for x, y in data:
        loss = m.step(x, y, lr)
    return time.perf_counter() - t0, loss, f"PyTorch {torch.__version__} CPU, {torch.get_num_threads()} threads"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="small")
    ap.add_argument("--steps", type=positive_int, default=20)
    ap.add_argument("--lr", type=positive_float, default=3e-4)
    ap.add_argument("--data", help="text file (default: the built-in corpus)")
    ap.add_argument("--attention", default="online")
    ap.add_argument("--trainers", default="webgpu,numpy,torch")
    ap.add_argument("--precision", default="fp32",
                    help="the WebGPU trainer's: fp32, bf16, f16, or several (fp32,bf16,f16: a row each, with "
                         "each one's ratio to fp32)")
    ap.add_argument("--rounds", type=positive_int, default=1,
                    help="run every trainer this many times, interleaved, and keep each one's fastest: on a "
                         "machine whose speed drifts, trainers compared in one round share its minute")
    ap.add_argument("--interleave", action="store_true",
                    help="with several precisions or blocks: one model each, their steps alternated (see above)")
    ap.add_argument("--lora", type=positive_int, metavar="R", help="also time a LoRA step of rank R (see above)")
    ap.add_argument("--lora-targets", type=lora_targets, default=None, help="q,k,v,o,fc_in,fc_out (default q,k,v,o)")
    ap.add_argument("--optimizers", default="adamw",
                    help=f"the WebGPU trainer's, comma-separated: {', '.join(OPT_NAMES)} (a row each beside AdamW's, "
                         "over_adamw its ratio)")
    ap.add_argument("--blocks", default="gpt2",
                    help=f"the WebGPU trainer's blocks, comma-separated: {', '.join(BLOCKS)} (a row each beside "
                         "GPT-2's, over_gpt2 its ratio)")
    ap.add_argument("--json", action="store_true")
    add_setting(ap, "kernels")
    args = ap.parse_args(argv)
    precisions = [p.strip() for p in args.precision.split(",") if p.strip()]
    if not precisions or not set(precisions) <= set(PRECISIONS) or len(set(precisions)) < len(precisions):
        raise SystemExit(f"error: --precision takes {', '.join(PRECISIONS)} or several of them, got {args.precision!r}")
    opts = [o.strip() for o in args.optimizers.split(",") if o.strip()]
    if not opts or not set(opts) <= set(OPT_NAMES):
        raise SystemExit(f"error: --optimizers takes {', '.join(OPT_NAMES)} or several of them, "
                         f"got {args.optimizers!r}")
    blocks = [b.strip() for b in args.blocks.split(",") if b.strip()]
    if not blocks or not set(blocks) <= set(BLOCKS):
        raise SystemExit(f"error: --blocks takes {', '.join(BLOCKS)} or several of them, got {args.blocks!r}")
    cfg = preset(args.preset).validate()
    params = init_params(cfg)
    block_cfgs = {b: preset(args.preset, **BLOCKS[b]).validate() for b in blocks if b != "gpt2"}
    data = batches(cfg, args.steps, args.data, cfg.seed)
    tokens = args.steps * cfg.batch * cfg.ctx
    runners = {"numpy": lambda: run_numpy(cfg, params, data, args.lr),
               "torch": lambda: run_torch(cfg, params, data, args.lr)}
    lora = make_lora(args.lora, targets=args.lora_targets) if args.lora else None
    for p in precisions:
        runners["webgpu", p] = (lambda p=p: run_webgpu(cfg, params, data, args.lr, args.attention, args.kernels, p))
        runners["webgpu-lora", p] = (lambda p=p: run_webgpu(cfg, params, data, args.lr, args.attention, args.kernels,
                                                            p, lora))
        for o in opts:
            runners[f"webgpu-{o}", p] = (lambda p=p, o=o: run_webgpu(cfg, params, data, args.lr, args.attention,
                                                                     args.kernels, p, optimizer=o))
        for b, bc in block_cfgs.items():
            runners[f"webgpu-{b}", p] = (lambda p=p, bc=bc: run_webgpu(bc, init_params(bc), data, args.lr,
                                                                       args.attention, args.kernels, p))
    for b, bc in block_cfgs.items():         # the PyTorch mirror of each block (torch_model's parts)
        runners[f"torch-{b}"] = (lambda bc=bc: run_torch(bc, init_params(bc), data, args.lr))
    order = []
    for name in args.trainers.split(","):
        if name == "torch":
            import importlib.util
            if importlib.util.find_spec("torch") is None:
                print("torch is not importable: its row is skipped (pip install torch)", file=sys.stderr)
                continue
        order += [(w, p) for p in precisions for w in ("webgpu", "webgpu-lora")[:2 if lora else 1]
                  + tuple(f"webgpu-{o}" for o in opts if o != "adamw")
                  + tuple(f"webgpu-{b}" for b in block_cfgs)] if name == "webgpu" else \
            [name] + ([f"torch-{b}" for b in block_cfgs] if name == "torch" else [])
    best, ratio = {}, {}     # ratio: with --interleave, the median of a row's steps' ratios to fp32's or GPT-2's
    if args.interleave:                      # the webgpu rows from alternated steps; the others below
        if args.rounds > 1 or (len(precisions) > 1) == bool(block_cfgs):
            ap.error("--interleave takes two or more precisions (fp32,bf16,f16) or two or more blocks "
                     "(gpt2,nanochat), not both, and no --rounds")
        if args.steps < 4:
            raise SystemExit("error: --interleave needs --steps 4 or more (the first step of each is left out)")
        runs = {("webgpu", p): (cfg, params, p) for p in precisions}
        runs.update({(f"webgpu-{b}", precisions[0]): (bc, init_params(bc), precisions[0])
                     for b, bc in block_cfgs.items()})
        res = run_interleaved(runs, args.lr, args.attention, args.kernels, data)
        step_tokens = cfg.batch * cfg.ctx
        # against fp32's steps where it runs, else GPT-2's (blocks take one precision); the first step
        # pays for first use
        first = res.get(("webgpu", "fp32"), res["webgpu", precisions[0]])[0][1:]
        for key, (t, loss, what) in res.items():
            t = t[1:]
            bc = runs[key][0]
            best[key] = {"trainer": key[0], "preset": args.preset, "precision": key[1], "steps": args.steps,
                         "params": n_params(bc), "block": bc.block.describe(),
                         "tokens_per_s": step_tokens / float(np.median(t)), "final_loss": loss,
                         "seconds": float(t.sum()), "what": what}
            ratio[key] = float(np.median(first / t))
    for _ in range(max(1, args.rounds)):
        for key in order:
            if key in best and args.interleave:
                continue
            secs, loss, what = runners[key]()
            name, prec = key if isinstance(key, tuple) else (key, "fp32")
            print(f"{name} {prec}: {tokens / secs:,.0f} tokens/s, loss {loss:.4f} ({what})", file=sys.stderr)
            if key not in best or secs < best[key]["seconds"]:
                bc = block_cfgs.get(name.partition("-")[2], cfg)
                best[key] = {"trainer": name, "preset": args.preset, "precision": prec, "steps": args.steps,
                             "params": n_params(bc), "block": bc.block.describe(),
                             "tokens_per_s": tokens / secs, "final_loss": loss, "seconds": secs, "what": what}
    rows = [best[k] for k in order]
    ours = ("webgpu", "webgpu-lora") + tuple(f"webgpu-{o}" for o in opts) + tuple(f"webgpu-{b}" for b in block_cfgs)
    base = {r["trainer"]: r["tokens_per_s"] for r in rows
            if r["precision"] == precisions[0] or r["trainer"] not in ours}
    for r in rows:
        if "webgpu" in base and r["trainer"] not in ours:      # a block's PyTorch row: over WebGPU's of it
            mine = base.get("webgpu-" + r["trainer"].partition("-")[2], base["webgpu"])
            r["webgpu_over_this"] = mine / r["tokens_per_s"]
        if r["trainer"].startswith("webgpu-") and r["trainer"][7:] in OPT_NAMES:
            r["over_adamw"] = r["tokens_per_s"] / best["webgpu", r["precision"]]["tokens_per_s"]
        if r["trainer"][7:] in block_cfgs:
            r["over_gpt2"] = ratio[r["trainer"], r["precision"]] if args.interleave else \
                r["tokens_per_s"] / best["webgpu", r["precision"]]["tokens_per_s"]
        if r["trainer"] == "webgpu-lora":
            r["lora_over_full"] = r["tokens_per_s"] / best["webgpu", r["precision"]]["tokens_per_s"]
        if r["trainer"] == "webgpu" and r["precision"] != "fp32" and ("webgpu", "fp32") in best:
            r["over_fp32"] = ratio["webgpu", r["precision"]] if args.interleave else \
                r["tokens_per_s"] / best["webgpu", "fp32"]["tokens_per_s"]
    if not args.json:
        print(f"# preset {args.preset}, {args.steps} steps of batch {cfg.batch} x ctx {cfg.ctx}, same init and batches"
              + (f"; fastest of {args.rounds} interleaved rounds" if args.rounds > 1 else ""))
    emit(rows, args.json, ["trainer", "preset", "precision", "steps", "params", "tokens_per_s", "final_loss",
                           "over_fp32", "lora_over_full", "over_adamw", "over_gpt2", "webgpu_over_this", "what"])


if __name__ == "__main__":
    run_script("bench_train", main)
