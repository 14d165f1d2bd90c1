"""`tinygpt chat`: its flags and its command (the conversation itself: run/chat.py)."""
from __future__ import annotations

import sys

from ..run.chat import session
from ..run.infer import check_sampling
from ..run.options import ChatOptions
from .argtypes import nonneg_float, positive_int, seed_int
from .train_settings import default, options


def cmd_chat(args) -> int:
    o = options(ChatOptions, args)
    check_sampling(o.max_tokens, o.temperature, o.top_k, o.top_p, 1)
    session(o, sys.stdin, sys.stdout, sys.stderr)
    return 0


def chat_command(sub, common, add_model, add_sampling):
    """`tinygpt chat`'s parser; add_model and add_sampling: the flags the sampling commands share."""
    p = sub.add_parser("chat", parents=[common],
                       help="talk with a model in its chat format: a reply streamed each turn, the cache kept across "
                            "turns; without a terminal, one user turn a line of stdin and one reply a line")
    add_model(p)
    p.add_argument("--system", help="the system prompt (default: none, or the one the model's template writes)")
    p.add_argument("--temperature", type=nonneg_float, default=default(ChatOptions, "temperature"),
                   help="0 is greedy (the default); higher draws more freely")
    p.add_argument("--top-k", type=int, help="draw from the k most likely tokens only (default: all)")
    p.add_argument("--top-p", type=float, default=default(ChatOptions, "top_p"),
                   help="nucleus: draw from the most likely tokens that hold this share of the probability "
                        "(default 1: all)")
    p.add_argument("--max-tokens", type=positive_int, default=default(ChatOptions, "max_tokens"),
                   help=f"a reply's most tokens (default {default(ChatOptions, 'max_tokens')}); it ends sooner at "
                        "the model's end-of-turn token")
    p.add_argument("--seed", type=seed_int, default=default(ChatOptions, "seed"),
                   help="the same seed draws the same replies (default 0)")
    p.add_argument("--ignore-eos", action="store_true", help="each reply runs to --max-tokens past the end of its turn")
    add_sampling(p, "bf16 and f16 keep the weights and the key/value cache in 16 bits (default fp32)")
    p.set_defaults(fn=cmd_chat)
