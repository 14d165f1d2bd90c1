"""The byte tokenizer: each byte is its token (256), TinyGPT's own."""
from __future__ import annotations

import json

import numpy as np

from .base import Tokenizer, byte_alphabet


def byte_tokenizer_json() -> dict:
    """The byte vocabulary as a tokenizers-library file: 256 ids, each its byte (a BPE without
    merges over GPT-2's byte alphabet, the ByteLevel decoder putting the bytes back)."""
    alpha = byte_alphabet()
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": [], "normalizer": None,
            "pre_tokenizer": byte_level, "post_processor": None, "decoder": dict(byte_level),
            "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                      "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                      "vocab": {alpha[b]: b for b in range(256)}, "merges": []}}


class ByteTokenizer(Tokenizer):
    name = "byte"
    summary = "each byte a token, vocab 256"
    vocab = 256
    token_is_byte = True

    def encode(self, data: bytes | str) -> np.ndarray:
        data = self.text_of(data)
        if isinstance(data, str):      # a command line's bytes that are not UTF-8 come back as they were
            data = data.encode("utf-8", "surrogateescape")
        return np.frombuffer(data, np.uint8).astype(np.uint32)

    def decode(self, ids, skip_special: bool = False) -> str:
        return bytes(self.ids_of(ids)).decode("utf-8", errors="replace")

    def encode_chunks(self, chunks, label):
        for raw in chunks:              # bytes are their own ids
            if not raw:
                return
            yield np.frombuffer(raw, np.uint8)

    def hf_files(self, common):
        # byte 0 pads a batch (the attention mask hides it): generation_config's pad_token_id 0
        return (dict(common, tokenizer_class="PreTrainedTokenizerFast", pad_token=byte_alphabet()[0]),
                {"tokenizer.json": json.dumps(byte_tokenizer_json(), ensure_ascii=False).encode()})
