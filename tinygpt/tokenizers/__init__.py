"""The tokenizers, each one in its own module (base.py says what a tokenizer holds), registered
here once. Nothing outside this package compares a tokenizer's name.

    byte   each byte its token (256)            byte.py
    gpt2   GPT-2's BPE, tiktoken's r50k_base    gpt2.py
    hf     a Hugging Face tokenizer.json         hf.py    (an imported model's: its file holds it)
"""
from __future__ import annotations

from ..files.data import DataError
from .base import Tokenizer
from .byte import ByteTokenizer
from .gpt2 import GPT2Tokenizer
from .hf import HFTokenizer

KINDS = {k.name: k for k in (ByteTokenizer, GPT2Tokenizer, HFTokenizer)}
NAMES = tuple(n for n, k in KINDS.items() if k.choosable)      # those an option may name
DEFAULT = ByteTokenizer.name                    # a preset's unless core.config.PRESET_TOKENIZER names another
BY_VOCAB = {KINDS[n].vocab: n for n in NAMES}   # the tokenizer a vocabulary's size implies
# the tokenizer of a TinyGPT file that names none and whose vocabulary is not another's: its BPE
UPSTREAM = GPT2Tokenizer.name


def kind(name: str) -> type[Tokenizer]:
    """The kind a name (or a token file's key: hf:HASH) names."""
    base = name.partition(":")[0] if isinstance(name, str) else name
    if base not in KINDS:
        raise DataError(f"unknown tokenizer {name!r}; choose {' or '.join(NAMES)}")
    return KINDS[base]


def of_record(record: dict, vocab: int, tokenizer_file: str | None = None) -> Tokenizer:
    """The tokenizer a model's file records (its tinygptPy fields), or TinyGPT's by vocabulary."""
    name = record.get("tokenizer", by_vocab(vocab, UPSTREAM))
    return kind(name).from_record(record, vocab, tokenizer_file)


def get_tokenizer(name: str = DEFAULT, tokenizer_file: str | None = None) -> Tokenizer:
    """The tokenizer `name` names, ready to encode (GPT-2's from tokenizer_file, else tiktoken's cache)."""
    return kind(name).load(tokenizer_file)


def flag_help() -> str:
    return " or ".join(f"{KINDS[n].name} ({KINDS[n].summary})" for n in NAMES)


def by_vocab(vocab: int, default: str | None = None) -> str | None:
    """The tokenizer whose vocabulary has this size (TinyGPT's files name theirs only by size)."""
    return BY_VOCAB.get(vocab, default)


__all__ = ["BY_VOCAB", "DEFAULT", "UPSTREAM", "KINDS", "NAMES", "ByteTokenizer", "GPT2Tokenizer", "HFTokenizer",
           "Tokenizer", "by_vocab", "flag_help", "get_tokenizer", "kind", "of_record"]
