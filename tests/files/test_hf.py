"""Hugging Face GPT-2 directories: export then import is the identity, bit for bit; the imported
model's logits are the reference's; what this architecture cannot hold is refused in one line;
an imported model fine-tunes from the command line."""
import json
import struct
import subprocess
import sys

import numpy as np
import pytest

from support import model, rewrite, SHARED
from tinygpt.files import checkpoint as ckpt
from tinygpt.commands.cli import main
from tinygpt.core.config import preset
from tinygpt.files.hf import export_hf, import_hf, model_files, write_directory
from tinygpt.reference import gpt as RG
from tinygpt.core.init import init_params
from tinygpt.model.spec import RunSpec


R50K = SHARED / "r50k_base.tiktoken"


def tokenizer_flags(tokenizer: str) -> list:
    """The export's flags for a model of this tokenizer: gpt2's needs r50k_base's file (skipped without)."""
    if tokenizer != "gpt2":
        return []
    if not R50K.exists():
        pytest.skip("no r50k_base.tiktoken beside the checkout (the gpt2 tokenizer's file)")
    return ["--tokenizer-file", str(R50K)]


def model_tanh():
    ck = model()
    ck.cfg.activation = "gelu_tanh"
    return ck


@pytest.mark.parametrize("vocab", [256, 50257, "tanh"])
def test_export_then_import_is_the_identity(tmp_path, vocab):
    """And a model with GPT-2's tanh GELU stays one: exported as gelu_new, imported as gelu_tanh."""
    ck = model_tanh() if vocab == "tanh" else model(vocab)
    vocab = ck.cfg.vocab
    if vocab == 50257 and not R50K.exists():    # the weights alone: the tokenizer's files need r50k_base
        write_directory(tmp_path / "hf", model_files(ck))
    else:
        export_hf(ck, tmp_path / "hf", tokenizer_file=R50K if vocab == 50257 else None)
    back = import_hf(tmp_path / "hf")
    assert back.cfg.__dict__ == {**ck.cfg.__dict__, "batch": back.cfg.batch, "lr": back.cfg.lr}
    for name, a in ck.params.items():
        assert back.params[name].dtype == np.float32 and np.array_equal(back.params[name], a), name
    assert back.step == 0 and back.m is None and back.v is None and back.adam_moments     # zeros when saved
    assert back.extra["tokenizer"] == ("gpt2" if vocab == 50257 else "byte")
    written = json.loads((tmp_path / "hf" / "config.json").read_text())["activation_function"]
    assert written == {"gelu": "gelu", "gelu_tanh": "gelu_new"}[ck.cfg.activation]


def test_gpt2s_gelu_is_imported_as_itself(tmp_path):
    """GPT-2's config names gelu_new (or gelu_pytorch_tanh, or nothing: GPT2Config's default is
    gelu_new): the model imported computes that GELU, and says so in its header."""
    for act in ("gelu_new", "gelu_pytorch_tanh", None):
        export_hf(model(), tmp_path / "hf")
        c = json.loads((tmp_path / "hf" / "config.json").read_text())
        c.pop("activation_function") if act is None else c.update(activation_function=act)
        (tmp_path / "hf" / "config.json").write_text(json.dumps(c))
        ck = import_hf(tmp_path / "hf")
        assert ck.cfg.activation == "gelu_tanh", act
        ckpt.save(tmp_path / "m.tinygpt", ck)
        back = ckpt.load(tmp_path / "m.tinygpt")
        assert back.cfg.activation == "gelu_tanh" and back.header["config"]["activation"] == "gelu_tanh"


@pytest.mark.kernel
@pytest.mark.parametrize("act", ["gelu", "gelu_new"])
def test_imported_logits_match_the_reference_and_gpt2_naming(tmp_path, gpu, plan, act):
    """Keys without the transformer. prefix, as GPT-2's own files have them, and half precision;
    the exact GELU and GPT-2's own."""
    from safetensors.numpy import load_file, save_file
    from tinygpt.model.gpt import Model
    ck = model_tanh() if act == "gelu_new" else model()
    export_hf(ck, tmp_path / "hf")
    sd = load_file(tmp_path / "hf" / "model.safetensors")
    save_file({k.replace("transformer.", ""): v for k, v in sd.items()}, tmp_path / "hf" / "model.safetensors")
    back = import_hf(tmp_path / "hf")
    assert back.cfg.activation == ck.cfg.activation
    x = np.random.default_rng(1).integers(0, 256, (2, 12)).astype(np.uint32)
    m = Model(gpu, plan, RunSpec(back.cfg, "online", B=2, training=False))
    m.set_params(back.params)
    want = RG.forward({k: v.astype(np.float64) for k, v in back.params.items()}, back.cfg, x)
    got = m.logits_of(x)
    err = np.abs(got - want).max()
    print(f"imported model's logits against the reference: max error {err:.2e}")
    assert err < 1e-4 * np.abs(want).max()
    rewrite(tmp_path / "hf", tensors={k.replace("transformer.", ""): v.astype(np.float16) for k, v in sd.items()})
    half = import_hf(tmp_path / "hf")
    assert np.array_equal(half.params["h1.Wv"], ck.params["h1.Wv"].astype(np.float16).astype(np.float32))


@pytest.mark.parametrize("edit, says", [
    (dict(config={"activation_function": "relu"}), "activation 'relu'"),
    (dict(config={"activation_function": ["gelu"]}), 'activation ["gelu"]'),
    (dict(config={"tie_word_embeddings": False}), "not tied"),
    (dict(config={"vocab_size": 1000}), "vocabulary 1,000"),
    (dict(config={"layer_norm_epsilon": 1e-6}), "epsilon"),
    (dict(config={"model_type": "llama"}), "tinygpt imports GPT2LMHeadModel, LlamaForCausalLM"),
    (dict(drop="transformer.h.1.mlp.c_fc.bias"), "no tensor h.1.mlp.c_fc.bias"),
    (dict(tensors={"transformer.h.0.ln_1.weight": np.ones(15, np.float32)}), "has shape [15]"),
    (dict(tensors={"lm_head.weight": np.zeros((256, 16), np.float32)}), "lm_head.weight differs"),
])
def test_what_the_architecture_cannot_hold_is_refused(tmp_path, capsys, edit, says):
    export_hf(model(), tmp_path / "hf")
    rewrite(tmp_path / "hf", **edit)
    out = tmp_path / "m.tinygpt"
    assert main(["import-hf", str(tmp_path / "hf"), "--out", str(out)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0], err
    assert not out.exists()


def test_damaged_safetensors_are_refused_before_reading(tmp_path, capsys):
    export_hf(model(), tmp_path / "hf")
    f = tmp_path / "hf" / "model.safetensors"
    raw = f.read_bytes()
    f.write_bytes(struct.pack("<Q", 1 << 40) + raw[8:])            # a header size past the file
    assert main(["import-hf", str(tmp_path / "hf"), "--out", str(tmp_path / "m.tinygpt")]) == 1
    assert "header of" in capsys.readouterr().err
    f.write_bytes(raw[:len(raw) // 2])                              # truncated inside a tensor
    assert main(["import-hf", str(tmp_path / "hf"), "--out", str(tmp_path / "m.tinygpt")]) == 1
    err = capsys.readouterr().err
    assert "outside the file" in err or "truncated" in err


def test_import_then_fine_tune_from_the_command_line(tmp_path, capsys):
    export_hf(model(), tmp_path / "hf")
    rewrite(tmp_path / "hf", config={"activation_function": "gelu_new"})
    m = tmp_path / "m.tinygpt"
    assert main(["import-hf", str(tmp_path / "hf"), "--out", str(m)]) == 0
    assert "activation gelu_tanh" in capsys.readouterr().err
    m.unlink()
    assert main(["import-hf", str(tmp_path / "hf"), "--out", str(m)]) == 0
    assert "fine-tune with" in capsys.readouterr().err
    corpus = tmp_path / "c.txt"
    corpus.write_text("the quick brown fox jumps over the lazy dog. " * 400)
    assert main(["train", "--resume", str(m), "--data", str(corpus), "--steps", "3", "--batch", "4", "--lr", "1e-3",
                 "--eval-every", "0", "--sample-tokens", "0", "--quiet"]) == 0
    assert ckpt.load(m).step == 3


def test_logits_match_transformers_gpt2_with_gelu_new(tmp_path, gpu, plan):
    """A small random GPT2Config made offline, GPT-2's gelu_new: transformers' logits and the
    imported model's agree to float32 noise (where torch and transformers are installed:
    pip install torch transformers, then pytest tests/files/test_hf.py -k transformers)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from tinygpt.model.gpt import Model
    torch.manual_seed(0)
    conf = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, n_positions=16, vocab_size=256,
                                   activation_function="gelu_new", resid_pdrop=0, embd_pdrop=0, attn_pdrop=0)
    hf = transformers.GPT2LMHeadModel(conf).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(torch.randn_like(p) * 0.2)      # biases and LayerNorms off their init, so every term counts
    hf.save_pretrained(tmp_path / "hf", safe_serialization=True)
    ck = import_hf(tmp_path / "hf")
    assert ck.cfg.activation == "gelu_tanh"
    x = np.random.default_rng(2).integers(0, 256, (2, 16))
    with torch.no_grad():
        want = hf(torch.tensor(x)).logits.double().numpy()
    m = Model(gpu, plan, RunSpec(ck.cfg, "online", B=2, training=False))
    m.set_params(ck.params)
    err = np.abs(m.logits_of(x.astype(np.uint32)) - want).max()
    print(f"logits against transformers' GPT-2 (gelu_new): max error {err:.2e}")
    assert err < 1e-4 * np.abs(want).max()


@pytest.mark.parametrize("tokenizer", ["byte", "gpt2"])
def test_transformers_pipeline_on_the_export_is_tinygpt_sample(tmp_path, tokenizer):
    """The export as Hugging Face's tools take it: AutoTokenizer encodes as tinygpt does, and
    pipeline("text-generation") with the export's own generation config gives the greedy text of
    `tinygpt sample --temperature 0`, to the context's end. A random model: its greedy tokens vary."""
    pytest.importorskip("torch", reason="transformers' pipeline runs on PyTorch (pip install -e '.[torch]')")
    transformers = pytest.importorskip("transformers", reason="pip install transformers to run this check")
    more = tokenizer_flags(tokenizer)
    import tinygpt
    m, d = tmp_path / "m.tinygpt", tmp_path / "hf"
    cfg = preset("tiny", layers=1, ctx=48, vocab=50257 if tokenizer == "gpt2" else 256)
    r = np.random.default_rng(3)        # weights far off their init: greedy text that does not repeat at once
    p = {k: (v + r.standard_normal(v.shape) * 0.3).astype(np.float32) for k, v in init_params(cfg).items()}
    ckpt.save(m, ckpt.Checkpoint(cfg, p, None, None, 0, [], {"tokenizer": tokenizer}))
    assert main(["export", "--model", str(m), "--format", "hf", str(d), *more]) == 0
    prompt = "ROMEO: Is it so?"
    tok = transformers.AutoTokenizer.from_pretrained(d)
    ours = tinygpt.get_tokenizer(tokenizer, more[1] if more else None)
    assert tok.encode(prompt) == [int(i) for i in ours.encode(prompt)]
    n = 48 - len(tok.encode(prompt))            # generation_config's max_length: the context
    r = subprocess.run([sys.executable, "-m", "tinygpt", "sample", "--model", str(m), "--prompt", prompt,
                        "--temperature", "0", "--tokens", str(n), *more], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    want = r.stdout[:-1] if r.stdout.endswith("\n") else r.stdout        # the CLI ends the text with a newline
    got = transformers.pipeline("text-generation", model=str(d))(prompt)[0]["generated_text"]
    print(f"\n{tokenizer}: {n} tokens, pipeline {got[-40:]!r}")
    assert got == want and len(got) > len(prompt)


@pytest.mark.parametrize("tokenizer", ["byte", "gpt2"])
def test_transformers_generates_a_padded_batch_within_the_context(tmp_path, tokenizer):
    """Issue 47: the export's tokenizer has a pad token (byte 0; GPT-2's end of text), on the left,
    so a padded batch of prompts generates with transformers as each prompt alone does; and
    max_new_tokens within the context runs. Past the context GPT-2 has no positions: the export's
    generation_config stops there (max_length), and docs/usage.md says what a longer ask does."""
    torch = pytest.importorskip("torch", reason="transformers' generate runs on PyTorch")
    transformers = pytest.importorskip("transformers", reason="pip install transformers to run this check")
    more = tokenizer_flags(tokenizer)
    m, d = tmp_path / "m.tinygpt", tmp_path / "hf"
    cfg = preset("tiny", layers=2, d_model=16, heads=2, ctx=24, vocab=50257 if tokenizer == "gpt2" else 256)
    r = np.random.default_rng(5)
    p = {k: (v + r.standard_normal(v.shape) * 0.1).astype(np.float32) for k, v in init_params(cfg).items()}
    ckpt.save(m, ckpt.Checkpoint(cfg, p, None, None, 0, [], {"tokenizer": tokenizer}))
    assert main(["export", "--model", str(m), "--format", "hf", str(d), *more]) == 0
    tok = transformers.AutoTokenizer.from_pretrained(d)
    lm = transformers.AutoModelForCausalLM.from_pretrained(d)
    assert tok.pad_token is not None and tok.padding_side == "left"
    prompts = ["ab", "a longer prompt"]
    batch = tok(prompts, return_tensors="pt", padding=True)
    with torch.no_grad():
        together = lm.generate(**batch, max_new_tokens=5)[:, batch["input_ids"].shape[1]:]
        alone = [lm.generate(**tok([p], return_tensors="pt"), max_new_tokens=5)[0, -5:] for p in prompts]
    print(f"{tokenizer}: batched {together.tolist()}, alone {[a.tolist() for a in alone]}")
    assert all(torch.equal(together[i], alone[i]) for i in range(len(prompts)))
    ids = tok(["ab"], return_tensors="pt")
    with torch.no_grad():       # to the context's last position, asked as max_new_tokens
        assert lm.generate(**ids, max_new_tokens=24 - ids["input_ids"].shape[1]).shape[1] == 24
    out = transformers.pipeline("text-generation", model=str(d))("ab", max_new_tokens=10)
    assert out[0]["generated_text"].startswith("ab")


def test_an_export_leaves_no_file_of_an_earlier_export(tmp_path, capsys):
    """Issue 47: exporting into a directory that holds an earlier export (ours) of another format
    or tokenizer removes that export's files once the new one is whole: a stale
    adapter_config.json makes transformers load PEFT adapters, a stale vocab.json is another
    tokenizer. A file of that name that is not ours is refused, as any output is."""
    from safetensors.numpy import save
    from tinygpt.files.outputs import WRITER
    m, d = tmp_path / "m.tinygpt", tmp_path / "hf"
    ckpt.save(m, model())
    assert main(["export", "--model", str(m), "--format", "hf", str(d)]) == 0
    earlier = {"vocab.json": b"{}", "merges.txt": b"#version: 0.2\n", "adapter_config.json": b"{}",
               "adapter_model.safetensors": save({"x": np.zeros(2, np.float32)}, metadata={"writer": WRITER})}
    for name, data in earlier.items():          # what an earlier gpt2 export and a peft export leave
        (d / name).write_bytes(data)
    assert main(["export", "--model", str(m), "--format", "hf", str(d)]) == 0
    names = sorted(p.name for p in d.iterdir())
    print(names)
    assert names == ["config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                     "tokenizer_config.json"]
    (d / "adapter_config.json").write_text("{}")       # the user's own, with no adapters of ours beside it
    capsys.readouterr()
    assert main(["export", "--model", str(m), "--format", "hf", str(d)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "adapter_config.json" in err[0] and (d / "adapter_config.json").exists()


def test_import_never_writes_over_a_file_it_reads(tmp_path, capsys):
    """Issue 47: import-hf's output may be none of the files it reads, the tokenizer's among them."""
    d = tmp_path / "hf"
    export_hf(model(), d)
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        before = (d / name).read_bytes()
        assert main(["import-hf", str(d), "--out", str(d / name), "--force"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        print(err[-1])
        assert len(err) == 1 and name in err[0] and (d / name).read_bytes() == before


def test_import_reads_the_exports_tokenizer(tmp_path, capsys):
    export_hf(model(), tmp_path / "hf")
    names = sorted(p.name for p in (tmp_path / "hf").iterdir())
    assert names == ["config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                     "tokenizer_config.json"]
    gen = json.loads((tmp_path / "hf" / "generation_config.json").read_text())
    assert gen["do_sample"] is False and gen["max_length"] == 12
    assert import_hf(tmp_path / "hf").extra["tokenizer"] == "byte"
    t = json.loads((tmp_path / "hf" / "tokenizer.json").read_text())
    t["model"]["vocab"] = {k: 255 - v for k, v in t["model"]["vocab"].items()}      # another 256-token tokenizer
    (tmp_path / "hf" / "tokenizer.json").write_text(json.dumps(t))
    out = tmp_path / "m.tinygpt"
    assert main(["import-hf", str(tmp_path / "hf"), "--out", str(out)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cannot import another tokenizer" in err[0] and not out.exists()
