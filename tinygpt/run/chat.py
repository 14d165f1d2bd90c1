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
from ..files.lora_files import model_params
from ..model.spec import rows_for
from ..tokenizers.chat import ChatTemplate, template_of
from .infer import decoder_for, load_model, stop_ids

FIRST_ROWS = 512        # the cache's first window: a short conversation's, grown as it goes


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


MAX_TURN_CHARS = 1 << 20       # one user turn's characters (a line of stdin)


def session(o, inp, out, err, gpu=None) -> int:
    """`tinygpt chat`: a conversation on stdin and stdout. On a terminal, a prompt before each
    turn and the reply streamed as it is drawn; otherwise one user turn a line, each reply on its
    own line. Returns the turns answered."""
    ck, tok = load_model(o)
    template = template_of(ck.extra, tok)
    if not template.own:
        print("the model has no chat template: speaking ChatML (<|im_start|>role ... <|im_end|>)", file=err)
    stop = () if o.ignore_eos else stop_ids(ck.extra, tok, ck.cfg.vocab)
    if not stop:
        print(f"the model names no end-of-turn token: each reply runs to {o.max_tokens} tokens", file=err)
    held = [ck]

    def make(rows, tokens):
        # the weights are on the device once a decoder is made: the host's copy is let go, and read
        # from the file again only if the conversation outgrows the window
        ck_now = held.pop() if held else load_model(o)[0]
        weights = model_params(ck_now, f"{{opt:model}} {o.model}", o.adapters)
        return decoder_for(o, ck_now, rows, tokens, gpu, weights,
                           fix="ask for fewer {opt:max_tokens}, or use {opt:precision} bf16")
    cfg = ck.cfg
    del ck
    chat = Conversation(make, tok, template, stop, cfg.ctx)
    messages = [{"role": "system", "content": o.system}] if o.system else []
    live = inp.isatty()
    turns = 0
    while True:
        if live:
            out.write("> ")
            out.flush()
        line = inp.readline(MAX_TURN_CHARS + 1)
        if not line:
            break
        if len(line) > MAX_TURN_CHARS:
            raise UsageError(f"a turn of over {MAX_TURN_CHARS:,} characters; keep each turn to one shorter line")
        text = line.rstrip("\n")
        if not text.strip():
            continue
        messages.append({"role": "user", "content": text})

        def show(piece):
            out.write(piece)
            out.flush()
        reply = chat.reply(messages, o.max_tokens, o.temperature, o.top_k, o.top_p, o.seed + turns,
                           show if live else None)
        out.write(("" if live else reply) + "\n")
        out.flush()
        messages.append({"role": "assistant", "content": reply})
        turns += 1
    return turns
