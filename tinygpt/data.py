"""Corpora and tokenizers, the 90/10 split and batch sampling.

The built-in corpus needs no download: the English text of Python's own
reference documentation (`pydoc_data.topics`, about 465 KB, shipped with
CPython), with the standard library's source as a fallback.
"""
from __future__ import annotations

import base64
import hashlib
import os
import re
import socket
import sys
import tempfile
from pathlib import Path

import numpy as np

from .core.config import GPT2_VOCAB
from .core.errors import TinyGPTError
from .core.fs import available_memory, read_user_file

R50K_URL = "https://openaipublic.blob.core.windows.net/encodings/r50k_base.tiktoken"
R50K_SHA256 = "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"


class DataError(TinyGPTError, ValueError):
    pass


def max_corpus_bytes() -> int:
    """The largest text file we read: tokens take up to 16 bytes per input byte on the way
    (uint32 ids, tiktoken's Python ints), so a sixteenth of free memory, and 4 GiB at most."""
    return min(4 << 30, available_memory() // 16)


# ---- corpora ---------------------------------------------------------------------------------
def builtin_corpus() -> bytes:
    try:
        from pydoc_data.topics import topics
        text = "\n\n".join(topics[k] for k in sorted(topics))
        if len(text) > 100_000:
            return text.encode("utf-8")
    except ImportError:
        pass
    import textwrap, difflib, calendar  # noqa: E401 - modules whose source we read as text
    parts = [Path(m.__file__).read_text("utf-8") for m in (textwrap, difflib, calendar)]
    return "\n\n".join(parts).encode("utf-8")


def read_corpus(path: str | None) -> tuple[bytes, str]:
    """(raw bytes, a name for logs). Errors say what is wrong and what to do."""
    if path is None:
        return builtin_corpus(), "built-in (Python's reference documentation)"
    raw = read_user_file(path, DataError, f"{{opt:data}} {path}",
                         "a UTF-8 text file, or leave {opt:data} out for the built-in corpus",
                         max_corpus_bytes(), "a sixteenth of free memory, at most 4 GiB")
    if not raw:
        raise DataError(f"{{opt:data}} {path}: the file is empty; give a text file with some content")
    return raw, str(path)


# ---- tokenizers ------------------------------------------------------------------------------
class ByteTokenizer:
    name = "byte"
    vocab = 256

    def encode(self, data: bytes | str) -> np.ndarray:
        if isinstance(data, str):      # a command line's bytes that are not UTF-8 come back as they were
            data = data.encode("utf-8", "surrogateescape")
        return np.frombuffer(data, np.uint8).astype(np.uint32)

    def decode(self, ids) -> str:
        return bytes(int(i) for i in ids).decode("utf-8", errors="replace")


PIECE = 1 << 20      # characters tokenized at once


def text_pieces(text: str, size: int):
    """text in consecutive pieces of at most `size` characters, each cut before a space or after a
    newline that sits between two non-spaces: GPT-2's pre-tokenizer splits there too, so the
    pieces' tokens are the whole text's. A text with no such place is cut every `size`."""
    start = 0
    while len(text) - start > size:
        lo, hi = start + size // 2, start + size
        cuts = [m.start() for m in _CUT.finditer(text, lo, hi)]
        end = cuts[-1] if cuts and cuts[-1] > start else hi
        yield text[start:end]
        start = end
    if start < len(text):
        yield text[start:]


_CUT = re.compile(r"(?<=\S)(?= \S)|(?<=\S\n)(?=\S)")    # before " x" after a non-space; after "x\n" before one


def progress(total: int, what: str, unit: str = "B", disable: bool = False, shown_from: int = 0):
    """A tqdm bar on stderr (tqdm: rate and time left, well kept) counting whole units: bytes shown
    as kB, MB, ... of 1,024; any other unit with k and M. shown_from: below this total, a bar only
    on a terminal (work that ends at once need not fill a log with it)."""
    from tqdm import tqdm
    small = total < shown_from and not getattr(sys.stderr, "isatty", lambda: False)()
    return tqdm(total=total, desc=what, unit=unit, unit_scale=True, unit_divisor=1024 if unit == "B" else 1000,
                leave=False, disable=disable or small, dynamic_ncols=True, file=sys.stderr)


class GPT2Tokenizer:
    name = "gpt2"
    vocab = GPT2_VOCAB

    def __init__(self, enc, source: str):
        self.enc, self.source = enc, source

    def encode(self, data: bytes | str) -> np.ndarray:
        """Token ids of a text, in pieces of at most PIECE characters cut where GPT-2's
        pre-tokenizer cuts anyway, so memory stays bounded whatever the text's lines."""
        if isinstance(data, bytes):
            try:
                data = data.decode("utf-8")
            except UnicodeDecodeError as e:
                raise DataError(f"the text is not valid UTF-8 (byte {e.start}); the gpt2 tokenizer needs UTF-8: "
                                "convert the file, or use {opt:tokenizer} byte") from e
        else:
            try:
                data.encode("utf-8")
            except UnicodeEncodeError as e:
                raise DataError("the text holds bytes that are not UTF-8; a gpt2 model reads UTF-8 text only "
                                "(a byte-level model takes any bytes)") from e
        pieces = list(text_pieces(data, PIECE))
        bar = progress(len(data), "tokenizing", "char") if len(pieces) > 8 else None
        out = []
        for piece in pieces:
            out.append(np.asarray(self.enc.encode(piece, disallowed_special=()), np.uint32))
            if bar:
                bar.update(len(piece))
        if bar:
            bar.close()
        return np.concatenate(out) if out else np.zeros(0, np.uint32)

    def decode(self, ids) -> str:
        return self.enc.decode_bytes([int(i) for i in ids]).decode("utf-8", errors="replace")


def _encoding_from_file(path: str):
    import tiktoken
    import tiktoken_ext.openai_public as op  # r50k's split pattern
    raw = read_user_file(path, DataError, f"{{opt:tokenizer_file}} {path}", "tiktoken's r50k_base.tiktoken",
                         16 << 20, "r50k_base.tiktoken has 1.6 MB")
    digest = hashlib.sha256(raw).hexdigest()
    if digest != R50K_SHA256:
        raise DataError(f"{{opt:tokenizer_file}} {path}: sha256 {digest[:12]}... is not r50k_base.tiktoken's "
                        f"({R50K_SHA256[:12]}...); give the right file")
    ranks = {base64.b64decode(tok): int(rank) for tok, rank in (ln.split() for ln in raw.splitlines() if ln)}
    return tiktoken.Encoding(name="r50k_base", pat_str=op.r50k_pat_str, mergeable_ranks=ranks,
                             special_tokens={"<|endoftext|>": 50256}, explicit_n_vocab=50257)


def tiktoken_cache_path() -> Path:
    d = os.environ.get("TIKTOKEN_CACHE_DIR") or os.environ.get("DATA_GYM_CACHE_DIR") \
        or os.path.join(tempfile.gettempdir(), "data-gym-cache")
    return Path(d) / hashlib.sha1(R50K_URL.encode()).hexdigest()


def get_tokenizer(name: str = "byte", tokenizer_file: str | None = None):
    if name == "byte":
        return ByteTokenizer()
    if name != "gpt2":
        raise DataError(f"unknown tokenizer {name!r}; choose byte or gpt2")
    if tokenizer_file:
        return GPT2Tokenizer(_encoding_from_file(tokenizer_file), "r50k_base")
    import tiktoken
    cached = tiktoken_cache_path().exists()
    old = socket.getdefaulttimeout()
    socket.setdefaulttimeout(15)  # a blocked network should fail fast, not hang
    try:
        return GPT2Tokenizer(tiktoken.get_encoding("r50k_base"), "r50k_base")
    except Exception as e:
        where = "its cached copy is unusable" if cached else "it is not cached and could not be downloaded"
        raise DataError(f"the gpt2 tokenizer needs tiktoken's r50k_base.tiktoken, and {where} ({type(e).__name__}); "
                        "put the file in the directory named by TIKTOKEN_CACHE_DIR (as tiktoken caches it), "
                        "or pass it with {opt:tokenizer_file} PATH") from e
    finally:
        socket.setdefaulttimeout(old)


# ---- the token stream ------------------------------------------------------------------------
class Dataset:
    """A token stream split 90/10 (TinyGPT: validation from floor(0.9 n) on). tokens: an array, or
    a token file's memory map, which stays one: windows are read as they are drawn, and with vocab
    their ids are checked then (a file is never read whole to check it)."""

    def __init__(self, tokens: np.ndarray, ctx: int, name: str = "", vocab: int | None = None):
        self.tokens = tokens if isinstance(tokens, np.memmap) else np.asarray(tokens, np.uint32)
        self.ctx, self.name, self.vocab = ctx, name, vocab
        n = len(self.tokens)
        self.split = int(np.floor(0.9 * n))
        self.train, self.val = self.tokens[:self.split], self.tokens[self.split:]
        need = ctx + 1
        if len(self.train) < need or len(self.val) < need:
            minimum = 10 * need
            raise DataError(f"the data has {n:,} tokens: too short for one window of ctx+1 = {need} tokens in both "
                            f"the training (90%) and validation (10%) splits; give at least {minimum:,} tokens "
                            "(bytes with the byte tokenizer) or a smaller {opt:ctx}")

    def sample(self, rng: np.random.Generator, B: int):
        """B random windows of ctx+1 training tokens -> (x [B, T], y [B, T])."""
        starts = rng.integers(0, len(self.train) - self.ctx, B)
        w = self._checked(np.stack([self.train[s:s + self.ctx + 1] for s in starts]))
        return w[:, :-1], w[:, 1:]

    def _checked(self, w: np.ndarray) -> np.ndarray:
        """Windows as uint32, each id below the vocabulary (a damaged token file fails here, in one line)."""
        w = np.asarray(w, np.uint32)
        if self.vocab is not None and w.size and int(w.max()) >= self.vocab:
            raise DataError(f"{self.name}: holds token id {int(w.max()):,}, past the vocabulary of {self.vocab:,}; "
                            "the file is damaged or another tokenizer's: prepare it again")
        return w

    def val_windows(self, max_windows: int | None = None):
        """Consecutive non-overlapping windows of the validation split -> (x [N, T], y [N, T])."""
        n = (len(self.val) - 1) // self.ctx
        if max_windows:
            n = min(n, max_windows)
        need = 2 * n * self.ctx * 12                  # the windows' indices (int64) and ids (uint32), x and y
        if need > available_memory() // 4:
            raise DataError(f"{self.name}: its validation split has {n:,} windows, {need:,} bytes to gather, "
                            f"more than a quarter of free memory; evaluate fewer with {{opt:max_windows}}")
        idx = np.arange(n)[:, None] * self.ctx + np.arange(self.ctx)[None, :]
        return self._checked(self.val[idx]), self._checked(self.val[idx + 1])
