"""A Hugging Face tokenizer: a `tokenizer.json` run by Hugging Face's `tokenizers` library, the
tokenizer of a model `tinygpt import-hf` read (Llama's, Qwen's, SmolLM's byte-level BPEs).

Unlike the byte and GPT-2 tokenizers it is not one fixed vocabulary: its file travels with its
model. The .tinygpt file holds the tokenizer.json's text in its own fields (`record`), so eval,
sample, prepare and a resumed run rebuild it from the model alone; a token file names it by the
text's hash (`key`), so tokens of another tokenizer are never read as this one's.

A long text is encoded in pieces cut after a newline that a non-space follows, where the
byte-level pre-tokenizers of these models (GPT-2's and Llama 3's patterns) cut anyway, so the
pieces' tokens equal the whole text's. A tokenizer that fails that check on load (a SentencePiece
one that marks each piece's first word) encodes its text whole, up to WHOLE_TEXT characters.
"""
from __future__ import annotations

import json
import hashlib
import re

import numpy as np

from ..files.data import DataError
from .base import Tokenizer, utf8_pieces

PIECE = 1 << 20                  # characters encoded at once
WHOLE_TEXT = 256 << 20           # the most a tokenizer that cannot cut its text encodes at once
_CUT = re.compile(r"(?<=\n)(?=\S)")
_NEVER = re.compile(r"(?!)")
_PROBES = ("a b\nc d", "The cat\n\nsat.\nOn  the\nmat", "x\ny \n z\n1\n2")


def _library(text: str):
    try:
        from tokenizers import Tokenizer as Library
    except ImportError as e:       # a core dependency: missing only where it was never installed
        raise DataError("a Hugging Face tokenizer needs the tokenizers package: pip install tokenizers") from e
    try:
        return Library.from_str(text)
    except Exception as e:         # the library's own error types: a file it cannot read
        raise DataError(f"the tokenizer.json is not one Hugging Face's tokenizers library reads ({e})"[:300]) from e


class HFTokenizer(Tokenizer):
    name = "hf"
    summary = "a Hugging Face tokenizer.json, an imported model's own"
    choosable = False          # no option names it: it arrives with its model (tinygpt import-hf)

    def __init__(self, text: str, vocab: int, eos_id: int | None = None, source: str | None = None):
        self.lib, self.json, self.vocab = _library(text), text, int(vocab)
        self.eos_id, self.source = eos_id, source
        self.pad_id = eos_id if eos_id is not None else 0
        n = self.lib.get_vocab_size(with_added_tokens=True)
        if n > self.vocab:
            raise DataError(f"the tokenizer.json has {n:,} tokens, more than the model's {self.vocab:,} rows; "
                            "it is not this model's tokenizer")
        self.digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
        self.cuts = all(self._ids(p) == self._ids(p[:i + 1]) + self._ids(p[i + 1:])
                        for p in _PROBES for i in (m.start() - 1 for m in _CUT.finditer(p)))

    @property
    def key(self) -> str:
        return f"hf:{self.digest[:16]}"

    def byte_level_bpe(self):
        doc = json.loads(self.json)
        model = doc.get("model") or {}
        if model.get("type") != "BPE" or not isinstance(model.get("vocab"), dict):
            return None
        by_id = {i: t for t, i in model["vocab"].items()}
        special = set()
        for a in doc.get("added_tokens") or []:
            by_id[a["id"]] = a["content"]
            if a.get("special"):
                special.add(a["id"])
        merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges") or []]
        return by_id, special, merges, doc.get("pre_tokenizer")

    def record(self) -> dict:
        out = {"tokenizer": self.name, "tokenizerJson": self.json}
        if self.eos_id is not None:
            out["tokenizerEos"] = self.eos_id
        return out | ({"tokenizerSource": self.source} if self.source else {})

    @classmethod
    def from_record(cls, record: dict, vocab: int, tokenizer_file: str | None = None) -> HFTokenizer:
        text, eos = record.get("tokenizerJson"), record.get("tokenizerEos")
        if not isinstance(text, str):
            raise DataError("the model names a Hugging Face tokenizer but holds no tokenizer.json; import it again "
                            "with tinygpt import-hf")
        eos = eos if isinstance(eos, int) and not isinstance(eos, bool) and 0 <= eos < vocab else None
        return cls(text, vocab, eos, record.get("tokenizerSource"))

    @classmethod
    def load(cls, tokenizer_file: str | None = None) -> HFTokenizer:
        raise DataError("a Hugging Face tokenizer arrives with its model: import the model with tinygpt import-hf "
                        "and give that file, which holds it")

    def _ids(self, text: str) -> list:
        return self.lib.encode(text, add_special_tokens=False).ids

    def encode(self, data: bytes | str) -> np.ndarray:
        data = self.utf8_of(data, "this model's tokenizer reads UTF-8 text")
        return np.concatenate([np.zeros(0, np.uint32)] + [np.asarray(self._ids(p), np.uint32)
                                                          for p in self._pieces(data)])

    def _pieces(self, text: str):
        if not self.cuts:
            if len(text) > WHOLE_TEXT:
                raise DataError(f"a text of {len(text):,} characters: this tokenizer cannot encode it in pieces, and "
                                f"encodes at most {WHOLE_TEXT:,} at once; split the text into files")
            yield text
            return
        start = 0
        while len(text) - start > PIECE:
            cuts = [m.start() for m in _CUT.finditer(text, start + PIECE // 2, start + PIECE)]
            end = cuts[-1] if cuts else start + PIECE      # no line ends there: cut anyway (as GPT-2's does)
            yield text[start:end]
            start = end
        if start < len(text):
            yield text[start:]

    def decode(self, ids, skip_special: bool = False) -> str:
        return self.lib.decode(self.ids_of(ids), skip_special_tokens=skip_special)

    def encode_chunks(self, chunks, label):
        """Decoded incrementally; cut where encode cuts (a tokenizer that cannot: the whole text)."""
        cut = _CUT if self.cuts else _NEVER
        for text in utf8_pieces(chunks, label, cut, PIECE, False, "this model's tokenizer reads UTF-8 text"):
            yield self.encode(text)

    def hf_files(self, common):
        eos = self.lib.id_to_token(self.eos_id) if self.eos_id is not None else None
        config = dict(common, tokenizer_class="PreTrainedTokenizerFast")
        if eos is not None:
            config.update(eos_token=eos, pad_token=eos)
        return config, {"tokenizer.json": self.json.encode("utf-8")}
