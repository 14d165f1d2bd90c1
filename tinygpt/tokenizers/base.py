"""What a tokenizer is. Each tokenizer is one class in a module of its own here, registered once
in __init__; nothing outside this package compares a tokenizer's name: it asks the tokenizer.

A tokenizer holds its name (the .tinygpt file's tinygptPy.tokenizer), its vocabulary, what the
file's upstream header calls its source, whether a token is a byte (then a loss in nats is also
shown in bits per byte), its end-of-text id, how it encodes a text read in chunks (`prepare`'s
token files, never the whole text in memory), and the Hugging Face files that describe it.
"""
from __future__ import annotations

import codecs
import re
from typing import Iterator

import numpy as np

from ..core.errors import UsageError
from ..files.data import DataError


def byte_alphabet() -> dict[int, str]:
    """GPT-2's map of the 256 bytes to printable characters (the printable ones stand for
    themselves, the rest take the characters from U+0100 on), which every byte-level BPE shares."""
    keep = set(PRINTABLE)
    chars, n = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + n)
            n += 1
    return chars


def utf8_pieces(chunks: Iterator[bytes], label: str, cut: re.Pattern, piece: int, force: bool, needs: str):
    """The text of consecutive byte chunks (an empty one ends it), decoded incrementally, in pieces
    cut only where `cut` matches in the later part of what is pending once it holds 2 x piece
    characters (force: cut anyway where nothing matches there), so that their tokens are the whole
    text's; needs: what the error says of bad UTF-8."""
    decoder = codecs.getincrementaldecoder("utf-8")("strict")
    pending, done = "", 0
    for raw in chunks:
        try:
            pending += decoder.decode(raw, final=not raw)
        except UnicodeDecodeError as e:
            raise DataError(f"{label}: not valid UTF-8 near byte {done + e.start:,}; {needs}") from e
        done += len(raw)
        if not raw:
            break
        if len(pending) > 2 * piece:            # keep what follows the last cut for the next read
            end = None
            for m in cut.finditer(pending, len(pending) - min(len(pending) // 2, 1 << 16)):
                end = m.start()
            end = end or (len(pending) - 1 if force else None)
            if end:
                yield pending[:end]
                pending = pending[end:]
    if pending:
        yield pending


# the bytes GPT-2's alphabet shows as themselves: r50k_base ranks them first, in byte order
PRINTABLE = tuple(range(ord("!"), ord("~") + 1)) + tuple(range(0xA1, 0xAD)) + tuple(range(0xAE, 0x100))


class Tokenizer:
    name = ""
    summary = ""                    # the tokenizer option's help
    vocab = 0
    source: str | None = None       # the upstream header's tokenizerSource, where it names one
    sources: tuple = ()             # the tokenizerSource values an upstream file names it by
    token_is_byte = False           # a loss per token is a loss per byte: bits per byte are shown
    eos_id: int | None = None       # end of text, which Hugging Face's generate stops at
    pad_id = 0                      # what pads a batch in Hugging Face's tokenizer (masked out)
    choosable = True                # an option may name it (the one an imported model brings is not)

    @classmethod
    def load(cls, tokenizer_file: str | None = None) -> Tokenizer:
        """The tokenizer, ready to encode (tokenizer_file: where its files are, for one that has any)."""
        return cls()

    @classmethod
    def from_record(cls, record: dict, vocab: int, tokenizer_file: str | None = None) -> Tokenizer:
        """The tokenizer a model's file records (`record`'s fields), for a vocabulary of `vocab`."""
        return cls.load(tokenizer_file)

    def record(self) -> dict:
        """What a model's file records of its tokenizer (the header's tinygptPy fields)."""
        return {"tokenizer": self.name} | ({"tokenizerSource": self.source} if self.source else {})

    @property
    def key(self) -> str:
        """What a token file names its tokenizer by: tokens of another key are not this one's."""
        return self.name

    def encode(self, data: bytes | str) -> np.ndarray:
        raise NotImplementedError

    def decode(self, ids, skip_special: bool = False) -> str:
        """The text of ids; skip_special: without the special tokens (a chat reply's), where the
        tokenizer has any."""
        raise NotImplementedError

    @staticmethod
    def text_of(data) -> bytes | str:
        """encode's argument, checked: text or bytes, not a number or None (a raw TypeError otherwise)."""
        if not isinstance(data, (str, bytes)):
            raise UsageError(f"encode: give text (str or bytes), got {type(data).__name__}")
        return data

    def utf8_of(self, data, needs: str) -> str:
        """encode's argument as text: bytes decoded as UTF-8 (needs: what the error says of bad bytes)."""
        data = self.text_of(data)
        try:
            if isinstance(data, bytes):
                return data.decode("utf-8")
            data.encode("utf-8")          # a command line's bytes that are not UTF-8 come as lone surrogates
            return data
        except UnicodeDecodeError as e:
            raise DataError(f"the text is not valid UTF-8 (byte {e.start}); {needs}") from e
        except UnicodeEncodeError as e:
            raise DataError(f"the text holds bytes that are not UTF-8 (character {e.start}); {needs}") from e

    def ids_of(self, ids) -> list[int]:
        """decode's argument, checked: whole numbers in this vocabulary, in any shape read in order (a
        NumPy, tiktoken or bytes() error otherwise, or a float silently cut to an int)."""
        try:
            a = np.asarray(ids).reshape(-1)
        except (ValueError, TypeError):
            raise UsageError("decode: token ids must be a list (or array) of whole numbers, rows of one "
                             "length") from None
        if a.size and (not np.issubdtype(a.dtype, np.integer) or a.min() < 0 or a.max() >= self.vocab):
            what = f"{a.dtype} values" if not np.issubdtype(a.dtype, np.integer) else f"{a.min()} to {a.max()}"
            raise UsageError(f"decode: token ids must be whole numbers 0 to {self.vocab - 1}, got {what}")
        return a.tolist()

    def encode_chunks(self, chunks: Iterator[bytes], label: str) -> Iterator[np.ndarray]:
        """Token arrays of a text that arrives as consecutive byte chunks (an empty one ends it),
        equal to the whole text's tokens; label names the text in errors."""
        raise NotImplementedError

    def hf_files(self, common: dict) -> tuple[dict, dict[str, bytes]]:
        """(tokenizer_config.json's fields, the tokenizer's own files) of a Hugging Face export;
        common: the fields every tokenizer's config carries."""
        raise NotImplementedError

    def byte_level_bpe(self) -> tuple[dict, set, list, dict | None] | None:
        """(token by id, the special tokens' ids, merges as "a b", the pre-tokenizer's record or
        None for GPT-2's split) of a byte-level BPE, what a GGUF file's gpt2 tokenizer holds; None
        for a tokenizer that is not one."""
        return None
