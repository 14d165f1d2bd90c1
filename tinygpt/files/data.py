"""Corpora, the 90/10 split and batch sampling (the tokenizers: tinygpt/tokenizers/).

The built-in corpus needs no download: the English text of Python's own
reference documentation (`pydoc_data.topics`, about 465 KB, shipped with
CPython), with the standard library's source as a fallback.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from ..core.errors import TinyGPTError
from ..core.fs import available_memory, read_user_file

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


def progress(total: int, what: str, unit: str = "B", disable: bool = False, shown_from: int = 0):
    """A tqdm bar on stderr (tqdm: rate and time left, well kept) counting whole units: bytes shown
    as kB, MB, ... of 1,024; any other unit with k and M. shown_from: below this total, a bar only
    on a terminal (work that ends at once need not fill a log with it)."""
    from tqdm import tqdm
    small = total < shown_from and not getattr(sys.stderr, "isatty", lambda: False)()
    return tqdm(total=total, desc=what, unit=unit, unit_scale=True, unit_divisor=1024 if unit == "B" else 1000,
                leave=False, disable=disable or small, dynamic_ncols=True, file=sys.stderr)


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

    def reply_prompt(self) -> None:
        """A text has no conversation for the end of a run to answer (its sample continues a prompt)."""
        return None

    def describe(self) -> str:
        return f"data: {self.name}: {len(self.tokens):,} tokens ({len(self.train):,} train, {len(self.val):,} val)"

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
