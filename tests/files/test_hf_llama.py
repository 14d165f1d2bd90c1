"""Hugging Face's Llama family both ways, against transformers itself: random small Llama (GQA, an
untied head), Qwen2 (q/k/v biases, a tied head) and Qwen3 (QK-norm, multi-query) models that
transformers builds (tests/files/hf_reference.py, in a process of its own), each with a byte-level BPE
tokenizer.json, imported by `tinygpt import-hf`:
- the logits are transformers' within 1e-4 and 20 greedy tokens from the key/value cache are its;
- the tokenizer travels in the file: encode is the tokenizers library's, and train, eval and
  prepare take the model alone;
- `tinygpt export --format hf` loads back in transformers as the same architecture with the same
  logits, and its pipeline("text-generation") gives `generate`'s greedy text;
- a LoRA fine-tune over every projection trains, and its PEFT export loads in peft over the hf
  export with the fine-tune's logits.
transformers, peft and torch come with make test (make engines); without them these skip, saying so."""
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from support import run_cli
from tinygpt.files import checkpoint as ckpt

FAMILIES = ("llama", "qwen2", "qwen3")
ARCH = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}
HERE = Path(__file__).parent


def reference(*args):
    """tests/files/hf_reference.py in a process of its own."""
    missing = [m for m in ("torch", "transformers", "peft", "tokenizers") if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed: make engines (or pip install torch transformers peft)")
    r = subprocess.run([sys.executable, str(HERE / "hf_reference.py"), *map(str, args)], capture_output=True,
                       text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]


@pytest.fixture(scope="module")
def hf(tmp_path_factory):
    d = tmp_path_factory.mktemp("hf_llama")
    reference("build", d)
    return d


@pytest.fixture(scope="module")
def imported(hf):
    """Each family imported from the command line."""
    out = {}
    for f in FAMILIES:
        out[f] = hf / f"{f}.tinygpt"
        assert run_cli("import-hf", hf / f, "--out", out[f]) == 0
    return out


@pytest.mark.parametrize("family", FAMILIES)
def test_imported_logits_and_greedy_tokens_are_transformers(hf, imported, family):
    from tinygpt import GPT
    ref = np.load(hf / family / "ref.npz")
    gpt = GPT.load(imported[family])
    assert gpt.config.block.describe() and not gpt.config.block.gpt2
    got = gpt.logits(ref["ids"])
    err = float(np.abs(got - ref["logits"]).max())
    print(f"{family}: logits against transformers' max error {err:.2e} (largest logit "
          f"{np.abs(ref['logits']).max():.2f})")
    assert err < 1e-4
    prompt = ref["greedy"][:5]
    tokens = gpt.generate(prompt, 20)
    assert np.array_equal(tokens, ref["greedy"]), (tokens, ref["greedy"])
    assert np.array_equal(gpt.encode("To be, or not to be: that is the question"), ref["text_ids"])


@pytest.mark.parametrize("family", ["llama3rope", "linearrope", "mistral"])
def test_scaled_rope_and_mistral_import_with_transformers_logits(hf, tmp_path, family):
    """Llama 3's and linear RoPE scaling (their frequencies made on the host as transformers makes
    them) and Mistral (a sliding window of 6 in 16 positions): logits within 1e-4, the same greedy
    tokens, and the scaling kept by the file."""
    from tinygpt import GPT
    out = tmp_path / f"{family}.tinygpt"
    assert run_cli("import-hf", hf / family, "--out", out, "--quiet") == 0
    ref = np.load(hf / family / "ref.npz")
    gpt = GPT.load(out)
    got = gpt.logits(ref["ids"])
    err = float(np.abs(got - ref["logits"]).max())
    print(f"{family}: logits against transformers' max error {err:.2e} (largest {np.abs(ref['logits']).max():.2f}); "
          f"rope scaling {gpt.config.rope_scaling}, window {gpt.config.window}")
    assert err < 1e-4
    assert np.array_equal(gpt.generate(ref["greedy"][:5], 20, stop=False), ref["greedy"])
    assert (gpt.config.rope_scaling is not None) == family.endswith("rope")
    assert (gpt.config.window == 6) == (family == "mistral")


def test_the_files_record_the_tokenizer_and_the_parts(imported):
    ck = ckpt.load(imported["qwen3"])
    assert ck.extra["tokenizer"] == "hf" and ck.extra["tokenizerJson"].startswith("{")
    c = ck.header["config"]
    assert c["norm"] == "rmsnorm" and c["qkNorm"] == "weighted" and c["kvHeads"] == 1 and not c["tiedHead"]
    assert c["headDim"] == 16 and ck.params["h0.Wq"].shape == (32, 64) and ck.params["h0.Wo"].shape == (64, 32)
    assert ckpt.load(imported["qwen2"]).header["config"]["bias"] == "qkv"
    assert ckpt.load(imported["llama"]).header["config"]["ropeTheta"] == 500000.0


def test_export_loads_back_in_transformers_with_its_pipeline(hf, imported, tmp_path):
    from tinygpt import GPT
    outs = []
    for f in FAMILIES:
        outs.append(tmp_path / f)
        assert run_cli("export", "--model", imported[f], "--format", "hf", outs[-1]) == 0
    reference("load", *outs)
    for f, d in zip(FAMILIES, outs):
        ref, back = np.load(hf / f / "ref.npz"), np.load(d / "loaded.npz")
        assert str(back["architecture"]) == ARCH[f]
        assert json.loads((d / "config.json").read_text())["architectures"] == [ARCH[f]]
        err = float(np.abs(back["logits"] - ref["logits"]).max())
        print(f"{f}: the export's logits in transformers against the original's: max difference {err:.2e}")
        assert err < 1e-5
        ours = GPT.load(imported[f]).generate("To be, or not to be: that is the question", 20)
        assert str(back["text"]) == ours, (str(back["text"]), ours)


@pytest.mark.parametrize("family", FAMILIES)
def test_a_lora_fine_tune_trains_and_its_peft_export_loads_in_peft(hf, imported, tmp_path, family):
    """Every projection the family has (q, k, v, o, gate, up, down); the text is tokenized by the
    model's own tokenizer, from its file alone (prepare, then train)."""
    from tinygpt import GPT
    text, data, ft = tmp_path / "t.txt", tmp_path / "t.bin", tmp_path / "ft.tinygpt"
    text.write_text("To be, or not to be: that is the question. " * 200)
    assert run_cli("prepare", text, "--out", data, "--model", imported[family], "--quiet") == 0
    assert run_cli("train", "--resume", imported[family], "--data", data, "--lora", 4, "--lora-targets",
                   "q,k,v,o,gate,fc_in,fc_out", "--steps", 10, "--batch", 4, "--lr", 1e-2, "--eval-every", 0,
                   "--sample-tokens", 0, "--out", ft, "--quiet") == 0
    peft_dir, base_dir = tmp_path / "peft", tmp_path / "hf"
    assert run_cli("export", "--model", imported[family], "--format", "hf", base_dir) == 0
    assert run_cli("export", "--model", ft, "--format", "peft", peft_dir) == 0
    config = json.loads((peft_dir / "adapter_config.json").read_text())
    assert sorted(config["target_modules"]) == sorted(["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                                       "up_proj", "down_proj"])
    reference("load", peft_dir)
    ref, back = np.load(hf / family / "ref.npz"), np.load(peft_dir / "loaded.npz")
    ours = GPT.load(ft).logits(ref["ids"])
    err, moved = float(np.abs(back["logits"] - ours).max()), float(np.abs(ref["logits"] - ours).max())
    print(f"{family}: peft's logits against the fine-tune's: max difference {err:.2e} (the base's differ by "
          f"{moved:.2e})")
    assert err < 1e-4 and moved > 100 * err


def llama_model(**parts):
    """A tiny model of Llama's block (a byte vocabulary), as ours: its export is a Llama directory."""
    from tinygpt.core.config import preset
    from tinygpt.core.init import init_params
    parts = {"norm": "rmsnorm", "position": "rope", "activation": "swiglu", "bias": "none", "tied": False, **parts}
    cfg = preset("tiny", layers=2, d_model=16, heads=4, ctx=12, vocab=256, **parts)
    return ckpt.Checkpoint(cfg, init_params(cfg), None, None, 0, [], {"tokenizer": "byte"})


@pytest.mark.parametrize("parts, arch", [({}, "LlamaForCausalLM"), ({"bias": "qkv", "tied": True}, "Qwen2ForCausalLM"),
                                         ({"qk_norm": "weighted", "kv_heads": 2}, "Qwen3ForCausalLM"),
                                         ({"qk_norm": "weighted", "kv_heads": 2, "head_dim": 8}, "Qwen3ForCausalLM"),
                                         ({"bias": "all"}, "LlamaForCausalLM")])
def test_export_then_import_is_the_identity(tmp_path, parts, arch):
    """Each block of the family exports as its architecture (without transformers) and reads back
    bit for bit; a sharded directory (an index and two files) reads as one."""
    from safetensors.numpy import load_file, save_file
    from tinygpt.files.hf import export_hf, import_hf
    ck = llama_model(**parts)
    export_hf(ck, tmp_path / "hf")
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["architectures"] == [arch]
    sd = load_file(tmp_path / "hf" / "model.safetensors")
    names = sorted(sd)
    halves = {"part-a.safetensors": names[::2], "part-b.safetensors": names[1::2]}     # any names the index gives
    for f, keys in halves.items():
        save_file({k: sd[k] for k in keys}, tmp_path / "hf" / f)
    (tmp_path / "hf" / "model.safetensors").unlink()
    (tmp_path / "hf" / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {k: f for f, keys in halves.items() for k in keys}}))
    back = import_hf(tmp_path / "hf")
    assert back.cfg.block == ck.cfg.block and back.extra["tokenizer"] == "byte"
    for name, a in ck.params.items():
        assert np.array_equal(back.params[name], a), name
    shard = (tmp_path / "hf" / "part-b.safetensors").read_bytes()       # a file it reads is never its output
    assert run_cli("import-hf", tmp_path / "hf", "--out", tmp_path / "hf" / "part-b.safetensors", "--force") != 0
    assert (tmp_path / "hf" / "part-b.safetensors").read_bytes() == shard


@pytest.mark.parametrize("edit, says", [
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "low_freq_factor is null"),   # llama3's, incomplete
    ({"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, "rope_scaling has rope_type 'dynamic'"),
    ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4}}, "rope_parameters has rope_type 'yarn'"),
    ({"use_sliding_window": True}, "use_sliding_window"),
    ({"layer_types": ["sliding_attention", "full_attention"]}, "sliding"),
    ({"head_dim": 200}, "head_dim 200; tinygpt's attention takes heads of 1 to 128 channels"),
    ({"hidden_act": "gelu"}, "hidden_act 'gelu'"),
    ({"attention_bias": True}, "attention_bias is set without its partner"),
    ({"num_key_value_heads": 3}, "kv"),
    ({"max_position_embeddings": None}, "no max_position_embeddings"),
    ({"pretraining_tp": 2}, "pretraining_tp 2"),
])
def test_what_the_family_cannot_compute_is_refused_naming_the_field(tmp_path, capsys, edit, says):
    from tinygpt.files.hf import export_hf
    export_hf(llama_model(), tmp_path / "hf")
    c = json.loads((tmp_path / "hf" / "config.json").read_text())
    c.update(edit)
    (tmp_path / "hf" / "config.json").write_text(json.dumps(c))
    out = tmp_path / "m.tinygpt"
    assert run_cli("import-hf", tmp_path / "hf", "--out", out) == 1
    err = [l for l in capsys.readouterr().err.splitlines() if l.strip() and "XDG" not in l]
    assert len(err) == 1 and says in err[0], err
    assert not out.exists()


def test_a_rotary_models_context_is_chosen_on_import(tmp_path, capsys):
    from tinygpt.files.hf import export_hf
    export_hf(llama_model(), tmp_path / "hf")
    assert run_cli("import-hf", tmp_path / "hf", "--out", tmp_path / "m.tinygpt", "--ctx", 8) == 0
    assert ckpt.load(tmp_path / "m.tinygpt").cfg.ctx == 8
    assert run_cli("import-hf", tmp_path / "hf", "--out", tmp_path / "n.tinygpt", "--ctx", 13) == 1
    assert "1 to its max_position_embeddings, 12" in capsys.readouterr().err


def small_bpe(pre_tokenizer: str = "byte_level") -> str:
    """A tokenizer.json trained here: byte-level BPE (Llama 3's, Qwen's kind), or a Metaspace one
    (SentencePiece's kind, which marks each piece's first word)."""
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import decoders, models, pre_tokenizers, trainers
    tok = tokenizers.Tokenizer(models.BPE())
    if pre_tokenizer == "byte_level":
        tok.pre_tokenizer, tok.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
        alphabet = pre_tokenizers.ByteLevel.alphabet()
    else:
        tok.pre_tokenizer, tok.decoder = pre_tokenizers.Metaspace(), decoders.Metaspace()
        alphabet = []
    text = "To be, or not to be: that is the question.\nWhether 'tis nobler in the mind to suffer\n" * 30
    tok.train_from_iterator([text], trainers.BpeTrainer(vocab_size=200, initial_alphabet=alphabet))
    return tok.to_str()


@pytest.mark.parametrize("kind", ["byte_level", "metaspace"])
def test_a_long_text_is_tokenized_in_pieces_as_whole(monkeypatch, kind):
    """With the piece size forced down to 64 characters: the pieces' tokens (encode's and a token
    file's, from chunks of odd sizes) are the tokenizers library's for the whole text; a
    tokenizer whose pieces would differ (Metaspace marks each piece's first word) is found so on
    load and encodes the text whole."""
    from tinygpt.tokenizers import hf
    text = "".join(f"line {i}: to be, or not to be.\n{'  ' if i % 7 == 0 else ''}" for i in range(400))
    tok = hf.HFTokenizer(small_bpe(kind), 256)
    assert tok.cuts == (kind == "byte_level")
    want = tok.lib.encode(text, add_special_tokens=False).ids
    monkeypatch.setattr(hf, "PIECE", 64)
    raw = text.encode()
    chunks = [raw[i:i + 97] for i in range(0, len(raw), 97)] + [b""]
    got = np.concatenate(list(tok.encode_chunks(iter(chunks), "text")))
    assert tok.encode(text).tolist() == want and got.tolist() == want
    assert tok.decode(want) == text if kind == "byte_level" else tok.decode(want).strip()
