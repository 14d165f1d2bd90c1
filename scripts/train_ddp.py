#!/usr/bin/env python3
"""Continue a tinygpt run in PyTorch DistributedDataParallel, on one machine or many, and come back.

    torchrun --standalone --nproc-per-node 2 scripts/train_ddp.py --resume run.tinygpt --data text.txt \\
        --steps 200 --out run2.tinygpt
    tinygpt train --resume run2.tinygpt --data text.txt --steps 300        # back on WebGPU

Several machines: the same command on each, with torchrun's rendezvous instead of --standalone:
    torchrun --nnodes 2 --node-rank 0 --nproc-per-node 8 --rdzv-backend c10d \\
        --rdzv-endpoint HOST:29500 --rdzv-id run1 scripts/train_ddp.py ...   (--node-rank 1 on the other)

What carries over from the file: weights, the optimizer's state and step (AdamW's moments, or
Muon's: torch.optim.Muon on the blocks' matrices, AdamW on the rest; a Lion run is refused, as
PyTorch has no Lion), the learning-rate schedule and
its planned end, clipping, weight decay, the tokenizer, and the data-sampling state. Every step
draws the windows that one process with N x B windows would draw (tinygpt's sampler, from the
saved state), and rank r trains on rows r*B .. r*B+B-1; DDP averages the gradients, so N ranks
step as one process at N*B. gloo on CPUs, NCCL where CUDA is present. Rank 0 writes the
.tinygpt, with optimizer state and the effective batch N*B, atomically; --log-file appends the
JSON Lines of `tinygpt train --log` (torchrun would take a --log after the script for its own
--log-dir, so the name differs).
"""
import argparse
import gc
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

from tinygpt.files import checkpoint as ckpt
from tinygpt.files import optim_state
from tinygpt.run import runlog
from tinygpt.core.config import param_shapes
from tinygpt.model.optimizers import make_settings
from tinygpt.commands.argtypes import flag, nonneg_int, positive_float, positive_int
from tinygpt.core.errors import TinyGPTError, UsageError
from tinygpt.files.outputs import Outputs, is_json_lines, os_error_text
from tinygpt.run.infer import data_path_for, tokenizer_of
from tinygpt.run.options import TrainOptions
from tinygpt.run.schedule import resolve
from tinygpt.files.tokenfile import data_files, open_dataset


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--resume", required=True, help="the .tinygpt to continue (written by tinygpt train or by this)")
    ap.add_argument("--data", help="what the run trains on, as tinygpt train reads it: a text file, a directory of "
                                   "texts or a token file from tinygpt prepare (default: the run's own, else the "
                                   "built-in corpus)")
    ap.add_argument("--tokenizer-file", help="r50k_base.tiktoken, for a gpt2-tokenized run without internet")
    ap.add_argument("--steps", type=positive_int, help="total steps (default: the run's planned end)")
    ap.add_argument("--batch", type=positive_int, help="windows per rank (default: the file's batch / ranks)")
    ap.add_argument("--lr", type=positive_float, help="peak lr over the file's schedule")
    ap.add_argument("--rewarm", action="store_true",
                    help="restart the schedule at the file's step (a new warm-up and decay to --steps); by default "
                         "steps past the run's planned end continue at its final lr, as tinygpt train's")
    ap.add_argument("--out", help="the .tinygpt to write (default: the --resume file)")
    ap.add_argument("--force", action="store_true", help="replace --out even if tinygpt did not write it")
    ap.add_argument("--log-file", "--log", dest="log_file",
                    help="append one JSON line per logged step, the lines of tinygpt train --log (under torchrun "
                         "write --log-file: torchrun takes a --log after the script for its own --log-dir)")
    ap.add_argument("--log-every", type=positive_int, default=10)
    ap.add_argument("--eval-every", type=nonneg_int, default=100)
    ap.add_argument("--eval-windows", type=positive_int, default=64)
    ap.add_argument("--save-every", type=nonneg_int, default=500)
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = parse(argv)
    try:
        import torch  # noqa: F401  (the hand-off's one extra: checked before anything else)
    except ImportError:
        print("train_ddp: error: PyTorch is not installed; install the extra with: pip install -e '.[torch]'",
              file=sys.stderr)
        return 2
    try:
        return train(args)
    except TinyGPTError as e:
        print(f"train_ddp: error: {e.worded(flag)}", file=sys.stderr)
        return e.exit_code
    except OSError as e:
        print(f"train_ddp: error: {os_error_text(e)}", file=sys.stderr)
        return 1


def setup(args, rank: int, world: int):
    """The file, data, sampler state and schedule; rank 0 also claims the outputs first."""
    out = Path(args.out or args.resume)
    if rank == 0:     # every output checked before anything is read (tinygpt train's rule)
        outs = Outputs(args.force, {"resume": args.resume, "data": data_files(args.data),
                                    "tokenizer_file": args.tokenizer_file})
        outs.claim(args.out or args.resume, "out", "checkpoint", ckpt.is_tinygpt, updates="resume")
        if args.log_file:
            outs.claim(args.log_file, "log", "log", is_json_lines, append=True)
    ck = ckpt.load(args.resume, f"{{opt:resume}} {args.resume}")
    label = f"{{opt:resume}} {args.resume}"
    settings = optim_state.file_settings(ck, label) or make_settings("adamw")
    from torch_model import MIRRORS
    if settings.name not in MIRRORS:
        raise UsageError(f"{label} trains with {settings.name}, which PyTorch does not ship; continue it with "
                         "tinygpt train, or resume it there with --optimizer adamw first")
    if settings.kind.upstream_moments and ck.m is None:
        raise UsageError(f"{label} holds no optimizer state; continue it with tinygpt train "
                         "first, or start a run there")
    if ck.extra.get("lora") is not None:      # DDP trains every weight: the adapters would be left behind
        raise UsageError(f"{{opt:resume}} {args.resume} is a LoRA run, which DDP does not train; continue it with "
                         "tinygpt train, or fold its adapters in first (tinygpt export --format tinygpt --merge)")
    cfg = ck.cfg
    B = args.batch or cfg.batch // world
    if B <= 0 or (args.batch is None and cfg.batch % world):
        raise UsageError(f"the file's batch {cfg.batch} does not split over {world} ranks; give {{opt:batch}} "
                         "(windows per rank)")
    tok = tokenizer_of(ck, args.tokenizer_file)
    # every --data form tinygpt train reads (a token file, a directory of texts, a text), by its code
    data = open_dataset(data_path_for(args.data, ck, f"{{opt:resume}} {args.resume}"), tok, cfg.ctx)
    rng = np.random.default_rng([cfg.seed, 1])
    if "dataRngState" in ck.extra:
        rng.bit_generator.state = ck.extra["dataRngState"]
    sched = resolve(TrainOptions(lr=args.lr), ck.extra.get("schedule"), cfg.lr)
    total = args.steps or sched.total
    if total <= ck.step:
        raise UsageError(f"the file is at step {ck.step}; ask for more {{opt:steps}} than that")
    held = sched.resume_at(ck.step, args.rewarm)     # tinygpt train's rule: the schedule's past is kept
    extension = sched.extension(ck.step, total, held)
    sched.end_at(total, held)
    return out, ck, cfg, B, data, rng, sched, total, settings, extension


def train(args) -> int:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch_model import MIRRORS, GPTModule, clip_and_step, loss_of

    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    failure = None
    try:
        out, ck, cfg, B, data, rng, sched, total, settings, extension = setup(args, rank, world)
    except TinyGPTError as e:
        failure = e
    ok = torch.tensor(0 if failure else 1)
    dist.all_reduce(ok, op=dist.ReduceOp.MIN)          # one rank's refusal stops them all, none hangs
    if not int(ok):
        dist.destroy_process_group()
        if failure:
            raise failure
        return 2

    module = GPTModule(cfg, ck.params, device)
    model = DDP(module)
    state, steps, start = optim_state.read(ck, settings, param_shapes(cfg), f"--resume {args.resume}")
    mirror = MIRRORS[settings.name]
    opt = mirror.make(module, settings, sched.lr)
    mirror.load(opt, module, state, steps)
    vx, vy = data.val_windows(args.eval_windows)
    history, log = list(ck.loss_history), open(args.log_file, "a") if args.log_file and rank == 0 else None
    T, GB = cfg.ctx, B * world
    if rank == 0:
        print(f"train_ddp: {world} ranks x batch {B} (effective {GB}), {cfg.layers} layers, d_model {cfg.d_model}, "
              f"ctx {T}, {'nccl' if cuda else 'gloo'}, from step {ck.step} to {total}; {sched.describe()}",
              file=sys.stderr)
        if extension:
            print(TinyGPTError(extension).worded(flag), file=sys.stderr)

    def val_loss():
        with torch.no_grad():
            tot = sum(float(loss_of(module(torch.as_tensor(vx[i:i + GB].astype(np.int64), device=device)),
                                    vy[i:i + GB])) * len(vx[i:i + GB]) for i in range(0, len(vx), GB))
        return tot / len(vx)

    def save(step):
        params = {n: p.detach().cpu().numpy().astype(np.float32) for n, p in module.named().items()}
        cfg.batch, cfg.lr = GB, sched.lr
        taken = steps + step - ck.step                  # the updates the optimizer's state has taken
        extra = dict(ck.extra, dataRngState=rng.bit_generator.state, schedule=sched.as_dict(), momentsFrom=start)
        fields, m, v = optim_state.written(settings, mirror.rows(opt, module), taken)   # as tinygpt train writes it
        extra.update(fields)
        ckpt.save(out, ckpt.Checkpoint(cfg, params, m, v, step, history, extra, ck.header))

    t_last, n_since = time.perf_counter(), 0
    for step in range(ck.step, total):
        lr = sched.at(step)
        x, y = data.sample(rng, GB)                       # the same draw on every rank
        xs, ys = x[rank * B:(rank + 1) * B], y[rank * B:(rank + 1) * B]
        loss = loss_of(model(torch.as_tensor(xs.astype(np.int64), device=device)), ys)
        module.zero_grad(set_to_none=True)
        loss.backward()                                   # DDP averages the gradients over the ranks
        clip_and_step(opt, module, lr)
        done, n_since = step + 1, n_since + 1
        want_eval = args.eval_every and (done % args.eval_every == 0 or done == total)
        if done % args.log_every == 0 or done == total or want_eval:
            mean = loss.detach().clone()
            dist.all_reduce(mean)
            mean = float(mean) / world
            now = time.perf_counter()
            tok_s = n_since * GB * T / max(now - t_last, 1e-9)
            rec = {"step": done, "train": mean}
            if rank == 0:
                if want_eval:
                    rec["val"] = val_loss()
                history.append(rec)
                if log:
                    log.write(json.dumps({"time": runlog.now(), "step": done, "train_loss": mean,
                                          "val_loss": rec.get("val"), "lr": lr,
                                          "tokens_per_s": round(tok_s, 1)}) + "\n")
                    log.flush()
                print(f"step {done}: loss {mean:.4f}" + (f" val {rec['val']:.4f}" if "val" in rec else "")
                      + f", {tok_s:,.0f} tokens/s", file=sys.stderr)
            t_last, n_since = time.perf_counter(), 0
        if rank == 0 and args.save_every and done % args.save_every == 0 and done != total:
            save(done)
    if rank == 0:
        save(total)
        if log:
            log.close()
        print(f"wrote {out} at step {total}; continue on WebGPU with: tinygpt train --resume {out} "
              f"--steps N" + (f" --data {args.data}" if args.data else ""), file=sys.stderr)
    dist.barrier()
    del model                       # DDP's reducer holds the group: let it go while every rank is still here
    gc.collect()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    code = main()
    # Leave without the interpreter's teardown: gloo's worker threads, destroyed there, have now and then
    # aborted a rank (SIGABRT, "terminate called without an active exception") after its file was written.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
