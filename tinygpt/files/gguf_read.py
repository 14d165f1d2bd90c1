"""GGUF in: a llama.cpp model file (what llama.cpp, Ollama and LM Studio hold) as the Hugging Face
architecture it was converted from, so that `tinygpt import-hf FILE.gguf` makes the same
checkpoint a Hugging Face directory of that model makes.

The file is read by the `gguf` package, llama.cpp's own reader (it memory-maps the file and checks
each tensor's bytes against its shape and type); its quantised tensors are dequantized by that
package too, one at a time. What the file says is turned into config.json's fields and Hugging
Face's tensor names, and the architecture's own reader (hf_llama) takes it from there: the same
checks, the same refusals. Two things differ from a directory:

- llama.cpp's converter stores a Llama's q and k projections with each head's rotary halves
  interleaved (its RoPE turns neighbouring pairs); they are put back in rotate-half order, as
  transformers' GGUF loader does. Qwen2's and Qwen3's are stored as they are.
- The tokenizer is the file's own vocabulary and merges: a byte-level BPE (tokenizer.ggml.model
  "gpt2": Llama 3's, Qwen's, SmolLM's) becomes a tokenizer.json for Hugging Face's tokenizers
  library, its control tokens special, as transformers builds it from the same file. Its chat
  template and end-of-turn tokens travel into the checkpoint.
"""
from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np

from .checkpoint import Checkpoint, CheckpointError, show
from ..core.fs import check_regular
from .. import tokenizers
from ..tokenizers.base import byte_alphabet
from .data import DataError
from . import hf_llama
from .hf_read import read_model

# general.architecture -> the Hugging Face family it was converted from
FAMILIES = {"llama": hf_llama.LLAMA, "qwen2": hf_llama.QWEN2, "qwen3": hf_llama.QWEN3}
# the quantisation types local models ship in, each dequantized by the gguf package
TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K", "Q8_K")
MAX_TEMPLATE = 1 << 20          # a chat template's characters (real ones are a few kB)
MAX_TOKENS = 1 << 24            # the vocabulary's tokens (the config's own bound)

# Hugging Face's names -> GGUF's, per layer and at the top
_LAYER = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
          "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
          "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
          "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm"}
_TOP = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight"}

# How the file's pre-tokenizer splits text before its merges, where it is not GPT-2's pattern (a
# byte-level BPE's default): Llama 3's (digits in threes) and Qwen2's (one digit at a time).
_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
SPLITS = {"llama3": _LLAMA3_SPLIT, "llama-v3": _LLAMA3_SPLIT, "llama-bpe": _LLAMA3_SPLIT, "smaug-bpe": _LLAMA3_SPLIT,
          "qwen2": _QWEN2_SPLIT, "deepseek-r1-qwen": _QWEN2_SPLIT}
CONTROL, USER_DEFINED = 3, 4    # tokenizer.ggml.token_type's values for special and added tokens
BYTE_LEVEL_BPE = "gpt2"         # tokenizer.ggml.model for a byte-level BPE (GGUF's word, not our tokenizer)
GGUF_NO_SCALING = "none"        # {arch}.rope.scaling.type of plain RoPE (GGUF's word, not a block part's)


def gguf_file(path) -> Path | None:
    """The GGUF file a path names: the file itself (by its magic), or the one .gguf in a directory
    without a config.json; None where it names none."""
    p = Path(path)
    if p.is_dir():
        if (p / "config.json").exists():
            return None
        found = sorted(q for q in p.iterdir() if q.suffix.lower() == ".gguf" and q.is_file())
        if len(found) > 1:
            raise CheckpointError(f"{path} holds {len(found)} GGUF files ({found[0].name}, {found[1].name}, ...); "
                                  "give the one to import")
        return found[0] if found else None
    try:
        with open(p, "rb") as f:
            return p if f.read(4) == b"GGUF" else None
    except OSError:
        return None


# GGUF's value types: 0-7, 10-12 fixed-size (their bytes), 8 a string, 9 an array
_SCALAR = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
MAX_KEYS, MAX_TENSORS, MAX_DIMS = 1 << 16, 1 << 20, 4
MAX_STRING = 64 << 20                   # a chat template, a key, a token: far smaller


class _Walker:
    """Reads a file's header forward, every length checked against the bytes left first."""

    def __init__(self, f, size: int, label: str, at: int):
        self.f, self.size, self.label, self.at = f, size, label, at

    def take(self, n: int, what: str) -> bytes:
        if n > self.size - self.at:
            raise CheckpointError(f"{self.label}: {what} of {n:,} bytes runs past the end of the file (at byte "
                                  f"{self.at:,} of {self.size:,}); the file is truncated or damaged")
        self.at += n
        return self.f.read(n)

    def u32(self, what: str) -> int:
        return struct.unpack("<I", self.take(4, what))[0]

    def u64(self, what: str) -> int:
        return struct.unpack("<Q", self.take(8, what))[0]

    def string(self, what: str) -> bytes:
        n = self.u64(what)
        if n > MAX_STRING:
            raise CheckpointError(f"{self.label}: {what} of {n:,} bytes, more than {MAX_STRING:,}; the file is damaged")
        return self.take(n, what)

    def value(self, kind: int, what: str, depth: int = 0):
        """A field's value (its bytes for a number or a string; None for an array, skipped)."""
        if kind in _SCALAR:
            return self.take(_SCALAR[kind], what)
        if kind == 8:
            return self.string(what)
        if kind != 9 or depth:
            raise CheckpointError(f"{self.label}: {what} has value type {kind}, which GGUF does not define")
        inner, n = self.u32(what), self.u64(what)
        if inner in _SCALAR:
            self.take(n * _SCALAR[inner], f"{what}'s {n:,} values")
            return None
        if inner != 8 or n > (self.size - self.at) // 8:
            raise CheckpointError(f"{self.label}: {what} is an array of {n:,} values of type {inner}, more than the "
                                  "file holds or of a type GGUF does not define; the file is damaged")
        for _ in range(n):
            self.string(what)
        return None


def prescan(path: Path, size: int):
    """The file's header walked with every count and length checked against the bytes that are
    left, before the gguf package (which trusts them) reads it: a crafted or truncated file is
    refused here in one line, having allocated nothing sized by it."""
    label = str(path)
    with open(path, "rb") as f:
        head = f.read(min(size, 24))
        if len(head) < 24 or head[:4] != b"GGUF":
            raise CheckpointError(f"{label}: {size:,} bytes, too short for a GGUF header; the file is truncated")
        version, n_tensors, n_kv = struct.unpack("<IQQ", head[4:24])
        if version not in (2, 3):
            raise CheckpointError(f"{label}: GGUF version {version}; tinygpt reads versions 2 and 3")
        if n_tensors > min(MAX_TENSORS, size // 24) or n_kv > min(MAX_KEYS, size // 12):
            raise CheckpointError(f"{label}: its header counts {n_tensors:,} tensors and {n_kv:,} fields, more than "
                                  f"{size:,} bytes hold; the file is damaged")
        w = _Walker(f, size, label, 24)
        alignment = 32
        for _ in range(n_kv):
            key = w.string("a field's name").decode("utf-8", errors="replace")
            got = w.value(w.u32(f"field {key}"), f"field {key}")
            if key == "general.alignment":
                alignment = struct.unpack("<I", got[:4])[0] if got and len(got) >= 4 else 0
                if not 8 <= alignment <= 1 << 16 or alignment & (alignment - 1):
                    raise CheckpointError(f"{label}: general.alignment {alignment}; GGUF aligns to a power of two")
        infos = []
        for _ in range(n_tensors):
            name = w.string("a tensor's name").decode("utf-8", errors="replace")
            n_dims = w.u32(f"tensor {name}")
            if not 1 <= n_dims <= MAX_DIMS:
                raise CheckpointError(f"{label}: tensor {name} has {n_dims} dimensions; a model's have 1 to {MAX_DIMS}")
            dims = [w.u64(f"tensor {name}") for _ in range(n_dims)]
            infos.append((name, dims, w.u32(f"tensor {name}"), w.u64(f"tensor {name}")))
    _check_tensors(label, infos, -(-w.at // alignment) * alignment, alignment, size)


def _check_tensors(label: str, infos: list, data0: int, alignment: int, size: int):
    """Each tensor's type known, its shape whole blocks of it, its bytes inside the file and aligned."""
    import gguf
    for name, dims, kind, offset in infos:
        try:
            block, nbytes = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(kind)]
        except (ValueError, KeyError):
            raise CheckpointError(f"{label}: tensor {name} is of type {kind}, which the gguf package does not "
                                  "know; it reads the types llama.cpp writes") from None
        n = 1
        for d in dims:
            n *= d
        if not 0 < n <= 1 << 40 or dims[0] % block:
            raise CheckpointError(f"{label}: tensor {name} has shape {dims}, not whole blocks of its type's "
                                  f"{block} values; the file is damaged")
        if offset % alignment or data0 + offset + n // block * nbytes > size:
            raise CheckpointError(f"{label}: tensor {name}'s {n // block * nbytes:,} bytes at offset {offset:,} lie "
                                  f"outside the file's {size:,} bytes or off its alignment; the file is truncated or "
                                  "damaged")


class _File:
    """The file's key/value fields and tensors, as the gguf package reads them; every failure of
    the reader one line."""

    def __init__(self, path: Path):
        try:
            import gguf
        except ImportError:
            raise CheckpointError("reading a GGUF file needs the gguf package: pip install gguf") from None
        self.gguf, self.label = gguf, str(path)
        prescan(path, check_regular(path, CheckpointError, self.label, "a GGUF model file").st_size)
        try:
            self.reader = gguf.GGUFReader(str(path), "r")
        except (ValueError, KeyError, IndexError, OverflowError, MemoryError, EOFError, TypeError) as e:
            raise CheckpointError(f"{path}: not a GGUF file the gguf package reads ({str(e)[:160] or type(e).__name__}"
                                  "); the file is damaged or of a newer GGUF version") from None
        self.tensors = {t.name: t for t in self.reader.tensors}

    def get(self, key: str, default=None):
        f = self.reader.fields.get(key)
        if f is None:
            return default
        try:
            return f.contents()
        except (ValueError, IndexError, UnicodeDecodeError, TypeError) as e:
            raise CheckpointError(f"{self.label}: its field {key} cannot be read ({e}); the file is damaged") from None

    def number(self, key: str, default=None):
        v = self.get(key, default)
        if v is None:
            raise CheckpointError(f"{self.label}: no {key}; a GGUF model file of this architecture has one")
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise CheckpointError(f"{self.label}: {key} is {show(v)}; expected a number")
        return v

    def array(self, key: str, most: int) -> list:
        f = self.reader.fields.get(key)
        if f is None:
            return []
        if len(f.data) > most:
            raise CheckpointError(f"{self.label}: {key} holds {len(f.data):,} entries, more than {most:,}")
        v = self.get(key)
        return v if isinstance(v, list) else []


def _config_json(g: _File, arch: str) -> dict:
    """config.json's fields of the Hugging Face model the file was converted from."""
    family = FAMILIES[arch]
    num = lambda key, default=None: g.number(f"{arch}.{key}", default)
    tokens = g.reader.fields.get("tokenizer.ggml.tokens")
    vocab = num("vocab_size", len(tokens.data) if tokens is not None else None)
    heads = num("attention.head_count")
    c = {"architectures": [family.name], "model_type": family.model_type, "vocab_size": vocab,
         "hidden_size": num("embedding_length"), "num_hidden_layers": num("block_count"),
         "num_attention_heads": heads, "num_key_value_heads": num("attention.head_count_kv", heads),
         "intermediate_size": num("feed_forward_length"), "max_position_embeddings": num("context_length"),
         "rms_norm_eps": num("attention.layer_norm_rms_epsilon", 1e-6), "rope_theta": num("rope.freq_base", 10000.0),
         "tie_word_embeddings": "output.weight" not in g.tensors, "hidden_act": "silu"}
    if f"{arch}.attention.key_length" in g.reader.fields:
        c["head_dim"] = num("attention.key_length")
    scaling = g.get(f"{arch}.rope.scaling.type")
    if scaling not in (None, GGUF_NO_SCALING):
        c["rope_scaling"] = {"rope_type": scaling}          # refused by name (hf_llama._rope)
    if f"{arch}.attention.sliding_window" in g.reader.fields:
        c["use_sliding_window"] = True                      # likewise
    if arch == "llama" and "blk.0.attn_q.bias" in g.tensors:
        c["attention_bias"] = c["mlp_bias"] = True
    return c


class GGUFTensors:
    """hf_read.Tensors' reading, from a GGUF file: a tensor by its Hugging Face name, dequantized
    to float32 and checked against the shape the config gives it."""

    def __init__(self, g: _File, arch: str, cfg):
        self.g, self.arch, self.cfg = g, arch, cfg
        self.used, self.bar = set(), None
        self.size = sum(int(t.n_bytes) for t in g.tensors.values())

    def _gguf_name(self, name: str) -> str | None:
        if name in _TOP:
            return _TOP[name]
        parts = name.split(".")
        if parts[:2] != ["model", "layers"] or len(parts) < 5:
            return None
        module, kind = ".".join(parts[3:-1]), parts[-1]
        return f"blk.{parts[2]}.{_LAYER[module]}.{kind}" if module in _LAYER else None

    def __contains__(self, name: str) -> bool:
        return self._gguf_name(name) in self.g.tensors

    def __call__(self, name: str, shape: tuple, transpose: bool = False) -> np.ndarray:
        key = self._gguf_name(name)
        t = self.g.tensors.get(key) if key else None
        if t is None:
            raise CheckpointError(f"{self.g.label}: no tensor {key or name}; the file is incomplete or not the "
                                  "architecture it names")
        self.used.add(key)
        kind = t.tensor_type.name
        if kind not in TYPES:
            raise CheckpointError(f"{self.g.label}: {key} is stored as {kind}, a quantisation tinygpt does not read; "
                                  f"it reads {', '.join(TYPES)}")
        stored = tuple(shape[::-1]) if transpose else tuple(shape)
        got = tuple(int(s) for s in reversed(t.shape.tolist()))        # GGUF lists the fastest dimension first
        if got != stored:
            raise CheckpointError(f"{self.g.label}: {key} has shape {list(got)}, the config says {list(stored)}")
        try:
            with np.errstate(all="ignore"):      # damaged scales give nan or inf: refused once all is read
                a = np.asarray(self.g.gguf.quants.dequantize(t.data, t.tensor_type), np.float32).reshape(stored)
        except (ValueError, NotImplementedError, IndexError, TypeError) as e:
            raise CheckpointError(f"{self.g.label}: {key} ({kind}) cannot be dequantized ({str(e)[:120]}); the file "
                                  "is damaged") from None
        if self.bar is not None:
            self.bar.update(int(t.n_bytes))
        if self.arch == "llama" and (key.endswith("attn_q.weight") or key.endswith("attn_k.weight")):
            a = _unpermute(a, self.cfg.heads if "attn_q" in key else self.cfg.n_kv)
        return np.ascontiguousarray(a.T) if transpose else np.array(a)

    def left(self, unread: tuple = ()) -> list:
        return sorted(n for n in self.g.tensors if n not in self.used and not n.startswith("rope_"))


def _unpermute(w: np.ndarray, heads: int) -> np.ndarray:
    """[heads * hd, C] from llama.cpp's order (each head's rotary pairs side by side) back to
    rotate-half's (its first halves, then its second)."""
    hd = w.shape[0] // heads
    return w.reshape(heads, hd // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def tokenizer_json(tokens: list, types: list, merges: list, pre: str | None) -> str:
    """The file's byte-level BPE as a tokenizer.json: its vocabulary and merges, split as its
    pre-tokenizer names (GPT-2's pattern by default), its control tokens special and its
    user-defined ones added whole, as transformers builds it from the same file."""
    alphabet = set(byte_alphabet().values())
    split = SPLITS.get(pre)
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": split is None}
    pre_tok = byte_level if split is None else {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": split}, "behavior": "Isolated", "invert": False}, byte_level]}
    types = list(types) + [1] * (len(tokens) - len(types))
    added = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
              "special": ty == CONTROL}
             for i, (t, ty) in enumerate(zip(tokens, types))
             if (ty == CONTROL and set(t) <= alphabet) or ty == USER_DEFINED]
    vocab = {}
    for i, t in enumerate(tokens):
        vocab.setdefault(t, i)
    doc = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
           "pre_tokenizer": pre_tok,
           "post_processor": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
           "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
           "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                     "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                     "vocab": vocab, "merges": [m.split(" ") for m in merges]}}
    return json.dumps(doc, ensure_ascii=False)


def _tokenizer(g: _File, vocab: int):
    """(the tokenizer, its end-of-turn ids) the file carries."""
    model = g.get("tokenizer.ggml.model")
    if model != BYTE_LEVEL_BPE:
        raise CheckpointError(f"{g.label}: its tokenizer is {show(model)}; tinygpt imports a GGUF's byte-level BPE "
                              "(tokenizer.ggml.model gpt2: Llama 3's, Qwen's, SmolLM's), not SentencePiece's")
    tokens = g.array("tokenizer.ggml.tokens", MAX_TOKENS)
    if not tokens or len(tokens) > vocab or not all(isinstance(t, str) for t in tokens):
        raise CheckpointError(f"{g.label}: {len(tokens):,} tokens in tokenizer.ggml.tokens against the model's "
                              f"{vocab:,} embedding rows; the tokenizer is not this model's")
    types = g.array("tokenizer.ggml.token_type", MAX_TOKENS)
    merges = g.array("tokenizer.ggml.merges", MAX_TOKENS)
    if not all(isinstance(m, str) and m.count(" ") == 1 for m in merges):
        raise CheckpointError(f"{g.label}: tokenizer.ggml.merges holds an entry that is not two tokens; the "
                              "tokenizer is damaged")
    ids = lambda key: g.get(key)
    eos = ids("tokenizer.ggml.eos_token_id")
    eos = eos if isinstance(eos, int) and not isinstance(eos, bool) and 0 <= eos < vocab else None
    stops = [i for i in (eos, ids("tokenizer.ggml.eot_token_id"), ids("tokenizer.ggml.eom_token_id"))
             if isinstance(i, int) and not isinstance(i, bool) and 0 <= i < vocab]
    text = tokenizer_json(tokens, types, merges, g.get("tokenizer.ggml.pre"))
    try:
        tok = tokenizers.HFTokenizer(text, vocab, eos)
    except DataError as e:
        raise CheckpointError(f"{g.label}: {e}") from None
    return tok, list(dict.fromkeys(stops))


def import_gguf(path: Path, quiet: bool = True, ctx: int | None = None) -> Checkpoint:
    """A GGUF model file as a fresh checkpoint, as hf.import_hf makes one from a directory."""
    g = _File(path)
    arch = g.get("general.architecture")
    if arch not in FAMILIES:
        raise CheckpointError(f"{path}: a {show(arch)} model; tinygpt imports GGUF files of the "
                              f"{', '.join(FAMILIES)} architectures")
    c = _config_json(g, arch)
    architecture = next(a for a in hf_llama.FAMILY if a.name == FAMILIES[arch].name)
    cfg = architecture.config(c, str(path), ctx)
    P = read_model(architecture, GGUFTensors(g, arch, cfg), cfg, str(path), quiet, "dequantizing the weights",
                   "the file's fields")
    tok, stops = _tokenizer(g, cfg.vocab)
    extra = {**tok.record(), "importedFrom": str(path), "stopTokens": stops}
    bos = g.get("tokenizer.ggml.bos_token_id")
    if isinstance(bos, int) and not isinstance(bos, bool) and 0 <= bos < cfg.vocab:
        extra["tokenizerBos"] = bos          # the chat template's bos_token
    template = g.get("tokenizer.chat_template")
    if isinstance(template, str) and 0 < len(template) <= MAX_TEMPLATE:
        extra["chatTemplate"] = template
    types = sorted({t.tensor_type.name for t in g.tensors.values()})
    extra["importedTypes"] = types
    return Checkpoint(cfg, P, None, None, 0, [], extra)
