"""A model's chat template: a conversation (messages of role and content) as the text the model
was tuned on, rendered as transformers renders it (apply_chat_template).

A template is a Jinja2 program that arrives with a downloaded model, so it is code from elsewhere:
it runs in Jinja2's immutable sandbox (no attribute of Python's internals, no change to what it is
given), with transformers' own additions (raise_exception, strftime_now, tojson), trim_blocks and
lstrip_blocks as transformers sets them, and its output bounded. A model without one is spoken to
in ChatML, which is said in one line where it is chosen.
"""
from __future__ import annotations

import json
from datetime import datetime

from ..core.errors import UsageError

# ChatML: each turn between <|im_start|>ROLE and <|im_end|>, the reply's header last
CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
          "'<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
          "{% endif %}")
ROLES = ("system", "user", "assistant", "tool")
MAX_RENDERED = 4 << 20          # characters a rendering may produce (a real conversation's are far fewer)
MAX_MESSAGES = 10_000


class TemplateError(UsageError):
    pass


def check_messages(messages, what: str = "messages") -> list[dict]:
    """A conversation as transformers takes one: a list of {"role", "content"} with string content
    and a known role; anything else refused in one line naming the message."""
    if not isinstance(messages, (list, tuple)) or not messages:
        raise UsageError(f"{what}: a list of {{\"role\": ..., \"content\": ...}} messages, got "
                         f"{type(messages).__name__}")
    if len(messages) > MAX_MESSAGES:
        raise UsageError(f"{what}: {len(messages):,} messages, more than {MAX_MESSAGES:,}")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise UsageError(f"{what}[{i}]: a message is a dict with a string role and a string content, got "
                             f"{str(m)[:80]}")
        if m["role"] not in ROLES:
            raise UsageError(f"{what}[{i}]: role {m['role']!r}; a message's role is one of {', '.join(ROLES)}")
        out.append(dict(m))
    return out


def _generation_tag():
    """transformers' {% generation %} ... {% endgeneration %}, which marks the assistant's tokens for
    its assistant mask: rendered as its body (chat_data tells the assistant's tokens itself)."""
    from jinja2.ext import Extension

    class Generation(Extension):
        tags = {"generation"}

        def parse(self, parser):
            next(parser.stream)
            return parser.parse_statements(("name:endgeneration",), drop_needle=True)
    return Generation


def _raise(message):
    raise TemplateError(f"the chat template refused the conversation: {message}")


class ChatTemplate:
    """A template, compiled once in the sandbox. source None: ChatML (own = False)."""

    def __init__(self, source: str | None, special: dict | None = None):
        try:
            from jinja2 import TemplateError as JinjaError
            from jinja2.sandbox import ImmutableSandboxedEnvironment
        except ImportError:
            raise UsageError("a chat template needs the jinja2 package: pip install jinja2") from None
        self.own = bool(source)
        self.source = source if self.own else CHATML
        self.special = dict(special or {})           # bos_token, eos_token, ... as the template names them
        self._errors = JinjaError
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[_generation_tag()])
        env.filters["tojson"] = lambda x, indent=None, ensure_ascii=False, separators=None, sort_keys=False: \
            json.dumps(x, indent=indent, ensure_ascii=ensure_ascii, separators=separators, sort_keys=sort_keys)
        env.globals["raise_exception"] = _raise
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        try:
            self.template = env.from_string(self.source)
        except JinjaError as e:
            raise TemplateError(f"the model's chat template is not Jinja2 that compiles ({e})") from None

    def render(self, messages, add_generation_prompt: bool = True) -> str:
        messages = check_messages(messages)
        try:
            pieces, n = [], 0
            for piece in self.template.generate(messages=messages, add_generation_prompt=add_generation_prompt,
                                                **self.special):
                n += len(piece)
                if n > MAX_RENDERED:
                    raise TemplateError(f"the chat template wrote more than {MAX_RENDERED:,} characters for "
                                        f"{len(messages)} messages; it does not end")
                pieces.append(piece)
        except TemplateError:
            raise
        except self._errors as e:          # the sandbox's refusals (SecurityError) among them
            raise TemplateError(f"the chat template failed: {str(e)[:200]}") from None
        except (TypeError, ValueError, KeyError, IndexError, AttributeError, RecursionError, OverflowError) as e:
            raise TemplateError(f"the chat template failed on this conversation: {type(e).__name__}: "
                                f"{str(e)[:160]}") from None
        return "".join(pieces)


def template_of(extra: dict, tok) -> ChatTemplate:
    """The model's chat template (its file's chatTemplate), with the special tokens it names; ChatML
    where the model has none (ChatTemplate.own False: the caller says so)."""
    special = {}
    lib = getattr(tok, "lib", None)
    for key, rec in (("eos_token", "tokenizerEos"), ("bos_token", "tokenizerBos")):
        i = extra.get(rec)
        if lib is not None and isinstance(i, int) and not isinstance(i, bool):
            name = lib.id_to_token(i)
            if name is not None:
                special[key] = name
    special.setdefault("bos_token", "")
    special.setdefault("eos_token", "")
    src = extra.get("chatTemplate")
    return ChatTemplate(src if isinstance(src, str) else None, special)
