#!/usr/bin/env python3
"""A real small model's shape end to end on this machine: a random model of SmolLM2-135M's shape
(30 layers, width 576, 9 heads, 3 kv heads, MLP 1536, vocabulary 49,152, a tied head) or of
Qwen3-0.6B's (28 layers, width 1,024, 16 heads of 128 over it, 8 kv heads, QK-norm, MLP 3,072,
vocabulary 151,936, a tied head), built by transformers and stored in bfloat16 as the hub stores
it, then through tinygpt's commands: import-hf, plan (the budget before anything is allocated),
eval, sample from the key/value cache and a LoRA fine-tune. Each command runs in a process of its
own, timed, with its peak memory.

    python scripts/hf_scale.py [--shape smollm2-135m|qwen3-0.6b] [--ctx 256] [--eval-windows 8]
                               [--lora-steps 10] [--data FILE] [--keep DIR]

Needs torch and transformers (make engines installs them). The weights are random (none can be
downloaded), so the losses say nothing of the model; the times, memory and budget are its shape's.
--lora-steps 0 leaves the fine-tune out.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# name: (transformers' classes, the config's shape), as the hub's config.json gives them
SHAPES = {
    "smollm2-135m": ("Llama", dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                                   num_key_value_heads=3, vocab_size=49152, max_position_embeddings=8192,
                                   rms_norm_eps=1e-5, tie_word_embeddings=True, rope_theta=100000.0)),
    "qwen3-0.6b": ("Qwen3", dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                                 num_key_value_heads=8, head_dim=128, vocab_size=151936, max_position_embeddings=40960,
                                 rms_norm_eps=1e-6, tie_word_embeddings=True, rope_theta=1000000.0)),
}

BUILD = """
import sys, torch, transformers
sys.path.insert(0, {tests!r})
from hf_reference import tokenizer
torch.manual_seed(0)
model = transformers.{family}ForCausalLM(transformers.{family}Config(**{shape!r})).to(torch.bfloat16)
model.save_pretrained({out!r}, safe_serialization=True)
tokenizer(2000).save({out!r} + "/tokenizer.json")
"""


def run(label: str, args: list, rows: list, check: bool = True) -> str:
    """A command in its own process: its wall time and peak resident memory (os.wait4's); check:
    stop where it fails (plan's refusal is a result, not a failure)."""
    t0 = time.perf_counter()
    with tempfile.TemporaryFile("w+") as err:
        p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=err, text=True)
        out = p.stdout.read()
        _, status, usage = os.wait4(p.pid, 0)
        err.seek(0)
        lines = [ln for ln in err.read().splitlines() if ln.strip() and "XDG_RUNTIME_DIR" not in ln]
    seconds = time.perf_counter() - t0
    if check and os.waitstatus_to_exitcode(status):
        sys.exit(f"hf_scale: {label} failed: {lines[-1] if lines else ''}")
    rows.append((label, seconds, usage.ru_maxrss / 1024))
    print(f"{label}: {seconds:.1f} s, peak memory {usage.ru_maxrss / 1024:,.0f} MiB", flush=True)
    return out, lines


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=list(SHAPES), default="smollm2-135m")
    ap.add_argument("--ctx", type=int, default=256, help="the context imported (SmolLM2's is 8,192)")
    ap.add_argument("--eval-windows", type=int, default=8)
    ap.add_argument("--lora-steps", type=int, default=10, help="0: no fine-tune")
    ap.add_argument("--data", help="a text file to evaluate and fine-tune on (default: tinygpt's built-in corpus)")
    ap.add_argument("--keep", help="a directory to keep the files in (default: a temporary one)")
    a = ap.parse_args(argv)
    if not 1 <= a.ctx <= 8192 or not 0 <= a.lora_steps <= 1000 or not 1 <= a.eval_windows <= 1000:
        sys.exit("hf_scale: --ctx is 1 to 8,192, --eval-windows 1 to 1,000 and --lora-steps 0 to 1,000")
    d = Path(a.keep or tempfile.mkdtemp(prefix="hf_scale-"))
    d.mkdir(parents=True, exist_ok=True)
    tg = [sys.executable, "-m", "tinygpt"]
    data = ["--data", a.data] if a.data else []
    rows = []
    hf, m, ft = d / a.shape, d / f"{a.shape}.tinygpt", d / f"{a.shape}-lora.tinygpt"
    family, shape = SHAPES[a.shape]
    code = BUILD.format(tests=str(Path(__file__).resolve().parents[1] / "tests"), family=family, shape=shape,
                        out=str(hf))
    run("build (transformers, bf16)", [sys.executable, "-c", code], rows)
    run("import-hf", tg + ["import-hf", str(hf), "--out", str(m), "--ctx", str(a.ctx), "--force", "--quiet"], rows)
    budget = json.loads(run("plan", tg + ["plan", "--resume", str(m), "--lora", "8", "--batch", "1", "--json"],
                            rows, check=False)[0])
    if not budget["fits"]:       # the budget is the result: nothing past it can run on this adapter
        report(rows, hf, m, budget, [])
        sys.exit(f"hf_scale: plan: the fine-tune does not fit this adapter: {budget['problems'][0]}; eval, sample "
                 "and LoRA not run")
    run(f"eval ({a.eval_windows} windows)", tg + ["eval", "--model", str(m), "--max-windows", str(a.eval_windows)]
        + data, rows)
    run("sample (20 tokens, cache)", tg + ["sample", "--model", str(m), "--tokens", "20", "--temperature", "0"], rows)
    lines = []
    if a.lora_steps:
        train = ["train", "--resume", str(m), "--lora", "8", "--batch", "1", "--steps", str(a.lora_steps),
                 "--eval-every", "0", "--sample-tokens", "0", "--out", str(ft), "--force"]
        _, lines = run(f"LoRA ({a.lora_steps} steps)", tg + train + data, rows)
    report(rows, hf, m, budget, lines)


def report(rows: list, hf: Path, m: Path, budget: dict, lines: list):
    print("\n| command | seconds | peak memory (MiB) |\n|---|---|---|")
    for label, s, mib in rows:
        print(f"| {label} | {s:.1f} | {mib:,.0f} |")
    print(f"\nsafetensors: {sum(f.stat().st_size for f in hf.glob('*.safetensors')):,} bytes; .tinygpt "
          f"{m.stat().st_size:,} bytes")
    print("plan:", json.dumps(budget)[:2000])
    if lines:
        print("train's last lines:", *lines[-3:], sep="\n  ")


if __name__ == "__main__":
    main()
