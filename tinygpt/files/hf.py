"""Hugging Face model directories both ways: export (tinygpt export, hf format) and import
(`tinygpt import-hf`), so that a model can be fine-tuned here and go back. The architectures:

    GPT2LMHeadModel                  GPT-2's block (here)
    LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM    the Llama family (hf_llama.py)

A model's block (core.block) decides the architecture it exports as; an import reads the one its
config.json names. Here, GPT-2's names: its Conv1D weights are [in, out] like ours; c_attn holds
q | k | v side by side. Import reads config.json and the safetensors (hf_read) with every size
checked before anything is read or allocated, and refuses, in one line, what an architecture
cannot hold.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np

from .checkpoint import Checkpoint, CheckpointError, show
from ..core.config import Config
from ..core.fs import atomic_write, creation_mode, read_user_file
from .. import tokenizers
from . import hf_llama
from .hf_read import Architecture, Tensors, check_size, field, read_config, read_model, shard_files
from .hf_tokenizer import read_tokenizer, tokenizer_files
from .gguf_read import gguf_file, import_gguf
from .outputs import WRITER


def gpt2_state(cfg: Config, P: dict) -> dict:
    """GPT2LMHeadModel's names for our parameters."""
    sd = {"transformer.wte.weight": P["tok_emb"], "transformer.wpe.weight": P["pos_emb"],
          "transformer.ln_f.weight": P["ln_f_g"], "transformer.ln_f.bias": P["ln_f_b"]}
    for l in range(cfg.layers):
        p = lambda n: P[f"h{l}.{n}"]
        h = f"transformer.h.{l}."
        sd.update({
            h + "ln_1.weight": p("ln1_g"), h + "ln_1.bias": p("ln1_b"),
            h + "attn.c_attn.weight": np.concatenate([p("Wq"), p("Wk"), p("Wv")], axis=1),
            h + "attn.c_attn.bias": np.concatenate([p("bq"), p("bk"), p("bv")]),
            h + "attn.c_proj.weight": p("Wo"), h + "attn.c_proj.bias": p("bo"),
            h + "ln_2.weight": p("ln2_g"), h + "ln_2.bias": p("ln2_b"),
            h + "mlp.c_fc.weight": p("fc_in_W"), h + "mlp.c_fc.bias": p("fc_in_b"),
            h + "mlp.c_proj.weight": p("fc_out_W"), h + "mlp.c_proj.bias": p("fc_out_b"),
        })
    return {k: np.ascontiguousarray(v, np.float32) for k, v in sd.items()}


def gpt2_config_json(cfg: Config, tok) -> dict:
    return {
        "architectures": [GPT2.name], "model_type": GPT2.model_type,
        "vocab_size": cfg.vocab, "n_positions": cfg.ctx, "n_ctx": cfg.ctx, "n_embd": cfg.d_model,
        "n_layer": cfg.layers, "n_head": cfg.heads, "n_inner": cfg.d_mlp,
        "activation_function": cfg.block.mlp.hf_name,      # the model's own (a GPT-2 block's: a GELU)
        "layer_norm_epsilon": 1e-5, "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0,
        "initializer_range": 0.02, "tie_word_embeddings": True, "scale_attn_weights": True,
        "bos_token_id": 50256 if cfg.vocab == 50257 else 0, "eos_token_id": 50256 if cfg.vocab == 50257 else 0,
        "torch_dtype": "float32",
    }


def architecture_of(cfg: Config, what: str = "the model") -> Architecture:
    """The architecture that computes the model's block; what none computes is refused before
    anything is written, as is a sliding window (a window of ctx or more is plain attention and
    exports as such), which none of them computes."""
    if cfg.attn_window:
        raise CheckpointError(f"{what} attends through a sliding window (slidingWindow {cfg.window}), which "
                              "these Hugging Face architectures do not compute; export it as tinygpt or safetensors")
    for arch in ARCHITECTURES.values():
        if arch.computes(cfg.block):
            return arch
    raise CheckpointError(f"{what}'s block ({cfg.block.describe()}) is computed by none of the Hugging Face "
                          f"architectures tinygpt writes ({', '.join(ARCHITECTURES)}); export it as tinygpt or "
                          "safetensors")


def export_hf(ck: Checkpoint, out_dir, what: str = "the model", tokenizer_file: str | None = None) -> list:
    """The architecture's directory: config.json, model.safetensors, the tokenizer's files and
    generation_config.json (hf_tokenizer), which transformers' pipelines use as they are.
    Returns the names of the files written."""
    architecture_of(ck.cfg, what)
    d = Path(out_dir)
    if d.exists() and not d.is_dir():
        raise CheckpointError(f"{out_dir} exists and is not a directory")
    tok = tokenizers.of_record(ck.extra, ck.cfg.vocab, tokenizer_file)
    files = tokenizer_files(tok, ck.cfg)
    d.parent.mkdir(parents=True, exist_ok=True)
    files = {**files, **model_files(ck, tok)}
    write_directory(d, files)      # config.json last: it names the rest
    return sorted(files)


def model_files(ck: Checkpoint, tok=None) -> dict:
    """config.json and model.safetensors of the model's architecture, as bytes."""
    from safetensors.numpy import save
    arch = architecture_of(ck.cfg)
    config = {**arch.config_json(ck.cfg, tok), "tinygpt_writer": WRITER}   # marks the files as ours to replace
    return {"model.safetensors": save(arch.state(ck.cfg, ck.params), metadata={"format": "pt", "writer": WRITER}),
            "config.json": json.dumps(config, indent=2).encode()}


def write_directory(d: Path, files: dict):
    """The files whole in d, or none of them: built in a directory beside d and moved in. A new d
    is one rename; into an existing one (which may hold the user's other files) each file is
    renamed in once all are whole, the weights first, so config.json never names weights that
    are not there."""
    tmp = Path(tempfile.mkdtemp(prefix=".tinygpt-", dir=d.parent if str(d.parent) else "."))
    try:
        os.chmod(tmp, creation_mode(d, 0o777))     # a new d is tmp renamed: the umask's mode, not 0700
        for name, data in files.items():
            atomic_write(tmp / name, data)
        if d.is_dir() and not any(d.iterdir()):
            d.rmdir()                      # an empty directory (made when the output was claimed): new
        if not d.exists():
            os.rename(tmp, d)
            return
        for name in files:
            os.replace(tmp / name, d / name)
    except OSError as e:
        failed = d / Path(e.filename).name if e.filename else d
        raise OSError(e.errno, e.strerror, str(failed)) from e
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# ---- import ----------------------------------------------------------------------------------------
# Hugging Face's activation_function names for the two GELUs this architecture computes
HF_ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh"}


def gpt2_config(c: dict, label: str, ctx: int | None = None) -> Config:
    act = c.get("activation_function", "gelu_new")           # GPT2Config's default: GPT-2's own
    if not isinstance(act, str) or act not in HF_ACTIVATIONS:
        raise CheckpointError(f"{label}: activation {show(act)}; this architecture computes "
                              f"{', '.join(HF_ACTIVATIONS)} only")
    if c.get("tie_word_embeddings", True) is not True:
        raise CheckpointError(f"{label}: the head is not tied to the token embedding; this architecture ties them")
    eps = field(c, "layer_norm_epsilon", 1e-5, float, label)
    if abs(eps - 1e-5) > 1e-12:
        raise CheckpointError(f"{label}: LayerNorm epsilon {eps:g}; this architecture uses 1e-5")
    for k in ("scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn"):
        if c.get(k):
            raise CheckpointError(f"{label}: {k} is set; this architecture has no such variant")
    if c.get("scale_attn_weights", True) is not True:
        raise CheckpointError(f"{label}: attention without the 1/sqrt(head dim) scale; this architecture scales")
    n_ctx = field(c, "n_positions", None, int, label)
    if ctx is not None and ctx != n_ctx:
        raise CheckpointError(f"{label}: GPT-2's positions are a table of {n_ctx:,}; its context cannot change")
    C = field(c, "n_embd", None, int, label)
    cfg = Config(layers=field(c, "n_layer", None, int, label), d_model=C, heads=field(c, "n_head", None, int, label),
                 ctx=n_ctx, d_mlp=field(c, "n_inner", 4 * C, int, label),
                 vocab=field(c, "vocab_size", None, int, label), batch=1, activation=HF_ACTIVATIONS[act])
    if tokenizers.by_vocab(cfg.vocab) is None:
        known = ", ".join(f"{v:,} ({n})" for v, n in tokenizers.BY_VOCAB.items())
        raise CheckpointError(f"{label}: vocabulary {cfg.vocab:,}; tinygpt has tokenizers for {known} only")
    check_size(cfg, label, {"layers": "n_layer", "d_model": "n_embd", "heads": "n_head", "ctx": "n_positions",
                            "d_mlp": "n_inner", "vocab": "vocab_size"})
    return cfg


def _gpt2_block(read: Tensors, l: int, C: int, M: int) -> dict:
    """Block l's parameters under our names, GPT-2's fused c_attn split into q, k, v."""
    h = f"h.{l}."
    qkv_w, qkv_b = read(h + "attn.c_attn.weight", (C, 3 * C)), read(h + "attn.c_attn.bias", (3 * C,))
    p = {"ln1_g": read(h + "ln_1.weight", (C,)), "ln1_b": read(h + "ln_1.bias", (C,)),
         "Wq": qkv_w[:, :C], "Wk": qkv_w[:, C:2 * C], "Wv": qkv_w[:, 2 * C:],
         "bq": qkv_b[:C], "bk": qkv_b[C:2 * C], "bv": qkv_b[2 * C:],
         "Wo": read(h + "attn.c_proj.weight", (C, C)), "bo": read(h + "attn.c_proj.bias", (C,)),
         "ln2_g": read(h + "ln_2.weight", (C,)), "ln2_b": read(h + "ln_2.bias", (C,)),
         "fc_in_W": read(h + "mlp.c_fc.weight", (C, M)), "fc_in_b": read(h + "mlp.c_fc.bias", (M,)),
         "fc_out_W": read(h + "mlp.c_proj.weight", (M, C)), "fc_out_b": read(h + "mlp.c_proj.bias", (C,))}
    return {f"h{l}.{k}": np.ascontiguousarray(v) for k, v in p.items()}


def gpt2_read(read: Tensors, cfg: Config) -> dict:
    """Every parameter from the file, each checked as it is read."""
    C, M, V, T = cfg.d_model, cfg.d_mlp, cfg.vocab, cfg.ctx
    P = {"tok_emb": read("wte.weight", (V, C)), "pos_emb": read("wpe.weight", (T, C)),
         "ln_f_g": read("ln_f.weight", (C,)), "ln_f_b": read("ln_f.bias", (C,))}
    if "lm_head.weight" in read and not np.array_equal(read("lm_head.weight", (V, C)), P["tok_emb"]):
        raise CheckpointError(f"{read.names['lm_head.weight'][0]}: lm_head.weight differs from the token "
                              "embedding; this architecture ties them")
    for l in range(cfg.layers):
        P.update(_gpt2_block(read, l, C, M))
    return P


GPT2 = Architecture("GPT2LMHeadModel", "gpt2", "transformer.", gpt2_config, gpt2_read, gpt2_state,
                    gpt2_config_json, lambda block: block.gpt2, unread=(".attn.bias", ".attn.masked_bias"))
ARCHITECTURES = {a.name: a for a in (GPT2, *hf_llama.FAMILY)}


def architecture_named(c: dict, label: str) -> Architecture:
    """The architecture config.json names (model_type and architectures; GPT-2's where absent)."""
    names = c.get("architectures") or [GPT2.name]
    names = names if isinstance(names, list) else [names]
    for arch in ARCHITECTURES.values():
        if arch.name in names and c.get("model_type", arch.model_type) == arch.model_type:
            return arch
    raise CheckpointError(f"{label}: a {show(c.get('model_type'))} / {show(names)} model; tinygpt imports "
                          f"{', '.join(ARCHITECTURES)}")


MAX_CHAT_FILE = 1 << 20


def _json_file(path: Path) -> dict:
    """A small JSON object file of the directory, or {} where it is absent or not one."""
    if not path.exists():
        return {}
    try:
        got = json.loads(read_user_file(path, CheckpointError, str(path), "a JSON file", MAX_CHAT_FILE))
    except (ValueError, RecursionError):
        return {}
    return got if isinstance(got, dict) else {}


def chat_fields(d: Path, c: dict, tok, vocab: int) -> dict:
    """What a chat with the model needs from its directory: its chat template (tokenizer_config.json's
    chat_template, or chat_template.jinja), its end-of-turn ids (every eos_token_id that
    generation_config.json and config.json name, one or a list) and the template's bos_token."""
    out, tc = {}, _json_file(d / "tokenizer_config.json")
    template = tc.get("chat_template")
    if not isinstance(template, str) and (d / "chat_template.jinja").exists():
        template = read_user_file(d / "chat_template.jinja", CheckpointError, str(d / "chat_template.jinja"),
                                  "a chat template", MAX_CHAT_FILE).decode("utf-8", errors="replace")
    if isinstance(template, str) and template:
        out["chatTemplate"] = template
    stops = []
    for got in (_json_file(d / "generation_config.json").get("eos_token_id"), c.get("eos_token_id")):
        for i in (got if isinstance(got, list) else [got]):
            if isinstance(i, int) and not isinstance(i, bool) and 0 <= i < vocab:
                stops.append(i)
    out["stopTokens"] = list(dict.fromkeys(stops))
    bos = tc.get("bos_token")
    bos = bos.get("content") if isinstance(bos, dict) else bos
    lib = getattr(tok, "lib", None)
    if isinstance(bos, str) and lib is not None and lib.token_to_id(bos) is not None:
        out["tokenizerBos"] = lib.token_to_id(bos)
    return out


def import_hf(directory, quiet: bool = True, ctx: int | None = None) -> Checkpoint:
    """A Hugging Face model directory as a fresh .tinygpt checkpoint (its moments zero when saved); quiet=False:
    a progress bar over the weights' bytes (a large model's). ctx: the context of a rotary model
    (its config's by default; a learned table's cannot change)."""
    d = Path(directory)
    g = gguf_file(d)
    if g is not None:               # a llama.cpp model file, or a directory holding one
        return import_gguf(g, quiet, ctx)
    if not d.is_dir():
        raise CheckpointError(f"{directory} is neither a directory nor a GGUF file; give a directory with "
                              "config.json and model.safetensors, or a .gguf file")
    c, label = read_config(d)
    arch = architecture_named(c, label)
    cfg = arch.config(c, label, ctx)
    P = read_model(arch, Tensors(shard_files(d), cfg, arch.prefix), cfg, str(d), quiet, "reading the weights",
                   "its config.json")
    tok = hf_llama.Named(read_tokenizer(d, cfg.vocab) or tokenizers.by_vocab(cfg.vocab)) if arch is GPT2 else \
        hf_llama.tokenizer(d, cfg, c)
    extra = {**tok.record(), "importedFrom": str(d)}
    if arch is not GPT2:
        extra.update(chat_fields(d, c, tok, cfg.vocab))
    # no moments held: the file's slots are written as zeros, a tensor at a time (checkpoint.encode_pieces)
    return Checkpoint(cfg, P, None, None, 0, [], extra)
