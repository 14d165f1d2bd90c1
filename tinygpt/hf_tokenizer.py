"""The tokenizer and generation files of a Hugging Face export, and their check on import.

GPT-2's BPE (tiktoken's r50k_base) is written as GPT-2's own `vocab.json` and `merges.txt`:
each token's bytes in GPT-2's byte-to-character alphabet, and the merges rebuilt from the ranks
(a token of rank r is the one merge of two tokens that BPE with the ranks below r leaves it as).
The byte vocabulary (id = byte) is a `tokenizer.json` for Hugging Face's tokenizers library: a
BPE without merges over the same byte alphabet, each character's id its byte, the ByteLevel
decoder putting the bytes back. Both are what `AutoTokenizer.from_pretrained` loads as it is.
"""
from __future__ import annotations

import json
from pathlib import Path

from .checkpoint import CheckpointError
from .core.config import Config
from .core.fs import read_user_file
from .outputs import WRITER

EOT = "<|endoftext|>"
MAX_TOKENIZER_BYTES = 64 << 20       # GPT-2's tokenizer.json is 1.4 MB, its vocab.json 1.0 MB


def byte_alphabet() -> dict[int, str]:
    """GPT-2's map of the 256 bytes to printable characters (the printable ones stand for
    themselves, the rest take the characters from U+0100 on), which every byte-level BPE shares."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    chars, n = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + n)
            n += 1
    return chars


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


def byte_tokenizer_json() -> dict:
    """The byte vocabulary as a tokenizers-library file: 256 ids, each its byte."""
    alpha = byte_alphabet()
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": [], "normalizer": None,
            "pre_tokenizer": byte_level, "post_processor": None, "decoder": dict(byte_level),
            "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                      "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                      "vocab": {alpha[b]: b for b in range(256)}, "merges": []}}


def tokenizer_files(name: str, tokenizer, cfg: Config) -> dict[str, bytes]:
    """The files beside config.json that make the directory a whole text model: the tokenizer
    (name byte or gpt2, tokenizer the one it names) and generation_config.json."""
    common = {"model_max_length": cfg.ctx, "clean_up_tokenization_spaces": False, "tinygpt_writer": WRITER}
    if name == "gpt2":
        vocab, merges = gpt2_vocab_merges(tokenizer.enc._mergeable_ranks)
        vocab[EOT] = 50256
        config = dict(common, tokenizer_class="GPT2Tokenizer", add_prefix_space=False, bos_token=EOT, eos_token=EOT,
                      unk_token=EOT)
        files = {"vocab.json": json.dumps(vocab, ensure_ascii=False).encode(),
                 "merges.txt": ("#version: 0.2\n" + "\n".join(merges) + "\n").encode()}
    else:
        config = dict(common, tokenizer_class="PreTrainedTokenizerFast")
        files = {"tokenizer.json": json.dumps(byte_tokenizer_json(), ensure_ascii=False).encode()}
    files["tokenizer_config.json"] = json.dumps(config, indent=2).encode()
    files["generation_config.json"] = json.dumps(generation_config(name, cfg), indent=2).encode()
    return files


def generation_config(name: str, cfg: Config) -> dict:
    """What transformers' generate does by default with the export: what `tinygpt sample` does at
    temperature 0 (greedy), up to the context (GPT-2 has no positions past it)."""
    eos = 50256 if name == "gpt2" else None
    return {"do_sample": False, "max_length": cfg.ctx, "bos_token_id": eos, "eos_token_id": eos,
            "pad_token_id": eos if eos is not None else 0}


def read_tokenizer(d: Path, vocab: int) -> str | None:
    """The tokenizer a Hugging Face directory's files describe, checked against the vocabulary
    tinygpt would use for it: "byte" or "gpt2", or None where the directory has no tokenizer
    files (the vocabulary's size decides then). A tokenizer tinygpt cannot reproduce is refused."""
    label = lambda f: f"{d / f}"
    read = lambda f: json.loads(read_user_file(d / f, CheckpointError, label(f), "a tokenizer file",
                                               MAX_TOKENIZER_BYTES, "64 MiB").decode("utf-8"))
    try:
        if (d / "vocab.json").exists():
            got = read("vocab.json")
            alpha = byte_alphabet()
            ok = isinstance(got, dict) and len(got) == vocab == 50257 and got.get(EOT) == 50256
            # r50k_base's first 256 ranks are the bytes, those its alphabet shows as themselves first
            order = sorted(range(256), key=lambda b: (b not in _PRINTABLE, b))
            ok = ok and all(got.get(alpha[b]) == i for i, b in enumerate(order))
            if not ok:
                raise CheckpointError(f"{label('vocab.json')}: not GPT-2's vocabulary (r50k_base); tinygpt tokenizes "
                                      "with GPT-2's BPE or with bytes, and cannot import another tokenizer")
            return "gpt2"
        if (d / "tokenizer.json").exists():
            got = read("tokenizer.json")
            model = got.get("model", {}) if isinstance(got, dict) else {}
            bytes_only = model.get("vocab") == byte_tokenizer_json()["model"]["vocab"] and not model.get("merges")
            if vocab == 256 and bytes_only:
                return "byte"
            if vocab == 50257 and isinstance(model.get("vocab"), dict) and len(model["vocab"]) == 50257:
                return "gpt2"
            raise CheckpointError(f"{label('tokenizer.json')}: neither GPT-2's BPE nor the 256-byte vocabulary; "
                                  "tinygpt cannot import another tokenizer")
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{d}: a tokenizer file is not JSON ({e}); remove it or export the model again") from e
    return None


# the bytes GPT-2's alphabet shows as themselves: r50k_base ranks them first, in byte order
_PRINTABLE = set(range(ord("!"), ord("~") + 1)) | set(range(0xA1, 0xAD)) | set(range(0xAE, 0x100))
