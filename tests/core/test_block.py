"""The block's parts (core.block) through the whole tool: the flags, the file (version 3, which
upstream's readers refuse), resume, sampling from the cache, info and the refusals. The kernels and
the model against the float64 reference: test_kernels.py, test_model.py, test_decode.py."""
import itertools
import json
import struct

import numpy as np
import pytest

from tinygpt.commands.cli import main
from tinygpt.core.block import BIASES, MLPS, NORMS, POSITIONS, QK_NORMS
from tinygpt.core.config import n_params, param_shapes, preset
from tinygpt.files import checkpoint as ckpt

MODERN = ["--norm", "rmsnorm", "--position", "rope", "--rope-theta", "500", "--mlp", "relu2", "--norm-eps", "1e-6",
          "--no-bias", "--untied-head", "--qk-norm", "weighted", "--kv-heads", "1", "--logit-softcap", "15",
          "--embed-norm"]
TINY = ["--preset", "tiny", "--layers", "1", "--batch", "4", "--ctx", "16", "--quiet", "--sample-tokens", "0",
        "--eval-every", "0", "--lr", "3e-3"]


def test_the_nanochat_block_is_its_parts_and_each_part_option_wins(tmp_path, sentences):
    out = tmp_path / "n.tinygpt"
    assert main(["train", *TINY, "--block", "nanochat", "--kv-heads", "1", "--logit-softcap", "10", "--steps", "2",
                 "--data", str(sentences), "--out", str(out)]) == 0
    cfg = ckpt.load(out).cfg
    assert (cfg.norm, cfg.position, cfg.activation, cfg.bias, cfg.tied, cfg.qk_norm, cfg.embed_norm) == \
        ("rmsnorm_free", "rope", "relu2", "none", False, "free", True)
    assert (cfg.softcap, cfg.n_kv) == (10.0, 1)
    # resumed with the same options: no contradiction; the block's name alone says a cap of 15: one
    assert main(["train", "--resume", str(out), "--block", "nanochat", "--logit-softcap", "10", "--steps", "3",
                 "--quiet", "--data", str(sentences)]) == 0
    assert main(["train", "--resume", str(out), "--block", "nanochat", "--steps", "4", "--quiet",
                 "--data", str(sentences)]) == 2
    assert ckpt.load(out).step == 3


def test_the_llama_block_trains_from_the_api_and_keeps_its_mlp_width(tmp_path, sentences):
    from tinygpt import GPT
    gpt = GPT.from_preset("tiny", block="llama", kv_heads=1, layers=1, ctx=16, batch=4)
    cfg = gpt.config
    assert (cfg.norm, cfg.position, cfg.activation, cfg.bias, cfg.tied, cfg.rope_theta, cfg.n_kv) == \
        ("rmsnorm", "rope", "swiglu", "none", False, 500000.0, 1)
    assert cfg.d_mlp == 128        # 8/3 of 4 x 48, rounded up to 8: three matrices of 48 x 128 where GELU has two of 192
    again = GPT.from_config(cfg)
    assert again.config == cfg


@pytest.mark.parametrize("parts", [dict(activation="swiglu", bias="all", norm="layernorm", kv_heads=1),
                                   dict(activation="swiglu", bias="qkv", norm="rmsnorm", tied=False, embed_norm=True,
                                        qk_norm="weighted", position="rope", softcap=5.0),
                                   dict(heads=4, head_dim=20, bias="qkv", kv_heads=2, activation="swiglu")])
def test_every_part_goes_through_the_file_and_back(tmp_path, parts):
    """A model of the parts, saved and loaded: the same config, the same tensors under upstream-style
    names, and its export as safetensors names each."""
    from tinygpt.core.init import init_params
    cfg = preset("tiny", **parts).validate()
    params = init_params(cfg)
    ckpt.save(tmp_path / "m.tinygpt", ckpt.Checkpoint(cfg, params, extra={"tokenizer": "byte"}))
    back = ckpt.load(tmp_path / "m.tinygpt")
    assert back.cfg == cfg and set(back.params) == set(params)
    assert all(np.array_equal(back.params[n], params[n]) for n in params)
    names = [e["name"] for e in ckpt.manifest(cfg)]
    assert len(set(names)) == len(names) and "blocks.0.mlp.fc_gate.weight" in names


def test_the_parts_table_and_parameter_count_agree():
    """param_shapes and n_params (arithmetic) agree for every combination of the parts; RMSNorm has
    no biases, RoPE no table."""
    for parts in itertools.product(NORMS, POSITIONS, MLPS, BIASES, (True, False), QK_NORMS):
        cfg = preset("small", **dict(zip(("norm", "position", "activation", "bias", "tied", "qk_norm"),
                                         parts))).validate()
        names = {n for n, _, _ in param_shapes(cfg)}
        assert sum(int(np.prod(s)) for _, s, _ in param_shapes(cfg)) == n_params(cfg), parts
        assert ("pos_emb" in names) == (cfg.position == "learned")
        assert ("ln_f_b" in names) == ("h2.ln2_b" in names) == (cfg.norm == "layernorm")
        assert ("h1.bq" in names) == (cfg.bias != "none") and ("h1.bo" in names) == (cfg.bias == "all")
        assert ("lm_head" in names) == (not cfg.tied) and ("h0.k_norm_g" in names) == (cfg.qk_norm == "weighted")
    # heads set apart from the width (q 80 wide in 96, k and v 40): Wq, bq, Wo and the gains follow
    cfg = preset("small", heads=4, head_dim=20, kv_heads=2, bias="qkv", qk_norm="weighted").validate()
    shapes = {n: s for n, s, _ in param_shapes(cfg)}
    assert (shapes["h0.Wq"], shapes["h0.bq"], shapes["h0.Wk"], shapes["h0.Wo"], shapes["h0.q_norm_g"]) == \
        ((96, 80), (80,), (96, 40), (80, 96), (20,))
    assert sum(int(np.prod(s)) for s in shapes.values()) == n_params(cfg) and not cfg.block.gpt2


def test_a_modern_run_trains_resumes_bit_for_bit_samples_and_is_a_version_3_file(tmp_path, sentences, capsys):
    whole, half = tmp_path / "whole.tinygpt", tmp_path / "half.tinygpt"
    common = [*TINY, *MODERN, "--data", str(sentences), "--optimizer", "adamw", "--schedule", "constant"]
    assert main(["train", *common, "--steps", "6", "--out", str(whole)]) == 0
    assert main(["train", *common, "--steps", "3", "--out", str(half)]) == 0
    assert main(["train", "--resume", str(half), "--steps", "6", "--quiet", "--data", str(sentences)]) == 0
    a, b = ckpt.load(whole), ckpt.load(half)
    assert a.step == b.step == 6
    for name in a.params:
        assert np.array_equal(a.params[name].view(np.uint32), b.params[name].view(np.uint32)), name
    blk = a.cfg.block
    assert (blk.norm.name, blk.position.name, blk.mlp.name, blk.rope_theta, blk.eps) == \
        ("rmsnorm", "rope", "relu2", 500.0, 1e-6)
    raw = whole.read_bytes()
    version, hlen = struct.unpack("<II", raw[4:12])
    header = json.loads(raw[12:12 + hlen])
    # upstream's readers (its playground's decodeModelFile, python_ref/load_tinygpt.py) take versions
    # 1 and 2 alone: a version-3 file is refused there, never read as GPT-2's block
    assert version == header["version"] == 3 and version not in (1, 2)
    assert {k: header["config"][k] for k in ("norm", "position", "ropeTheta", "normEps", "activation", "bias",
                                             "tiedHead", "qkNorm", "kvHeads", "logitSoftcap", "embedNorm")} == \
        {"norm": "rmsnorm", "position": "rope", "ropeTheta": 500.0, "normEps": 1e-6, "activation": "relu2",
         "bias": "none", "tiedHead": False, "qkNorm": "weighted", "kvHeads": 1, "logitSoftcap": 15.0,
         "embedNorm": True}
    assert not any(e["name"].startswith("position_embedding") or e["name"].endswith("ln1.bias")
                   for e in header["manifest"])
    capsys.readouterr()
    assert main(["sample", "--model", str(whole), "--tokens", "20", "--temperature", "0", "--prompt", "It was"]) == 0
    cached = capsys.readouterr().out
    assert main(["sample", "--model", str(whole), "--tokens", "20", "--temperature", "0", "--prompt", "It was",
                 "--no-cache"]) == 0
    assert capsys.readouterr().out == cached and cached.startswith("It was")
    assert main(["info", "--model", str(whole), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["block"] == ("rmsnorm (eps 1e-06), rope (theta 500), relu2, no biases, untied head, qk-norm weighted, "
                             "1 kv heads, logits capped at 15, normed embedding"), info["block"]
    # a GPT-2 block's file stays version 2, upstream's
    gpt2 = tmp_path / "gpt2.tinygpt"
    assert main(["train", *TINY, "--steps", "1", "--data", str(sentences), "--out", str(gpt2)]) == 0
    assert struct.unpack("<I", gpt2.read_bytes()[4:8])[0] == 2


@pytest.mark.parametrize("extra, needle", [
    (["--rope-theta", "500"], "--rope-theta is RoPE's base: give it with --position rope"),
    (["--position", "rope", "--heads", "2", "--d-model", "20"], "must be a multiple of 4"),
    (["--kv-heads", "2"], "--kv-heads must divide --heads (3)"),
    (["--heads", "5"], "--heads (5) must divide --d-model (48); try --heads 4, or give --head-dim"),
    (["--position", "rope", "--head-dim", "6"], "(--head-dim, or --d-model/--heads) = 6 must be a multiple of 4"),
    (["--head-dim", "7", "--precision", "bf16"], "--precision bf16 needs --head-dim a multiple of 8, got 7"),
])
def test_a_combination_the_block_cannot_take_is_one_line(tmp_path, sentences, capsys, extra, needle):
    assert main(["train", *TINY, "--steps", "1", "--data", str(sentences), "--out", str(tmp_path / "x.tinygpt"),
                 *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert needle in err[-1] and "Traceback" not in "\n".join(err), err
    assert not (tmp_path / "x.tinygpt").exists()


@pytest.mark.parametrize("key, value", [("useRoPE", True), ("useRMSNorm", True), ("useSwiGLU", True),
                                        ("useQKNorm", True), ("nKvHeads", 1), ("attnBias", False),
                                        ("tieEmbeddings", False)])
def test_the_mac_apps_parts_are_refused_until_mapped(key, value):
    c = {"layers": 1, "dModel": 48, "heads": 3, "ctx": 16, key: value}
    with pytest.raises(ckpt.CheckpointError, match=f"sets {key}"):
        ckpt.config_from_header(c, "the file")
    assert ckpt.config_from_header({**c, key: {"nKvHeads": 3, "attnBias": True, "tieEmbeddings": True}.get(key, False)},
                                   "the file").block.gpt2          # their GPT-2 values read as GPT-2's block


def test_resume_and_export_refuse_what_contradicts_the_block(tmp_path, sentences, capsys):
    out = tmp_path / "m.tinygpt"
    assert main(["train", *TINY, *MODERN, "--steps", "1", "--data", str(sentences), "--out", str(out)]) == 0
    capsys.readouterr()
    assert main(["train", "--resume", str(out), "--steps", "2", "--norm", "layernorm", "--quiet",
                 "--data", str(sentences)]) == 2
    assert "--norm layernorm (file: norm rmsnorm)" in capsys.readouterr().err
    assert main(["train", "--resume", str(out), "--steps", "2", "--block", "gpt2", "--quiet",
                 "--data", str(sentences)]) == 2
    assert "--block gpt2 (file: rmsnorm" in capsys.readouterr().err
    assert main(["export", "--model", str(out), "--format", "hf", str(tmp_path / "hf")]) != 0
    err = capsys.readouterr().err
    assert "computed by none of the Hugging Face architectures" in err and not (tmp_path / "hf").exists(), err
