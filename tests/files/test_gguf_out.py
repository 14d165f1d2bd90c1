"""GGUF out (issue 65): `tinygpt export --format gguf` of random Llama, Qwen2 and Qwen3 models that
transformers builds (tests/files/hf_reference.py's GGUF files, each with a chat template, imported here;
Qwen3's with transformers' GGUF head dim of 128), read back by transformers' own GGUF loader: f32's logits
within 1e-4 of tinygpt's (relative to the largest), f16's, bf16's and q8_0's within their rounding,
and each file's logits as transformers reads it within 1e-4 of tinygpt's import of the same file
(both dequantize the same bytes); the tokenizer's ids and the chat template as transformers reads
them; a LoRA run merged; what GGUF cannot hold refused in one line."""

import numpy as np
import pytest

from support import run_cli, SHARED
from test_gguf import ggufs  # noqa: F401 - transformers' models as GGUF files
from test_hf_llama import reference

FAMILIES = ("llama", "qwen2", "qwen3")
TYPES = {"f32": 1e-4, "f16": 1e-2, "bf16": 3e-2, "q8_0": 1e-1}      # each type's bound against the weights
IDS = np.array([[3, 50, 100, 7, 9, 33, 200, 17, 250, 1, 64, 128, 5, 77, 260, 2],
                [9, 8, 7, 6, 5, 4, 3, 2, 1, 0, 255, 254, 300, 301, 302, 303]])
TEXT = "To be, or not to be: that is the question"


def rel(a, b):
    return float(np.abs(a - b).max() / np.abs(b).max())


@pytest.fixture(scope="module")
def exported(ggufs, tmp_path_factory):         # noqa: F811
    """Each family imported, then exported in every type; transformers' reading of every file."""
    d = tmp_path_factory.mktemp("gguf_out")
    files = []
    for family in FAMILIES:
        assert run_cli("import-hf", ggufs / f"{family}-f32.gguf", "--out", d / f"{family}.tinygpt", "--quiet") == 0
        for kind in TYPES:
            f = d / f"{family}-{kind}.gguf"
            assert run_cli("export", "--model", d / f"{family}.tinygpt", "--format", "gguf", "--gguf-type", kind,
                           f, "--quiet") == 0
            files.append(f)
    reference("ggufread", *files)
    return d


@pytest.mark.parametrize("family", FAMILIES)
def test_a_gguf_export_reads_in_transformers_with_our_logits(exported, family, tmp_path):
    from tinygpt import GPT
    ours = GPT.load(exported / f"{family}.tinygpt")
    want, ids = ours.logits(IDS), ours.encode(TEXT)
    for kind, bound in TYPES.items():
        f = exported / f"{family}-{kind}.gguf"
        ref = np.load(f.with_suffix(".npz"))
        assert run_cli("import-hf", f, "--out", tmp_path / f"{kind}.tinygpt", "--quiet") == 0
        back = GPT.load(tmp_path / f"{kind}.tinygpt").logits(IDS)
        err, same = rel(ref["logits"], want), rel(ref["logits"], back)
        print(f"{family} {kind}: transformers' reading against tinygpt's model {err:.2e} (bound {bound:g}), "
              f"against tinygpt's reading of the same file {same:.2e}; {str(ref['architecture'])}")
        assert err < bound and same < 1e-4
        assert np.array_equal(ref["text_ids"], ids)


def test_a_merged_lora_run_exports_with_its_chat_template(exported, tmp_path, capsys):
    """A LoRA run's adapters folded in (--merge) and the model's chat template travel into the file;
    transformers renders a conversation with it as tinygpt does."""
    from tinygpt import GPT
    from tinygpt.tokenizers.chat import template_of
    base = exported / "qwen2.tinygpt"
    text = tmp_path / "t.txt"
    text.write_text("To be, or not to be: that is the question. " * 40)
    lora = tmp_path / "lora.tinygpt"
    assert run_cli("train", "--resume", base, "--lora", 4, "--data", text, "--steps", 3, "--lr", 1e-2, "--out", lora,
                   "--quiet", "--sample-tokens", 0, "--ctx", 16, "--batch", 2) == 0
    f = tmp_path / "merged.gguf"
    assert run_cli("export", "--model", lora, "--format", "gguf", f, "--quiet") == 2      # adapters: --merge
    assert "--merge" in capsys.readouterr().err
    assert run_cli("export", "--model", lora, "--format", "gguf", "--merge", "--gguf-type", "f32", f,
                   "--quiet") == 0
    reference("ggufread", f)
    ref = np.load(f.with_suffix(".npz"))
    gpt = GPT.load(lora)
    err = rel(ref["logits"], gpt.logits(IDS))
    print(f"merged LoRA run, f32: {err:.2e}")
    assert err < 1e-4 and rel(ref["logits"], GPT.load(base).logits(IDS)) > 1e-4
    conv = [{"role": "system", "content": "Answer in verse."}, {"role": "user", "content": "Or not to be?"}]
    assert str(ref["rendered"]) == template_of(gpt.checkpoint.extra, gpt.tokenizer).render(conv)


def test_what_gguf_cannot_hold_is_refused_in_one_line(tmp_path, capsys):
    """A byte vocabulary (GGUF's tokenizers hold none), nanochat's block (no architecture computes
    it) and a sliding window are refused before a byte is written; a file not ours is not replaced."""
    from tinygpt import GPT
    byte_llama, nanochat, windowed = tmp_path / "b.tinygpt", tmp_path / "n.tinygpt", tmp_path / "w.tinygpt"
    GPT.from_preset("tiny", block="llama").save(byte_llama)
    GPT.from_preset("tiny", block="nanochat").save(nanochat)
    GPT.from_preset("tiny", sliding_window=8).save(windowed)
    made = sorted(p.name for p in tmp_path.iterdir())
    for model, says in ((byte_llama, "reads the byte tokenizer, which GGUF's tokenizers do not hold"),
                        (nanochat, "is computed by none of the Hugging Face architectures"),
                        (windowed, "attends through a sliding window")):
        assert run_cli("export", "--model", model, "--format", "gguf", tmp_path / "o.gguf") == 1
        err = capsys.readouterr().err.strip()
        print(err)
        assert len(err.splitlines()) == 1 and says in err
        assert sorted(p.name for p in tmp_path.iterdir()) == made
    mine = tmp_path / "mine.gguf"
    mine.write_bytes(b"GGUF not really")
    assert run_cli("export", "--model", byte_llama, "--format", "gguf", mine) == 2
    assert mine.read_bytes() == b"GGUF not really"


def test_a_gguf_export_onto_a_full_disk_leaves_nothing_behind(exported, tmpfs, capsys):  # noqa: F811
    """The file is written beside the output and renamed in whole: on a full disk, one line naming
    the space, no partial file, the folder's other files as they were."""
    keep = tmpfs / "mine.txt"
    keep.write_text("the user's own file")
    (tmpfs / "filler").write_bytes(b"\0" * (200 << 10))
    assert run_cli("export", "--model", exported / "qwen3.tinygpt", "--format", "gguf", "--gguf-type", "f32",
                   tmpfs / "m.gguf", "--quiet") == 1
    err = capsys.readouterr().err.strip()
    print(err)
    assert len(err.splitlines()) == 1 and "No space left on device" in err
    assert sorted(p.name for p in tmpfs.iterdir()) == ["filler", "mine.txt"] and keep.read_text() == "the user's own file"


R50K = SHARED / "r50k_base.tiktoken"


def test_gpt2s_block_exports_as_llama_cpps_gpt2(tmp_path, capsys):
    """GPT-2's block with GPT-2's tokenizer (r50k_base from its file) and the tanh GELU GGUF's gpt2
    computes: transformers reads it as a GPT2LMHeadModel with tinygpt's logits within 1e-4 and the
    same ids of a text. Its context is 1,024: transformers' GGUF reader takes GPT-2's position
    table as 1,024 rows whatever the file says (llama.cpp reads the tensor's own). The exact GELU
    is said in one warning line."""
    if not R50K.exists():
        pytest.skip("no r50k_base.tiktoken beside the checkout")
    from tinygpt import GPT
    m, f = tmp_path / "g.tinygpt", tmp_path / "g.gguf"
    GPT.from_preset("tiny", ctx=1024, tokenizer="gpt2", tokenizer_file=str(R50K), mlp="gelu_tanh").save(m)
    assert run_cli("export", "--model", m, "--format", "gguf", "--gguf-type", "f32", f, "--tokenizer-file", R50K,
                   "--quiet") == 0
    reference("ggufread", f)
    ref = np.load(f.with_suffix(".npz"))
    gpt = GPT.load(m, tokenizer_file=str(R50K))
    err = rel(ref["logits"], gpt.logits(IDS))
    print(f"GPT-2's block, f32: {err:.2e}; {str(ref['architecture'])}")
    assert err < 1e-4 and str(ref["architecture"]) == "GPT2LMHeadModel"
    assert np.array_equal(ref["text_ids"], gpt.encode(TEXT))
    exact = tmp_path / "e.tinygpt"
    GPT.from_preset("tiny", tokenizer="gpt2", tokenizer_file=str(R50K)).save(exact)
    capsys.readouterr()
    assert run_cli("export", "--model", exact, "--format", "gguf", tmp_path / "e.gguf", "--tokenizer-file", R50K,
                   "--quiet") == 0
    assert "computes the exact GELU" in capsys.readouterr().err
