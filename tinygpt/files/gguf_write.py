"""GGUF out: `tinygpt export` in the gguf format, a model as llama.cpp's converter writes it, so that
llama.cpp, Ollama and LM Studio run what was fine-tuned here.

The model goes through its Hugging Face architecture first (hf.architecture_of: the Llama family,
whose blocks llama.cpp computes as llama, qwen2 and qwen3, and GPT-2's, its gpt2), and from those
names to GGUF's, the table gguf_read reads with (GPT-2's: its own below). As the converter does, a
Llama's q and k are stored with each head's rotary halves interleaved (llama.cpp's RoPE turns
neighbouring pairs; Qwen's is stored as it is), GPT-2's Conv1D weights as [out, in] like every
other matrix and its tied head written out as output.weight,
the norms stay float32 and the matrices take the asked type, a matrix whose rows are not whole
blocks of 32 staying f16 under q8_0. The tokenizer's vocabulary, merges and token types, its end
tokens and the chat template travel in the file. The gguf package's writer writes it, beside the
output, and it replaces the output only once whole.
"""
from __future__ import annotations

import errno
import json
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np

from .checkpoint import Checkpoint, CheckpointError
from ..core.errors import warn
from ..core.fs import creation_mode
from .. import tokenizers
from .gguf_read import _LAYER, _TOP, BYTE_LEVEL_BPE, CONTROL, FAMILIES, SPLITS, _File, gguf_file
from .hf import GPT2, architecture_of, gpt2_config_json
from .outputs import WRITER

KINDS = {"f32": "F32", "f16": "F16", "bf16": "BF16", "q8_0": "Q8_0"}     # the gguf_type option -> GGML's type
TYPES = tuple(KINDS)
DEFAULT_TYPE = "f16"
WRITER_KEY = "tinygpt.writer"                 # marks a file as ours to replace
NORMAL = 1                                    # tokenizer.ggml.token_type of an ordinary token
_ARCH = {**{family.name: arch for arch, family in FAMILIES.items()}, GPT2.name: "gpt2"}   # Hugging Face's -> GGUF's
# GPT-2's names in a block (Conv1D's [in, out] weights turned to [out, in]), and at the top
_GPT2_LAYER = {"ln_1": ("attn_norm", False), "attn.c_attn": ("attn_qkv", True), "attn.c_proj": ("attn_output", True),
               "ln_2": ("ffn_norm", False), "mlp.c_fc": ("ffn_up", True), "mlp.c_proj": ("ffn_down", True)}
_GPT2_TOP = {"transformer.wte.weight": "token_embd.weight", "transformer.wpe.weight": "position_embd.weight",
             "transformer.ln_f.weight": "output_norm.weight", "transformer.ln_f.bias": "output_norm.bias"}
FILE_TYPES = {"f32": 0, "f16": 1, "q8_0": 7, "bf16": 32}          # general.file_type: llama.cpp's LLAMA_FTYPE


def is_our_gguf(path) -> bool:
    """A GGUF file this export wrote (its writer field), which another export may replace."""
    try:
        return gguf_file(path) is not None and _File(Path(path)).get(WRITER_KEY) == WRITER
    except CheckpointError:
        return False


def gguf_name(hf_name: str) -> str:
    """A Hugging Face tensor name as GGUF's: model.layers.N.self_attn.q_proj.weight -> blk.N.attn_q.weight."""
    if hf_name in _TOP:
        return _TOP[hf_name]
    layer, rest = hf_name.removeprefix("model.layers.").split(".", 1)
    module, suffix = rest.rsplit(".", 1)
    return f"blk.{layer}.{_LAYER[module]}.{suffix}"


def gpt2_tensors(state: dict):
    """(GGUF's name, array) of GPT2LMHeadModel's tensors, as llama.cpp's converter writes them."""
    for name, a in state.items():
        if name in _GPT2_TOP:
            yield _GPT2_TOP[name], a
            if name == "transformer.wte.weight":
                yield "output.weight", a                    # the tied head, written out
            continue
        layer, rest = name.removeprefix("transformer.h.").split(".", 1)
        module, suffix = rest.rsplit(".", 1)
        short, turned = _GPT2_LAYER[module]
        yield f"blk.{layer}.{short}.{suffix}", (a.T if turned and a.ndim == 2 else a)


def llama_tensors(state: dict, arch: str, heads: int, kv_heads: int):
    """(GGUF's name, array) of a Llama family's tensors: a Llama's q and k interleaved."""
    turned = {"self_attn.q_proj": heads, "self_attn.k_proj": kv_heads} if arch == "llama" else {}
    for name, a in state.items():
        module = name.rsplit(".", 1)[0].split(".", 3)[-1] if name.startswith("model.layers.") else ""
        yield gguf_name(name), (interleave(a, turned[module]) if module in turned else a)


def interleave(w: np.ndarray, heads: int) -> np.ndarray:
    """A [heads * hd, in] projection in rotate-half order as llama.cpp's Llama stores it: each
    head's two halves interleaved (gguf_read's unpermute undone)."""
    hd = w.shape[0] // heads
    return w.reshape(heads, 2, hd // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _tensor(gguf, a: np.ndarray, kind: str):
    """(data, raw shape, raw type) of one tensor in `kind`: 1-D tensors in float32; q8_0 where a
    row is whole blocks of 32, else f16, as the converter does."""
    T = gguf.GGMLQuantizationType
    qtype = getattr(T, KINDS[kind])
    if a.ndim == 1 or qtype == T.F32:
        return a.astype(np.float32), None, None
    if qtype == T.Q8_0 and a.shape[-1] % 32:
        qtype = T.F16
    if qtype == T.F16:
        return a.astype(np.float16), None, None
    q = gguf.quants.quantize(a.astype(np.float32), qtype)
    return q, q.shape, qtype


def _vocabulary(tok, vocab: int, what: str) -> tuple[list, list, list, str]:
    """(tokens, token types, merges, tokenizer.ggml.pre) of the model's byte-level BPE in id order.
    The pre-tokenizer: the split an imported tokenizer.json makes where it is Llama 3's or Qwen2's,
    else GPT-2's ("default"), said where the tokenizer splits some other way."""
    bpe = tok.byte_level_bpe()
    if bpe is None:
        raise CheckpointError(f"{what} reads the {tok.name} tokenizer, which GGUF's tokenizers do not hold; export "
                              "it as hf or safetensors")
    by_id, special, merges, pre_tok = bpe
    tokens = [by_id.get(i, f"[PAD{i}]") for i in range(vocab)]
    types = [CONTROL if i in special else NORMAL for i in range(vocab)]
    pre, record = "default", json.dumps(pre_tok)
    for name in ("llama-bpe", "qwen2"):
        if json.dumps(SPLITS[name])[1:-1] in record:
            pre = name
    if pre_tok is not None and pre == "default" and '"use_regex": true' not in record:
        warn("the tokenizer splits text before its merges in a way GGUF's named pre-tokenizers may not; the file "
             "says GPT-2's (default), which llama.cpp may tokenize differently")
    return tokens, types, merges, pre


def _metadata(w, ck: Checkpoint, kind: str, tok, what: str):
    cfg, blk, extra = ck.cfg, ck.cfg.block, ck.extra
    w.add_name(Path(str(extra.get("importedFrom", "tinygpt model"))).stem)
    w.add_string(WRITER_KEY, WRITER)
    w.add_block_count(cfg.layers)
    w.add_context_length(cfg.ctx)
    w.add_embedding_length(cfg.d_model)
    w.add_feed_forward_length(cfg.d_mlp)
    w.add_head_count(cfg.heads)
    if blk.position.rotary:                 # the Llama family's; GPT-2's are its learned table and LayerNorm
        w.add_head_count_kv(blk.heads.kv)
        w.add_key_length(cfg.hd)
        w.add_value_length(cfg.hd)
        w.add_layer_norm_rms_eps(blk.eps)
        w.add_rope_freq_base(float(blk.rope_theta))
    else:
        w.add_layer_norm_eps(blk.eps)
    w.add_vocab_size(cfg.vocab)
    w.add_file_type(FILE_TYPES[kind])
    tokens, types, merges, pre = _vocabulary(tok, cfg.vocab, what)
    w.add_tokenizer_model(BYTE_LEVEL_BPE)
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    stops = [i for i in extra.get("stopTokens", []) if isinstance(i, int)] or \
        ([tok.eos_id] if getattr(tok, "eos_id", None) is not None else [])
    if stops:
        w.add_eos_token_id(stops[0])
    bos = extra.get("tokenizerBos")
    w.add_bos_token_id(bos if isinstance(bos, int) else stops[0] if stops else 0)
    w.add_add_bos_token(False)              # a chat template writes its own; a prompt is encoded as it is
    if isinstance(extra.get("chatTemplate"), str):
        w.add_chat_template(extra["chatTemplate"])


def export_gguf(ck: Checkpoint, out, kind: str = DEFAULT_TYPE, what: str = "the model",
                tokenizer_file: str | None = None) -> None:
    """The model as a GGUF file at out, in `kind` (TYPES), written beside it and renamed in whole."""
    import gguf
    architecture = architecture_of(ck.cfg, what)
    arch = _ARCH.get(architecture.name)
    if arch is None:
        raise CheckpointError(f"{what} is a {architecture.name}; tinygpt writes GGUF files of the "
                              f"{', '.join(_ARCH.values())} architectures: export it as hf")
    if architecture is GPT2 and gpt2_config_json(ck.cfg, None)["activation_function"] != "gelu_new":
        warn(f"{what} computes the exact GELU; llama.cpp's and transformers' GPT-2 from a GGUF compute its tanh "
             "approximation (a difference of about 1e-3 in each activation); export it as hf for the exact one")
    if ck.cfg.rope_scaling:
        raise CheckpointError(f"{what} scales its RoPE ({ck.cfg.rope_scaling.get('rope_type')}), which this GGUF "
                              "export does not write; export it as hf")
    tok = tokenizers.of_record(ck.extra, ck.cfg.vocab, tokenizer_file)
    out = Path(out)
    fd, tmp = tempfile.mkstemp(prefix=".tinygpt-", suffix=".gguf.tmp", dir=out.parent if str(out.parent) else ".")
    os.close(fd)
    try:
        w = gguf.GGUFWriter(tmp, arch)
        _metadata(w, ck, kind, tok, what)
        state = architecture.state(ck.cfg, ck.params)
        tensors = gpt2_tensors(state) if architecture is GPT2 else \
            llama_tensors(state, arch, ck.cfg.heads, ck.cfg.block.heads.kv)
        for name, a in tensors:
            data, shape, qtype = _tensor(gguf, np.ascontiguousarray(a), kind)
            w.add_tensor(name, data, raw_shape=shape, raw_dtype=qtype)
        _written(w, out)
        os.chmod(tmp, creation_mode(out))
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _written(w, out: Path):
    """The writer's three parts to its file. The gguf package reports a short write as an OSError
    without an errno ("N requested and M written"): on a disk with too little room left for the
    next block it is the full disk, said as the other writes say it."""
    try:
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
    except OSError as e:
        if e.errno is None and shutil.disk_usage(out.parent if str(out.parent) else ".").free < (1 << 20):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(out)) from None
        raise
