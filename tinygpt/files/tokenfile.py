"""Token files: a corpus tokenized once (`tinygpt prepare`), then memory-mapped by every run.

    corpus.bin        the token ids end to end, little-endian uint16 (uint32 for a vocabulary
                      over 65,536), nanoGPT's layout
    corpus.bin.json   the sidecar: the tokenizer and its vocabulary, the count, the dtype, each
                      source file's size and sha256, the 90/10 split

A run opens the pair by the sidecar: it checks the file's length against the count before it
maps it and never reads it whole (the windows it samples are read as they are drawn, and each
window's ids are checked against the vocabulary then), so a token file has no size limit but the
disk's. The data option takes a text file, a directory of text files, or a token file; open_dataset is
where that is decided.
"""
from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path

import numpy as np

from ..core.fs import atomic_write, atomic_writer, check_regular, read_most, read_user_file
from .data import DataError, Dataset, max_corpus_bytes, progress, read_corpus
from ..tokenizers import DEFAULT as DEFAULT_TOKENIZER
from ..tokenizers import Tokenizer, get_tokenizer

FORMAT = "tinygpt-tokens"
VERSION = 1
SIDECAR = ".json"                    # corpus.bin -> corpus.bin.json
CHUNK = 8 << 20                      # bytes of text read (and tokenized) at a time
MAX_SOURCES = 100_000                # files one prepare (or one data directory) takes
MAX_SIDECAR = 64 << 20
WRITER = "tinygpt"


def sidecar_of(path) -> Path:
    p = Path(path)
    return p.with_name(p.name + SIDECAR)


def is_token_file(path) -> bool:
    """Whether path is (meant as) a token file: it has a sidecar, or it is named .bin."""
    return path is not None and (Path(path).suffix == ".bin" or sidecar_of(path).exists())


def is_our_sidecar(path) -> bool:
    try:
        with open(path, "rb") as f:
            return json.loads(read_most(f, MAX_SIDECAR)).get("format") == FORMAT
    except (OSError, ValueError, AttributeError, UnicodeDecodeError):
        return False


def is_our_token_file(path) -> bool:
    """A token file may be replaced where its sidecar is ours (the pair is written together)."""
    return is_our_sidecar(sidecar_of(path))


def dtype_for(vocab: int) -> str:
    return "uint16" if vocab <= 1 << 16 else "uint32"


# ---- sources ---------------------------------------------------------------------------------
def text_files(paths, label: str = "{opt:data}") -> list[Path]:
    """Each path a text file, or a directory whose regular files (not hidden, any depth) are taken in
    sorted order, but for the token files prepare wrote there and their sidecars (which are not
    its text: prepare of DIR into DIR/corpus.bin, run twice, read its own output as text); at most
    MAX_SOURCES in all, checked while listing."""
    out = []
    for given in paths:
        p = Path(given)
        try:
            is_dir = stat.S_ISDIR(os.stat(p).st_mode)
        except OSError:
            is_dir = False
        if not is_dir:
            check_regular(p, DataError, f"{label} {p}", "a UTF-8 text file or a directory of them")
            out.append(p)
            continue
        found = []
        for root, dirs, files in os.walk(p):
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            for name in sorted(files):
                f = Path(root) / name
                if name.startswith(".") or not f.is_file() or is_our_token_file(f) or \
                        (name.endswith(SIDECAR) and is_our_sidecar(f)):
                    continue
                found.append(f)
                if len(out) + len(found) > MAX_SOURCES:
                    raise DataError(f"{label} {p}: more than {MAX_SOURCES:,} files; give fewer, or prepare them "
                                    "in parts")
        if not found:
            raise DataError(f"{label} {p}: the directory holds no files; give a directory of text files")
        out += found
    return out


def data_files(path) -> list[Path]:
    """The files reading `path` as data opens, the inputs no output may be: a token file and its
    sidecar, a directory's text files (text_files), a text file; none for the built-in corpus. A
    path that cannot be listed is itself: reading it will say why."""
    if path is None:
        return []
    if is_token_file(path):
        return [Path(path), sidecar_of(path)]
    try:
        return text_files([path])
    except DataError:
        return [Path(path)]


def read_directory(path, max_bytes: int) -> tuple[bytes, int]:
    """A directory of text files as one text, the files in sorted order, and how many files: their
    sizes summed and checked against max_bytes before any is read."""
    files = text_files([path])
    total = sum(f.stat().st_size for f in files)
    if total > max_bytes:
        raise DataError(f"{{opt:data}} {path}: its {len(files):,} files hold {total:,} bytes, more than the "
                        f"{max_bytes:,} a text corpus may (a sixteenth of free memory, at most 4 GiB); "
                        f"tokenize them once with: tinygpt prepare {path} {{opt:out}} corpus.bin, "
                        "then {opt:data} corpus.bin")
    return b"".join(read_user_file(f, DataError, f"{{opt:data}} {f}", "a text file", max_bytes) for f in files), \
        len(files)


# ---- prepare -----------------------------------------------------------------------------------
def _pieces(f, tok, label: str, hasher):
    """Token arrays of one open text file, read CHUNK bytes at a time (each chunk hashed): the
    tokenizer's encode_chunks, whose tokens equal the whole text's."""
    def chunks():
        while True:
            raw = f.read(CHUNK)
            hasher.update(raw)
            yield raw
            if not raw:
                return
    return tok.encode_chunks(chunks(), label)


def prepare(sources, out, tokenizer=DEFAULT_TOKENIZER, tokenizer_file: str | None = None,
            show_progress=True) -> dict:
    """Tokenize the text files (and directories of them) in `sources`, in order, into the token file
    `out` and its sidecar, both written atomically (the token file first: a sidecar names only a
    whole file). tokenizer: a name, or a Tokenizer (a model's own). Returns the sidecar."""
    tok = tokenizer if isinstance(tokenizer, Tokenizer) else get_tokenizer(tokenizer, tokenizer_file)
    files = text_files(sources, "prepare:")
    dtype = np.dtype(dtype_for(tok.vocab)).newbyteorder("<")
    total = sum(f.stat().st_size for f in files)
    bar = progress(total, f"tokenizing {len(files)} file{'s' * (len(files) > 1)}") if show_progress else None
    record, count = [], 0
    with atomic_writer(out) as w:
        for f in files:
            label = f"prepare: {f}"
            hasher, n0, read0 = hashlib.sha256(), count, 0
            with open(f, "rb") as src:
                pieces = _pieces(src, tok, label, hasher)
                while True:
                    try:               # a failed read is the input's; a failed write (below) the output's
                        ids = next(pieces)
                    except StopIteration:
                        break
                    except OSError as e:
                        raise DataError(f"{label}: cannot read it ({e.strerror})") from e
                    w.write(np.asarray(ids, dtype).tobytes())
                    count += len(ids)
                    if bar:
                        pos = src.tell()
                        bar.update(pos - read0)
                        bar.set_postfix_str(f"{count:,} tokens", refresh=False)
                        read0 = pos
            record.append({"path": str(f), "bytes": f.stat().st_size, "sha256": hasher.hexdigest(),
                           "tokens": count - n0})
    if bar:
        bar.close()
    split = int(np.floor(0.9 * count))
    side = {"format": FORMAT, "version": VERSION, "writer": WRITER, "tokenizer": tok.key, "vocab": tok.vocab,
            "dtype": dtype.name, "tokens": count, "sources": record,
            "split": {"train": split, "val": count - split, "rule": "validation from floor(0.9 n) on"}}
    atomic_write(sidecar_of(out), (json.dumps(side, indent=1) + "\n").encode())
    return side


# ---- reading -------------------------------------------------------------------------------------
def read_sidecar(path) -> dict:
    """The sidecar of token file `path`, checked field by field (one-line errors)."""
    sc = sidecar_of(path)
    label = f"{{opt:data}} {path}"
    if not sc.exists():
        raise DataError(f"{label}: no sidecar {sc.name} beside it, so its tokens cannot be read; make the pair "
                        f"with: tinygpt prepare TEXT {{opt:out}} {path}")
    raw = read_user_file(sc, DataError, f"{label}'s sidecar {sc}", "the .json that tinygpt prepare wrote",
                         MAX_SIDECAR)
    try:
        side = json.loads(raw)
        assert isinstance(side, dict) and side.get("format") == FORMAT
    except (ValueError, AssertionError, RecursionError) as e:
        raise DataError(f"{label}: {sc.name} is not a tinygpt token file's sidecar; make the pair with: "
                        f"tinygpt prepare TEXT {{opt:out}} {path}") from e
    if side.get("version") != VERSION:
        raise DataError(f"{label}: sidecar version {side.get('version')!r}; this tinygpt reads version {VERSION}")
    n, vocab, dtype = side.get("tokens"), side.get("vocab"), side.get("dtype")
    ok = lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0
    if not (ok(n) and ok(vocab) and vocab > 0 and dtype in ("uint16", "uint32") and dtype == dtype_for(vocab)):
        raise DataError(f"{label}: its sidecar's tokens, vocab or dtype are not what tinygpt prepare writes; "
                        "prepare the file again")
    return side


def open_tokens(path, tok) -> tuple[np.memmap, dict]:
    """The token file as a read-only memory map (nothing read yet), after its sidecar and its length
    are checked, and its tokenizer against the run's."""
    side = read_sidecar(path)
    label = f"{{opt:data}} {path}"
    if side["tokenizer"] != tok.key or side["vocab"] != tok.vocab:
        how = f"{{opt:tokenizer}} {tok.name}" if tok.choosable else "{opt:model} set to this model's file"
        raise DataError(f"{label}: tokenized with {side['tokenizer']} ({side['vocab']:,} ids), but this model reads "
                        f"{tok.key} ({tok.vocab:,}); prepare it with {how}, or train a {side['tokenizer']} model")
    st = check_regular(path, DataError, label, "the token file that tinygpt prepare wrote")
    size = np.dtype(side["dtype"]).itemsize
    if st.st_size != side["tokens"] * size:
        raise DataError(f"{label}: {st.st_size:,} bytes, but its sidecar counts {side['tokens']:,} tokens of "
                        f"{size} bytes ({side['tokens'] * size:,}); the file is damaged or not the sidecar's: "
                        "prepare it again")
    if side["tokens"] == 0:
        raise DataError(f"{label}: holds no tokens; prepare it from a text with some content")
    tokens = np.memmap(path, dtype=np.dtype(side["dtype"]).newbyteorder("<"), mode="r", shape=(side["tokens"],))
    return tokens, side


def open_dataset(path, tok, ctx: int) -> Dataset:
    """The run's token stream from the data option: a token file (memory-mapped), a directory of text files,
    a text file, or (None) the built-in corpus; the last three are tokenized here."""
    if is_token_file(path):
        tokens, side = open_tokens(path, tok)
        return Dataset(tokens, ctx, f"{path} ({side['tokenizer']} tokens, prepared)", vocab=tok.vocab)
    if path is not None and os.path.isdir(path):
        raw, count = read_directory(path, max_corpus_bytes())
        name = f"{path} ({count:,} files)"
    else:
        raw, name = read_corpus(path)
    if not raw:
        raise DataError(f"{{opt:data}} {path}: the files are empty; give text with some content")
    return Dataset(tok.encode(raw), ctx, name)
