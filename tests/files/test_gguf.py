"""GGUF in, and chat out, against transformers' reading of the same files: random Llama, Qwen2 and
Qwen3 models that transformers builds, written by tests/files/hf_reference.py with the gguf package's
writer as llama.cpp's converter writes them (f32, f16 and q8_0; a chat template and its special
tokens in the file), imported with `tinygpt import-hf FILE.gguf`. The logits within 1e-4 of the
largest (transformers dequantizes the same bytes), the chat template rendered as transformers
renders it, and GPT.chat's greedy replies equal to transformers' generate for conversations with
and without a system prompt and of two turns; files tinygpt cannot read refused in one line."""

import numpy as np
import pytest

from support import run_cli
from test_hf_llama import reference
from tinygpt.files import checkpoint as ckpt

FAMILIES = ("llama", "qwen2", "qwen3")
TYPES = ("f32", "f16", "q8_0")
CONVERSATIONS = [
    [{"role": "user", "content": "To be?"}],
    [{"role": "system", "content": "Answer in verse."}, {"role": "user", "content": "Or not to be?"}],
    [{"role": "user", "content": "To be?"}, {"role": "assistant", "content": "that is"},
     {"role": "user", "content": "the question"}],
]
IDS = np.array([[3, 50, 100, 7, 9, 33, 200, 17, 250, 1, 64, 128, 5, 77, 260, 2],
                [9, 8, 7, 6, 5, 4, 3, 2, 1, 0, 255, 254, 300, 301, 302, 303]])


@pytest.fixture(scope="module")
def ggufs(tmp_path_factory):
    d = tmp_path_factory.mktemp("gguf")
    reference("gguf", d)
    return d


@pytest.mark.parametrize("kind", TYPES)
@pytest.mark.parametrize("family", FAMILIES)
def test_a_gguf_imports_with_transformers_logits_and_chat_replies(ggufs, family, kind, tmp_path):
    from tinygpt import GPT
    ref = np.load(ggufs / f"{family}-{kind}.npz")
    out = tmp_path / "m.tinygpt"
    assert run_cli("import-hf", ggufs / f"{family}-{kind}.gguf", "--out", out, "--quiet") == 0
    gpt = GPT.load(out)
    got = gpt.logits(IDS)
    err = float(np.abs(got - ref["logits"]).max()) / float(np.abs(ref["logits"]).max())
    print(f"{family} {kind}: logits against transformers' reading of the file, max error {err:.2e} of the largest")
    assert err < 1e-4
    template = ckpt.load(out).extra["chatTemplate"]
    assert "<|im_start|>" in template
    from tinygpt.run.chat import template_of
    assert template_of(gpt.checkpoint.extra, gpt.tokenizer).render(CONVERSATIONS[1]) == str(ref["rendered"])
    assert np.array_equal(gpt.encode(template_of(gpt.checkpoint.extra, gpt.tokenizer).render(CONVERSATIONS[0])),
                          ref["prompt0"])
    last = gpt.logits(ref["prompt0"])[-1]
    lerr = float(np.abs(last - ref["last"]).max()) / float(np.abs(ref["last"]).max())
    print(f"  the conversation's last position: {lerr:.2e}")
    assert lerr < 1e-4
    for conv, want in zip(CONVERSATIONS, ref["replies"]):
        assert gpt.chat(conv, 12) == str(want), conv


def test_a_held_conversation_answers_as_a_fresh_one(ggufs, tmp_path):
    """The second turn from the cache the first left (only its new tokens run) equals the same turn
    asked of a model that has seen nothing."""
    from tinygpt import GPT
    out = tmp_path / "m.tinygpt"
    assert run_cli("import-hf", ggufs / "llama-f32.gguf", "--out", out, "--quiet") == 0
    held, fresh = GPT.load(out), GPT.load(out)
    first = [{"role": "user", "content": "To be?"}]
    r1 = held.chat(first, 12)
    second = first + [{"role": "assistant", "content": r1}, {"role": "user", "content": "the question"}]
    assert held.chat(second, 12) == fresh.chat(second, 12)
    assert held._decoder[1].cached is not None


def test_sample_from_a_chat_prompt_stops_at_the_end_of_turn(ggufs, tmp_path, capsys):
    """The file's eos (<|im_end|>) ends a sample and is not printed; --ignore-eos runs on."""
    from tinygpt import GPT
    out = tmp_path / "m.tinygpt"
    assert run_cli("import-hf", ggufs / "qwen2-f32.gguf", "--out", out, "--quiet") == 0
    gpt = GPT.load(out)
    end = int(gpt.checkpoint.extra["stopTokens"][0])
    assert gpt.tokenizer.decode([end]) == "<|im_end|>"
    # a prompt whose greedy continuation draws the end token: find where the model's draws hit it
    ids = gpt.generate(np.array([5, 6, 7]), 40, stop=False)
    forced = gpt.generate(np.array([5, 6, 7]), 40, stop=[int(ids[3])])
    assert list(forced) == list(ids[:3]), (forced, ids)            # ended before the first stop id, not shown
    capsys.readouterr()
    assert run_cli("sample", "--model", out, "--prompt", "<|im_start|>user\nTo be?<|im_end|>\n<|im_start|>assistant\n",
                   "--tokens", 30, "--temperature", 0) == 0
    text = capsys.readouterr().out
    assert "<|im_end|>" not in text.split("assistant\n", 1)[1]


def test_files_tinygpt_cannot_read_are_refused_in_one_line(ggufs, tmp_path, capsys):
    gguf = pytest.importorskip("gguf")
    # another architecture
    w = gguf.GGUFWriter(str(tmp_path / "phi.gguf"), "phi2")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((4, 8), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    # a quantisation it does not read: the llama file with one tensor as Q2_K's bytes
    r = gguf.GGUFReader(str(ggufs / "llama-f32.gguf"))
    w = gguf.GGUFWriter(str(tmp_path / "q2k.gguf"), "llama")
    for k, f in r.fields.items():
        if k.startswith("GGUF.") or k == "general.architecture":
            continue
        v = f.contents()
        vt = f.types[0]
        if vt == gguf.GGUFValueType.ARRAY:
            w.add_array(k, v)
        else:
            w.add_key_value(k, v, vt)
    for t in r.tensors:
        if t.name == "blk.0.ffn_up.weight":
            raw = np.zeros((40, 84), np.uint8)          # one Q2_K block (84 bytes, 256 values) a row
            w.add_tensor(t.name, raw, raw_shape=raw.shape, raw_dtype=gguf.GGMLQuantizationType.Q2_K)
        else:
            w.add_tensor(t.name, np.array(t.data).reshape([int(s) for s in reversed(t.shape.tolist())]))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    (tmp_path / "trunc.gguf").write_bytes((ggufs / "llama-f32.gguf").read_bytes()[:5000])
    for name, says in (("phi.gguf", "phi2"), ("q2k.gguf", "Q2_K"), ("trunc.gguf", "")):
        capsys.readouterr()
        code = run_cli("import-hf", tmp_path / name, "--out", tmp_path / "x.tinygpt")
        err = capsys.readouterr().err.strip().splitlines()
        print(name, "->", err[-1] if err else "")
        assert code != 0 and len(err) == 1 and "Traceback" not in err[0] and says in err[0], err
        assert not (tmp_path / "x.tinygpt").exists()


def test_tinygpt_chat_answers_each_line_as_gpt_chat_does(ggufs, tmp_path, capsys):
    """`printf 'A\\nB\\n' | tinygpt chat`: one reply a line, the conversation's two turns, no template
    token; a file imported with --dtype f16 (weights alone) chats too."""
    import io
    import sys
    from tinygpt import GPT
    out = tmp_path / "m.tinygpt"
    assert run_cli("import-hf", ggufs / "qwen3-f32.gguf", "--out", out, "--quiet", "--dtype", "f16") == 0
    assert ckpt.load(out).weight_dtype == "fp16"
    gpt = GPT.load(out)
    want = [gpt.chat([{"role": "user", "content": "To be?"}], 12)]
    want.append(gpt.chat([{"role": "user", "content": "To be?"}, {"role": "assistant", "content": want[0]},
                          {"role": "user", "content": "the question"}], 12))
    stdin = sys.stdin
    sys.stdin = io.StringIO("To be?\nthe question\n")
    try:
        capsys.readouterr()
        assert run_cli("chat", "--model", out, "--max-tokens", 12) == 0
    finally:
        sys.stdin = stdin
    got = capsys.readouterr().out
    print("chat printed", repr(got))
    assert got == "".join(w + "\n" for w in want)
    assert "<|im_" not in got
    half, full = tmp_path / "b.tinygpt", tmp_path / "f.tinygpt"        # --dtype bf16: the f32 weights rounded once
    for f, dtype in ((half, "bf16"), (full, "f32")):
        assert run_cli("import-hf", ggufs / "qwen3-f32.gguf", "--out", f, "--quiet", "--dtype", dtype) == 0
    b, w = ckpt.load(half), ckpt.load(full)
    assert b.weight_dtype == "bf16" and all(np.array_equal(b.params[n], (ckpt.to_bf16(a).astype(np.uint32) << 16)
                                                           .view(np.float32)) for n, a in w.params.items())
    assert GPT.load(half).chat([{"role": "user", "content": "To be?"}], 4) is not None
