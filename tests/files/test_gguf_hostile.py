"""Issue 67: GGUF files are hostile input. Each crafted file below (a valid small Llama the gguf
package writes, then cut, inflated or mislabelled) is refused by `tinygpt import-hf` in one line,
exit 1, no traceback, before anything sized by the file is allocated (the command runs under a
memory limit a 2^63 length would break), and no output file is left."""
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
TINYGPT = [sys.executable, "-m", "tinygpt"]
C, L, V, M = 32, 1, 260, 64


def byte_tokens():
    from tinygpt.tokenizers.base import byte_alphabet
    return [byte_alphabet()[b] for b in range(256)] + ["<|im_start|>", "<|im_end|>", "Ġt", "he"]


def write(path: Path, arch="llama", tokens=None, types=None, merges=("Ġ t", "h e"), tensors=None, fields=None,
          shapes=None):
    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(L)
    w.add_context_length(64)
    w.add_embedding_length(C)
    w.add_feed_forward_length(M)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    tokens = byte_tokens() if tokens is None else tokens
    w.add_tokenizer_model("gpt2")
    w.add_token_list(tokens)
    w.add_token_types(types if types is not None else [1] * 256 + [3, 3, 1, 1])
    w.add_token_merges(list(merges))
    w.add_eos_token_id(257)
    for k, v in (fields or {}).items():
        w.add_string(k, v)
    shapes = shapes or {"token_embd.weight": (V, C), "output_norm.weight": (C,), "blk.0.attn_norm.weight": (C,),
                        "blk.0.ffn_norm.weight": (C,), "blk.0.attn_q.weight": (C, C), "blk.0.attn_k.weight": (16, C),
                        "blk.0.attn_v.weight": (16, C), "blk.0.attn_output.weight": (C, C),
                        "blk.0.ffn_gate.weight": (M, C), "blk.0.ffn_up.weight": (M, C),
                        "blk.0.ffn_down.weight": (C, M)}
    for name, shape in shapes.items():
        if tensors is None or name in tensors:
            w.add_tensor(name, rng.standard_normal(shape).astype(np.float32) * 0.1)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def crafted(d: Path) -> dict:
    good = write(d / "good.gguf").read_bytes()
    files = {}

    def put(name, data):
        (d / name).write_bytes(data)
        files[name] = d / name
    put("empty.gguf", b"")
    put("magic-only.gguf", b"GGUF")
    put("truncated-header.gguf", good[:40])
    put("truncated-data.gguf", good[:len(good) - 1000])
    put("version-99.gguf", good[:4] + struct.pack("<I", 99) + good[8:])
    put("tensor-count-2^63.gguf", good[:8] + struct.pack("<Q", 1 << 63) + good[16:])
    put("kv-count-2^63.gguf", good[:16] + struct.pack("<Q", 1 << 63) + good[24:])
    # the first field's name: its length of 2^63
    put("key-length-2^63.gguf", good[:24] + struct.pack("<Q", 1 << 63) + good[32:])
    # the token list (an array of strings): its count of 2^63
    i = good.index(b"tokenizer.ggml.tokens") + len(b"tokenizer.ggml.tokens") + 4 + 4
    put("array-length-2^63.gguf", good[:i] + struct.pack("<Q", 1 << 63) + good[i + 8:])
    # the first tensor's info: offset past the end; type 200 (unknown); 9 dimensions
    j = good.index(b"token_embd.weight") + len(b"token_embd.weight")
    n_dims = struct.unpack("<I", good[j:j + 4])[0]
    type_at = j + 4 + 8 * n_dims
    put("offset-past-end.gguf", good[:type_at + 4] + struct.pack("<Q", 1 << 40) + good[type_at + 12:])
    put("unknown-type.gguf", good[:type_at] + struct.pack("<I", 200) + good[type_at + 4:])
    put("q8-type-on-f32-bytes.gguf", good[:type_at] + struct.pack("<I", 8) + good[type_at + 4:])
    put("nine-dimensions.gguf", good[:j] + struct.pack("<I", 9) + good[j + 4:])
    put("misaligned-offset.gguf", good[:type_at + 4] + struct.pack("<Q", 3) + good[type_at + 12:])
    files["phi2.gguf"] = write(d / "phi2.gguf", arch="phi2")
    files["too-many-tokens.gguf"] = write(d / "too-many-tokens.gguf", tokens=byte_tokens() + ["x%d" % i for i in
                                                                                             range(10)])
    files["bad-merges.gguf"] = write(d / "bad-merges.gguf", merges=("Ġ t h",))
    files["missing-tensor.gguf"] = write(d / "missing-tensor.gguf", tensors={"token_embd.weight"})
    files["wrong-shape.gguf"] = write(d / "wrong-shape.gguf", shapes={
        "token_embd.weight": (V, C + 4), "output_norm.weight": (C,)})
    files["sentencepiece.gguf"] = d / "sentencepiece.gguf"
    raw = good.replace(b"\x04\x00\x00\x00\x00\x00\x00\x00gpt2", b"\x04\x00\x00\x00\x00\x00\x00\x00llam")
    (d / "sentencepiece.gguf").write_bytes(raw)
    return files


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return crafted(tmp_path_factory.mktemp("hostile"))


def test_the_good_file_imports(files, tmp_path):
    good = Path(files["empty.gguf"]).parent / "good.gguf"
    r = subprocess.run(TINYGPT + ["import-hf", str(good), "--out", str(tmp_path / "m.tinygpt"), "--quiet"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr


NAMES = ["empty.gguf", "magic-only.gguf", "truncated-header.gguf", "truncated-data.gguf", "version-99.gguf",
         "tensor-count-2^63.gguf", "kv-count-2^63.gguf", "key-length-2^63.gguf", "array-length-2^63.gguf",
         "offset-past-end.gguf", "unknown-type.gguf", "q8-type-on-f32-bytes.gguf", "nine-dimensions.gguf",
         "misaligned-offset.gguf", "phi2.gguf", "too-many-tokens.gguf", "bad-merges.gguf", "missing-tensor.gguf",
         "wrong-shape.gguf", "sentencepiece.gguf"]


@pytest.mark.parametrize("name", NAMES)
def test_a_crafted_gguf_is_refused_in_one_line(files, tmp_path, name):
    out = tmp_path / "m.tinygpt"
    # a 4 GiB address-space limit: a length of 2^63 trusted anywhere would fail to allocate, not pass
    limit = "import resource; resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30)); "
    r = subprocess.run([sys.executable, "-c", limit + "import sys; from tinygpt.commands.cli import main; "
                        f"sys.exit(main(['import-hf', {str(files[name])!r}, '--out', {str(out)!r}, '--quiet']))"],
                       capture_output=True, text=True, timeout=300)
    err = [l for l in r.stderr.strip().splitlines() if "XDG_RUNTIME_DIR" not in l]
    print(f"{name}: exit {r.returncode}: {err[-1] if err else ''}")
    assert r.returncode == 1 and len(err) == 1 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert err[0].startswith("tinygpt: error: ") and not out.exists()


def test_the_gguf_a_directory_holds_is_never_the_output(files, tmp_path):
    """import-hf DIR reads the one .gguf in DIR: --out naming that file is refused, --force or not,
    and the file stays as it was."""
    d = tmp_path / "model"
    d.mkdir()
    src = (Path(files["empty.gguf"]).parent / "good.gguf").read_bytes()
    (d / "m.gguf").write_bytes(src)
    r = subprocess.run(TINYGPT + ["import-hf", str(d), "--out", str(d / "m.gguf"), "--force", "--quiet"],
                       capture_output=True, text=True, timeout=300)
    err = [l for l in r.stderr.strip().splitlines() if "XDG_RUNTIME_DIR" not in l]
    print(err[-1] if err else "")
    assert r.returncode != 0 and len(err) == 1 and "Traceback" not in r.stderr, r.stderr
    assert (d / "m.gguf").read_bytes() == src
