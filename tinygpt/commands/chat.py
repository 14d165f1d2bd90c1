"""`tinygpt chat`: its flags (as values: settings.add_flags builds them) and its command (the conversation
itself: run/chat.py)."""
from __future__ import annotations

import sys

from ..run.chat import session
from ..run.infer import check_sampling
from ..run.options import ChatOptions
from .argtypes import nonneg_float, positive_int, seed_int
from .settings import default, flag_of, options


def cmd_chat(args) -> int:
    o = options(ChatOptions, args)
    check_sampling(o.max_tokens, o.temperature, o.top_k, o.top_p, 1)
    session(o, sys.stdin, sys.stdout, sys.stderr)
    return 0


CHAT_HELP = ("talk with a model in its chat format: a reply streamed each turn, the cache kept across turns; "
             "without a terminal, one user turn a line of stdin and one reply a line")
CHAT_PRECISION = "bf16 and f16 keep the weights and the key/value cache in 16 bits (default fp32)"
# chat's own flags, after --model and before the flags every sampling command takes (cli.sampling)
CHAT = (
    flag_of("--system", help="the system prompt (default: none, or the one the model's template writes)"),
    flag_of("--temperature", type=nonneg_float, default=default(ChatOptions, "temperature"),
            help="0 is greedy (the default); higher draws more freely"),
    flag_of("--top-k", type=int, help="draw from the k most likely tokens only (default: all)"),
    flag_of("--top-p", type=float, default=default(ChatOptions, "top_p"),
            help="nucleus: draw from the most likely tokens that hold this share of the probability (default 1: all)"),
    flag_of("--max-tokens", type=positive_int, default=default(ChatOptions, "max_tokens"),
            help=f"a reply's most tokens (default {default(ChatOptions, 'max_tokens')}); it ends sooner at "
                 "the model's end-of-turn token"),
    flag_of("--seed", type=seed_int, default=default(ChatOptions, "seed"),
            help="the same seed draws the same replies (default 0)"),
    flag_of("--ignore-eos", action="store_true", help="each reply runs to --max-tokens past the end of its turn"))
