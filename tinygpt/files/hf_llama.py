"""Hugging Face's Llama family, both ways: LlamaForCausalLM, Qwen2ForCausalLM and Qwen3ForCausalLM,
the block of the small open models people fine-tune (SmolLM2, Qwen2.5, Qwen3, Llama 3.2).

All three are core.block's RMSNorm with gains, RoPE (rotate-half), a SwiGLU MLP and grouped-query
attention, the head tied or not; they differ in what the attention adds:

    LlamaForCausalLM    no biases (or, with attention_bias and mlp_bias, every projection's)
    Qwen2ForCausalLM    biases on q, k and v
    Qwen3ForCausalLM    an RMSNorm with gains over each head's q and k (QK-norm), no biases

One table (`_names`) maps each of our parameters to its tensor and serves import and export alike:
PyTorch's Linear weights are [out, in], ours [in, out]. A config field that changes what the model
computes and that tinygpt does not compute (a scaled RoPE, a sliding window, a head dim that does
not split the width) is refused in one line naming it. config.json is read both as the hub's models
carry it (rope_theta, rope_scaling) and as today's transformers writes it (rope_parameters).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .checkpoint import CheckpointError, rope_scaling_of, show
from ..core.block import BIASES, MLPS, QK_NORMS, ROPE_THETA, QKNorm
from ..core.config import Config, own_head_dim, param_shapes
from ..core.rope import SCALINGS
from ..core.fs import read_user_file
from .. import tokenizers
from .data import DataError
from .hf_read import Architecture, Tensors, check_size, field
from .hf_tokenizer import MAX_TOKENIZER_BYTES, read_tokenizer

# our matrices' modules in a layer, with PyTorch's [out, in] weights (LoRA's targets, PEFT's modules)
MODULES = {"Wq": "self_attn.q_proj", "Wk": "self_attn.k_proj", "Wv": "self_attn.v_proj", "Wo": "self_attn.o_proj",
           "fc_gate_W": "mlp.gate_proj", "fc_in_W": "mlp.up_proj", "fc_out_W": "mlp.down_proj"}
_VECTORS = {"bq": "self_attn.q_proj.bias", "bk": "self_attn.k_proj.bias", "bv": "self_attn.v_proj.bias",
            "bo": "self_attn.o_proj.bias", "fc_gate_b": "mlp.gate_proj.bias", "fc_in_b": "mlp.up_proj.bias",
            "fc_out_b": "mlp.down_proj.bias", "ln1_g": "input_layernorm.weight",
            "ln2_g": "post_attention_layernorm.weight", "q_norm_g": "self_attn.q_norm.weight",
            "k_norm_g": "self_attn.k_norm.weight"}
_TOP = {"tok_emb": "model.embed_tokens.weight", "ln_f_g": "model.norm.weight", "lm_head": "lm_head.weight"}
FAMILY_MLP = MLPS["swiglu"]     # every member's MLP: SwiGLU, its gate's activation Hugging Face's hidden_act
# config.json's names of our dimensions, for messages
_DIMS = {"layers": "num_hidden_layers", "d_model": "hidden_size", "heads": "num_attention_heads",
         "ctx": "max_position_embeddings", "d_mlp": "intermediate_size", "vocab": "vocab_size"}


def _names(cfg: Config) -> dict:
    """Our parameter name -> (its tensor's full name, whether stored transposed), in our order."""
    out = {}
    for name, _, _ in param_shapes(cfg):
        layer, _, short = name.partition(".")
        if name in _TOP:
            out[name] = (_TOP[name], False)
        elif short in MODULES:
            out[name] = (f"model.layers.{layer[1:]}.{MODULES[short]}.weight", True)
        else:
            out[name] = (f"model.layers.{layer[1:]}.{_VECTORS[short]}", False)
    return out


@dataclass(frozen=True)
class Family:
    name: str
    model_type: str
    biases: tuple          # the bias parts (core.block's values) it computes: its own, then attention_bias
                           # with mlp_bias's where it has them
    qk_norm: QKNorm        # its QK-norm part
    window: bool = False   # its config's sliding_window is every layer's window (Mistral's)

    def computes(self, block) -> bool:
        return (block.norm.rms and block.norm.weights and block.position.rotary and block.mlp.gated
                and not block.softcap and not block.embed_norm and block.bias in self.biases
                and block.qk_norm == self.qk_norm)


LLAMA = Family("LlamaForCausalLM", "llama", (BIASES["none"], BIASES["all"]), QK_NORMS["none"])
QWEN2 = Family("Qwen2ForCausalLM", "qwen2", (BIASES["qkv"],), QK_NORMS["none"])
QWEN3 = Family("Qwen3ForCausalLM", "qwen3", (BIASES["none"],), QK_NORMS["weighted"])
MISTRAL = Family("MistralForCausalLM", "mistral", (BIASES["none"],), QK_NORMS["none"], window=True)


def _rope(c: dict, label: str) -> tuple:
    """(RoPE's base, its scaling or None): linear and Llama 3's scalings are computed (their
    frequencies made on the host, core.rope); another (YaRN, dynamic, ...) is refused, naming it."""
    scaling = None
    for key in ("rope_parameters", "rope_scaling"):
        v = c.get(key)
        if v is None:
            continue
        if not isinstance(v, dict) or any(isinstance(x, dict) for x in v.values()):
            raise CheckpointError(f"{label}: {key} is {show(v)}; tinygpt reads one RoPE for every layer, as an object")
        kind = v.get("rope_type", v.get("type", "default"))
        if kind not in ("default", *SCALINGS):
            raise CheckpointError(f"{label}: {key} has rope_type {show(kind)}, a scaled RoPE which tinygpt does not "
                                  f"compute (it computes {', '.join(SCALINGS)})")
        if field(v, "partial_rotary_factor", 1.0, float, label) != 1.0:
            raise CheckpointError(f"{label}: {key}.partial_rotary_factor {v['partial_rotary_factor']}; tinygpt "
                                  "turns every channel of a head")
        if kind != "default":
            scaling = rope_scaling_of({**v, "rope_type": kind}, f"{label}: {key}")
    params = c.get("rope_parameters") if isinstance(c.get("rope_parameters"), dict) else {}
    theta = field(params, "rope_theta", None, float, label, "") if "rope_theta" in params else \
        field(c, "rope_theta", ROPE_THETA, float, label)
    if theta <= 1:
        raise CheckpointError(f"{label}: rope_theta {theta:g}; a RoPE base is more than 1")
    return theta, scaling


def _bias(family: Family, c: dict, label: str) -> str:
    """Our bias part: the family's own, or Llama's every-projection biases."""
    attn, mlp = bool(c.get("attention_bias", False)), bool(c.get("mlp_bias", False))
    if attn and mlp and len(family.biases) > 1:
        return family.biases[1].name
    if attn or mlp:
        what = "attention_bias" if attn else "mlp_bias"
        raise CheckpointError(f"{label}: {what} is set without its partner; tinygpt's biases are on every projection, "
                              "on q, k and v alone, or on none")
    return family.biases[0].name


def _check_fields(c: dict, label: str):
    """The fields that change what the model computes in ways tinygpt does not, each refused by name."""
    act = FAMILY_MLP.hf_name                  # asked of the part, so no part's name is compared here
    if c.get("hidden_act", act) != act:
        raise CheckpointError(f"{label}: hidden_act {show(c.get('hidden_act'))}; this family's MLP is SwiGLU ({act})")
    if c.get("use_sliding_window") or any(t != "full_attention" for t in c.get("layer_types") or ()):
        raise CheckpointError(f"{label}: use_sliding_window / layer_types: some layers attend through a sliding "
                              "window, which tinygpt does not honour per layer")
    if c.get("pretraining_tp", 1) != 1:
        raise CheckpointError(f"{label}: pretraining_tp {show(c.get('pretraining_tp'))}; tinygpt reads whole "
                              "(unsplit) projections")
    if not isinstance(c.get("tie_word_embeddings", False), bool):
        raise CheckpointError(f"{label}: tie_word_embeddings is {show(c.get('tie_word_embeddings'))}; expected "
                              "true or false")


def _config(family: Family, c: dict, label: str, ctx: int | None = None) -> Config:
    kind = f"a {family.name}"
    num = lambda key, default=None: field(c, key, default, int, label, kind)
    C, H = num("hidden_size"), num("num_attention_heads")
    if C <= 0 or H <= 0:
        raise CheckpointError(f"{label}: hidden_size {C} and num_attention_heads {H} must be positive")
    _check_fields(c, label)
    n_ctx = num("max_position_embeddings")
    if ctx is not None and not 0 < ctx <= n_ctx:
        raise CheckpointError(f"{label}: a context of {ctx:,}; this model takes 1 to its max_position_embeddings, "
                              f"{n_ctx:,}")
    kv = num("num_key_value_heads", H)
    hd = num("head_dim", C // H if C % H == 0 else None)      # q's width H hd: apart from C where they differ
    if not 0 < hd <= 128:
        raise CheckpointError(f"{label}: head_dim {hd}; tinygpt's attention takes heads of 1 to 128 channels")
    theta, scaling = _rope(c, label)
    window = num("sliding_window", 0) if family.window else 0      # Mistral's: every layer's (or none)
    if window < 0:
        raise CheckpointError(f"{label}: sliding_window {window}; a window is 1 or more tokens (null: none)")
    cfg = Config(layers=num("num_hidden_layers"), d_model=C, heads=H, ctx=ctx or n_ctx, d_mlp=num("intermediate_size"),
                 vocab=num("vocab_size"), batch=1, activation=FAMILY_MLP.name, norm="rmsnorm", position="rope",
                 rope_theta=theta, norm_eps=field(c, "rms_norm_eps", 1e-6, float, label),
                 bias=_bias(family, c, label), tied=c.get("tie_word_embeddings", False), qk_norm=family.qk_norm.name,
                 kv_heads=0 if kv == H else kv, head_dim=own_head_dim(C, H, hd), window=window, rope_scaling=scaling)
    check_size(cfg, label, _DIMS)
    return cfg


def _read(read: Tensors, cfg: Config) -> dict:
    """Every parameter from the files, each checked as it is read."""
    names = _names(cfg)
    return {name: read(names[name][0], shape, transpose=names[name][1]) for name, shape, _ in param_shapes(cfg)}


def _state(cfg: Config, P: dict) -> dict:
    """The architecture's names for our parameters."""
    return {hf: np.ascontiguousarray(P[name].T if flip else P[name], np.float32)
            for name, (hf, flip) in _names(cfg).items()}


def _config_json(family: Family, cfg: Config, tok) -> dict:
    blk = cfg.block
    eos = tok.eos_id if tok is not None else None
    out = {"architectures": [family.name], "model_type": family.model_type, "vocab_size": cfg.vocab,
           "hidden_size": cfg.d_model, "intermediate_size": cfg.d_mlp, "num_hidden_layers": cfg.layers,
           "num_attention_heads": cfg.heads, "num_key_value_heads": blk.heads.kv, "head_dim": cfg.hd,
           "hidden_act": FAMILY_MLP.hf_name, "max_position_embeddings": cfg.ctx, "rms_norm_eps": blk.eps,
           # both spellings: the hub's (transformers 4) and today's transformers'
           "rope_theta": blk.rope_theta, "rope_scaling": cfg.rope_scaling,
           "rope_parameters": {"rope_type": "default", **(cfg.rope_scaling or {}), "rope_theta": blk.rope_theta},
           "tie_word_embeddings": blk.tied, "attention_dropout": 0.0, "initializer_range": 0.02, "use_cache": True,
           "bos_token_id": eos, "eos_token_id": eos, "torch_dtype": "float32"}
    if family is LLAMA:
        every = bool(blk.bias.vectors)      # Llama's biases are on every projection or on none
        out.update(attention_bias=every, mlp_bias=every, pretraining_tp=1)
    elif family.window:
        out.update(sliding_window=cfg.window or None)
    else:
        out.update(use_sliding_window=False, sliding_window=None, max_window_layers=cfg.layers)
        if family is QWEN3:
            out.update(attention_bias=False)
    return out


def _eos(d: Path, c: dict, vocab: int) -> int | None:
    """The end-of-text id: generation_config.json's, else config.json's (the first of a list)."""
    found = [c.get("eos_token_id")]
    gen = d / "generation_config.json"
    if gen.exists():
        raw = read_user_file(gen, CheckpointError, str(gen), "a generation config", 1 << 20)
        try:
            found.insert(0, json.loads(raw).get("eos_token_id"))
        except (ValueError, AttributeError, RecursionError):
            pass                    # not one transformers would read either: config.json's then
    for got in found:
        got = got[0] if isinstance(got, list) and got else got
        if isinstance(got, int) and not isinstance(got, bool) and 0 <= got < vocab:
            return got
    return None


def tokenizer(d: Path, cfg: Config, c: dict):
    """The tokenizer a directory holds: its tokenizer.json (run by Hugging Face's tokenizers
    library; the byte vocabulary's is ours), else GPT-2's vocab.json; one must be there."""
    if (d / "tokenizer.json").exists():
        own = _ours(d, cfg.vocab) if cfg.vocab == tokenizers.ByteTokenizer.vocab else None
        if own is not None and tokenizers.kind(own).token_is_byte:      # our byte vocabulary's export
            return Named(own)
        label = str(d / "tokenizer.json")
        raw = read_user_file(d / "tokenizer.json", CheckpointError, label, "a tokenizer file", MAX_TOKENIZER_BYTES,
                             "64 MiB")
        try:
            return tokenizers.HFTokenizer(raw.decode("utf-8"), cfg.vocab, _eos(d, c, cfg.vocab))
        except (UnicodeDecodeError, DataError) as e:
            raise CheckpointError(f"{label}: {e}") from e
    name = read_tokenizer(d, cfg.vocab)
    if name is None:
        raise CheckpointError(f"{d}: no tokenizer.json (nor GPT-2's vocab.json); tinygpt needs the model's tokenizer "
                              "beside its config.json")
    return Named(name)


def _ours(d: Path, vocab: int) -> str | None:
    """The byte or GPT-2 tokenizer where the directory's files are theirs, else None."""
    try:
        return read_tokenizer(d, vocab)
    except CheckpointError:
        return None


class Named:
    """A tokenizer named, not loaded (GPT-2's BPE needs its r50k_base file only to encode)."""

    def __init__(self, name: str):
        self.name, self.source = name, tokenizers.kind(name).source

    def record(self) -> dict:
        return {"tokenizer": self.name} | ({"tokenizerSource": self.source} if self.source else {})


def _architecture(family: Family) -> Architecture:
    return Architecture(family.name, family.model_type, "", lambda c, label, ctx=None: _config(family, c, label, ctx),
                        _read, _state, lambda cfg, tok: _config_json(family, cfg, tok), family.computes,
                        unread=("rotary_emb.inv_freq",), peft_modules=MODULES)


FAMILY = tuple(_architecture(f) for f in (LLAMA, QWEN2, QWEN3, MISTRAL))
