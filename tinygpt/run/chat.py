"""A conversation with a model: `tinygpt chat` and the Python API's GPT.chat.

Each turn renders the whole conversation with the model's chat template (tokenizers.chat) and
asks for the reply from the key/value cache, which still holds the conversation so far: the
decoder (model.decode) finds the prefix it holds and runs only the turn's new tokens, so a turn
costs its own tokens, not the history's. The cache's window follows the conversation: it is made
for the tokens at hand (spec.rows_for) and made again, twice as long, when a turn would not fit,
up to the model's context. A reply ends at the model's end-of-turn tokens, which it does not show.
"""
from __future__ import annotations

from ..core.errors import UsageError
from ..model.spec import rows_for
from ..tokenizers.chat import ChatTemplate

FIRST_ROWS = 512        # the cache's first window: a short conversation's, grown as it goes


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


class Conversation:
    """Replies to a conversation from one cached decoder. make(rows, tokens) -> a Decoder of one
    sequence over `rows` positions that draws up to `tokens`, its weights set."""

    def __init__(self, make, tok, template: ChatTemplate, stop: tuple, ctx: int):
        self.make, self.tok, self.template, self.stop, self.ctx = make, tok, template, tuple(stop), ctx
        self.decoder, self.rows, self.tokens = None, 0, 0

    def prompt(self, messages) -> list[int]:
        return [int(i) for i in self.tok.encode(self.template.render(messages, add_generation_prompt=True))]

    def reply(self, messages, max_new_tokens: int, temperature: float = 0.0, top_k=None, top_p: float = 1.0,
              seed: int = 0, on_text=None) -> str:
        """The model's reply to the conversation (its last turn the user's), as text without its
        end-of-turn token. on_text(piece): the reply's text as it grows (a stream)."""
        ids = self.prompt(messages)
        if len(ids) >= self.ctx:
            raise UsageError(f"the conversation is {len(ids):,} tokens, as long as the model's context "
                             f"({self.ctx:,}); start a new one")
        need = len(ids) + max_new_tokens
        if self.decoder is None or (need > self.rows and self.rows < self.ctx) or max_new_tokens > self.tokens:
            self.rows = rows_for(self.ctx, max(need, 2 * self.rows), FIRST_ROWS)
            self.tokens = max(max_new_tokens, self.tokens)
            self.decoder = None                                  # the old one's buffers go before the new ones
            self.decoder = self.make(self.rows, self.tokens)
        got, shown = [], [""]

        def on_token(_, t):
            got.append(t)
            text = self.tok.decode(got)
            if not text.endswith("\ufffd"):                      # not inside a character's bytes
                on_text(text[len(shown[0]):])
                shown[0] = text
        seq = self.decoder.generate(ids, max_new_tokens, temperature, top_k, top_p, seed, self.stop,
                                    on_token if on_text else None)[0]
        return self.tok.decode(seq[len(ids):], skip_special=True)
