#!/usr/bin/env python3
"""The Python API in one page (docs/api.md): load a model, score text shorter than its context,
sample from the key/value cache, train a few steps more and save, importing nothing but tinygpt.

    python scripts/api_example.py --model runs/small.tinygpt --data tinyshakespeare.txt \
        --out runs/small-more.tinygpt
    tinygpt eval --model runs/small-more.tinygpt --data tinyshakespeare.txt

Without --model it starts a new tiny model instead. Errors are the CLI's: one line, an exit code.
"""
import argparse
import sys

import tinygpt


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="a .tinygpt file (default: a new tiny model)")
    ap.add_argument("--data", help="the text to train on (default: the built-in corpus)")
    ap.add_argument("--out", required=True, help="the .tinygpt file to write")
    ap.add_argument("--steps", type=int, default=10, help="steps to train (default 10)")
    ap.add_argument("--tokens", type=int, default=50, help="tokens to generate (default 50)")
    args = ap.parse_args(argv)

    gpt = tinygpt.GPT.load(args.model) if args.model else tinygpt.GPT.from_preset("tiny")
    print(gpt)
    cfg = gpt.config

    # a batch of two windows, each shorter than the context: next-token loss in nats
    ids = gpt.encode("ROMEO:\nBut soft, what light through yonder window breaks?\n" * 4)[:cfg.ctx // 2 + 1]
    batch = [ids, ids[::-1]]
    print(f"loss of 2 windows of {len(ids) - 1} tokens (context {cfg.ctx}): {gpt.loss(batch):.4f} nats")

    # 50 tokens from the key/value cache: greedy, then drawn (temperature, top-k, top-p, seed)
    print("greedy:", repr(gpt.generate("ROMEO:", args.tokens)))
    print("drawn: ", repr(gpt.generate("ROMEO:", args.tokens, temperature=0.8, top_k=40, top_p=0.95, seed=1)))

    # train: the trainer's own steps (its schedule, optimizer and precision), then save
    before = gpt.step
    record = gpt.train(args.steps, data=args.data, batch=4)
    print(f"trained steps {before + 1} to {gpt.step}: loss {record['loss']:.4f}, lr {record['lr']:.3g}, "
          f"grad norm {record['grad_norm']:.3f}")
    print(f"saved {gpt.save(args.out)}")


if __name__ == "__main__":
    try:
        main()
    except tinygpt.TinyGPTError as e:          # the CLI's rule: one line, the error's exit code
        print(f"api_example: error: {e}", file=sys.stderr)
        sys.exit(e.exit_code)
