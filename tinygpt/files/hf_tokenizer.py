"""The tokenizer and generation files of a Hugging Face export, and their check on import.

Each tokenizer writes its own files (its `hf_files`, in tinygpt/tokenizers/): GPT-2's BPE as
GPT-2's own `vocab.json` and `merges.txt`, the byte vocabulary as a `tokenizer.json` for Hugging
Face's tokenizers library; both are what `AutoTokenizer.from_pretrained` loads as it is. Here:
the config files around them, and the check of a directory's files on import.
"""
from __future__ import annotations

import json
from pathlib import Path

from .checkpoint import CheckpointError
from ..core.config import Config
from ..core.fs import read_user_file
from .outputs import WRITER
from ..tokenizers.base import PRINTABLE, byte_alphabet
from ..tokenizers.byte import byte_tokenizer_json
from ..tokenizers.gpt2 import EOT

MAX_TOKENIZER_BYTES = 64 << 20       # GPT-2's tokenizer.json is 1.4 MB, its vocab.json 1.0 MB


def tokenizer_files(tokenizer, cfg: Config) -> dict[str, bytes]:
    """The files beside config.json that make the directory a whole text model: the tokenizer's
    own (its hf_files) with their tokenizer_config.json, and generation_config.json."""
    # padding on the left: a batch of prompts generates from each one's last token (a decoder-only
    # model continues the end of its input)
    common = {"model_max_length": cfg.ctx, "clean_up_tokenization_spaces": False, "padding_side": "left",
              "tinygpt_writer": WRITER}
    config, files = tokenizer.hf_files(common)
    files["tokenizer_config.json"] = json.dumps(config, indent=2).encode()
    files["generation_config.json"] = json.dumps(generation_config(tokenizer, cfg), indent=2).encode()
    return files


def generation_config(tokenizer, cfg: Config) -> dict:
    """What transformers' generate does by default with the export: what `tinygpt sample` does at
    temperature 0 (greedy), up to the context (GPT-2 has no positions past it)."""
    eos = tokenizer.eos_id
    return {"do_sample": False, "max_length": cfg.ctx, "bos_token_id": eos, "eos_token_id": eos,
            "pad_token_id": tokenizer.pad_id}


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
            order = sorted(range(256), key=lambda b: (b not in PRINTABLE, b))
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


