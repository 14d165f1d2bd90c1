"""GPT-2's BPE: tiktoken's r50k_base (50,257 tokens), offline from tiktoken's cache or a file.

A long text is encoded in pieces cut where GPT-2's pre-tokenizer cuts anyway, so memory stays
bounded and the tokens equal the whole text's. Its Hugging Face files are GPT-2's own
`vocab.json` and `merges.txt`: each token's bytes in GPT-2's byte-to-character alphabet, and the
merges rebuilt from the ranks (a token of rank r is the one merge of two tokens that BPE with the
ranks below r leaves it as).
"""
from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import socket
import tempfile
from pathlib import Path

import numpy as np

from ..core.config import GPT2_VOCAB
from ..core.fs import read_user_file
from ..files.data import DataError, progress
from .base import Tokenizer, byte_alphabet, utf8_pieces

R50K_URL = "https://openaipublic.blob.core.windows.net/encodings/r50k_base.tiktoken"
R50K_SHA256 = "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"
EOT = "<|endoftext|>"
PIECE = 1 << 20      # characters tokenized at once
_CUT = re.compile(r"(?<=\S)(?= \S)|(?<=\S\n)(?=\S)")    # before " x" after a non-space; after "x\n" before one


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


def gpt2_vocab_merges(ranks: dict[bytes, int]) -> tuple[dict[str, int], list[str]]:
    """(vocab.json, merges.txt's lines) of a byte-level BPE given as tiktoken's ranks."""
    alpha = byte_alphabet()
    show = lambda b: "".join(alpha[x] for x in b)
    vocab = {show(tok): rank for tok, rank in ranks.items()}
    merges = []
    for tok, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
        if len(tok) < 2:
            continue
        parts = [bytes([b]) for b in tok]
        while len(parts) > 2:          # BPE with the merges made before this token's
            best = min(range(len(parts) - 1), key=lambda i: ranks.get(parts[i] + parts[i + 1], 1 << 62))
            if ranks.get(parts[best] + parts[best + 1], 1 << 62) >= rank:
                break
            parts[best:best + 2] = [parts[best] + parts[best + 1]]
        if len(parts) != 2:
            raise ValueError(f"token {rank} is not one merge of two earlier tokens")
        merges.append(f"{show(parts[0])} {show(parts[1])}")
    return vocab, merges


class GPT2Tokenizer(Tokenizer):
    name = "gpt2"
    summary = "GPT-2's BPE, r50k_base, vocab 50,257"
    vocab = GPT2_VOCAB
    source = "r50k_base"
    sources = ("r50k_base", "gpt2", "openai-community/gpt2")
    eos_id = pad_id = 50256

    def __init__(self, enc, source: str = "r50k_base"):
        self.enc, self.source = enc, source

    @classmethod
    def load(cls, tokenizer_file: str | None = None) -> GPT2Tokenizer:
        """From tokenizer_file (tiktoken's r50k_base.tiktoken, its hash checked), else tiktoken's
        cache (or its download, 15 s at most)."""
        if tokenizer_file:
            return cls(_encoding_from_file(tokenizer_file))
        import tiktoken
        cached = tiktoken_cache_path().exists()
        old = socket.getdefaulttimeout()
        socket.setdefaulttimeout(15)  # a blocked network should fail fast, not hang
        try:
            return cls(tiktoken.get_encoding("r50k_base"))
        except Exception as e:
            where = "its cached copy is unusable" if cached else "it is not cached and could not be downloaded"
            raise DataError(f"the gpt2 tokenizer needs tiktoken's r50k_base.tiktoken, and {where} "
                            f"({type(e).__name__}); put the file in the directory named by TIKTOKEN_CACHE_DIR (as "
                            "tiktoken caches it), or pass it with {opt:tokenizer_file} PATH") from e
        finally:
            socket.setdefaulttimeout(old)

    def encode(self, data: bytes | str) -> np.ndarray:
        """Token ids of a text, in pieces of at most PIECE characters cut where GPT-2's
        pre-tokenizer cuts anyway, so memory stays bounded whatever the text's lines."""
        data = self.utf8_of(data, "the gpt2 tokenizer needs UTF-8: convert the file, or use {opt:tokenizer} byte")
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

    def decode(self, ids, skip_special: bool = False) -> str:
        return self.enc.decode_bytes(self.ids_of(ids)).decode("utf-8", errors="replace")

    def encode_chunks(self, chunks, label):
        """Decoded incrementally and cut only where the pre-tokenizer cuts anyway (_CUT); with no cut
        anywhere near the end, cut there (text_pieces does too)."""
        needs = "the gpt2 tokenizer needs UTF-8: convert the file, or use {opt:tokenizer} byte"
        for text in utf8_pieces(chunks, label, _CUT, PIECE, True, needs):
            yield self.encode(text)

    def hf_files(self, common):
        vocab, merges = gpt2_vocab_merges(self.enc._mergeable_ranks)
        vocab[EOT] = self.eos_id
        config = dict(common, tokenizer_class="GPT2Tokenizer", add_prefix_space=False, bos_token=EOT, eos_token=EOT,
                      unk_token=EOT, pad_token=EOT)        # GPT-2 has no pad token: its end of text pads, masked
        return config, {"vocab.json": json.dumps(vocab, ensure_ascii=False).encode(),
                        "merges.txt": ("#version: 0.2\n" + "\n".join(merges) + "\n").encode()}


    def byte_level_bpe(self):
        vocab, merges = gpt2_vocab_merges(self.enc._mergeable_ranks)
        vocab[EOT] = self.eos_id
        return {i: t for t, i in vocab.items()}, {self.eos_id}, list(merges), None


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
