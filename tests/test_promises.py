"""Every promise, everywhere: one test per class of #29's hostile cases, through the CLI, the
scripts and the commands added since the first round (import-hf, export, plan, sample, tune).
Each test is named after its class; docs/reliability.md names them beside the promises."""
import json
import os
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from support import TINY, in_process, one_line_error
from support import model, rewrite
from tinygpt.files import checkpoint as ckpt
from tinygpt.core.config import Config
from tinygpt.core.init import init_params
from tinygpt.files.hf import export_hf

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data"


# ---- an input is never an output, including the files read inside a directory ------------------
def test_an_input_is_never_an_output_inside_a_directory(tmp_path):
    d = tmp_path / "hf"
    export_hf(model(), d)
    before = {n: (d / n).read_bytes() for n in ("config.json", "model.safetensors")}
    for name in before:
        rc, err = in_process("import-hf", d, "--out", d / name, "--force")
        one_line_error(rc, err, "input", "choose another name")
    assert {n: (d / n).read_bytes() for n in before} == before
    rc, err = in_process("train", *TINY, "--steps", 1, "--out", str(tmp_path / "new") + "/")
    one_line_error(rc, err, "ends in a slash")
    assert not (tmp_path / "new").exists()


# ---- every search is bounded -----------------------------------------------------------------
# the largest value each flag takes, and one past it: plan answers at once; train refuses at
# once, or (for the flags that do not size the model) runs its one step
LARGEST = [["--batch", 1 << 20, "--grad-accum", 4096], ["--ctx", 1 << 20], ["--sample-tokens", 10 ** 12],
           ["--eval-windows", 10 ** 12], ["--log-every", 10 ** 12], ["--save-every", 10 ** 12],
           ["--warmup", 10 ** 12], ["--seed", 2 ** 63 - 1], ["--layers", 4096], ["--heads", 4096],
           ["--d-model", 65536, "--heads", 512]]


def test_every_search_is_bounded(tmp_path, sentences):
    """All of LARGEST through plan, then train for one step, in one process under one time limit
    (a search over a user's number would hang it): each answers, refuses in one line, or trains."""
    runs = []
    for flags in LARGEST:
        runs.append(["plan", "--preset", "tiny", *flags])
        if flags[0] in ("--batch", "--ctx", "--sample-tokens", "--eval-windows"):   # what sizes a train's work
            runs.append(["train", *TINY, "--data", sentences, "--steps", 1, "--out", tmp_path / "m.tinygpt",
                         "--sample-tokens", 0, "--force", *flags])
    runs.append(["plan", "--preset", "tiny", "--grad-accum", 10 ** 9])
    code = ("import json, sys, time\nfrom tinygpt.commands.cli import main\n"
            "for argv in json.loads(sys.argv[1]):\n"
            "    t0 = time.monotonic()\n"
            "    try:\n        rc = main(argv)\n    except SystemExit as e:\n        rc = e.code\n"
            "    print(json.dumps([argv[0], argv[-2:], rc, round(time.monotonic() - t0, 1)]), flush=True)\n")
    r = subprocess.run([sys.executable, "-c", code, json.dumps([[str(a) for a in run] for run in runs])],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-3000:]
    rows = [json.loads(l) for l in r.stdout.splitlines() if l.startswith("[")]
    for row in rows:
        print(row)
    assert len(rows) == len(runs) and all(rc in (0, 1, 2, 4) for _, _, rc, _ in rows)     # 4: plan, does not fit
    assert rows[-1][2] == 2                                  # --grad-accum past its bound: refused by its type


# ---- caches never brick the tool, when written too ---------------------------------------------
def test_a_cache_that_cannot_be_written_is_a_warning(tmp_path, sentences, monkeypatch, capsys):
    from tinygpt.device import tuning
    blocker = tmp_path / "cache-is-a-file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("TINYGPT_CACHE_DIR", str(blocker))
    assert tuning.save_tuning("adapter", {"matmul": "tiled"}) is None
    err = capsys.readouterr().err
    assert "warning: could not write the tuning cache" in err and "TINYGPT_CACHE_DIR" in err
    rc, err = in_process("train", *TINY, "--data", sentences, "--profile")     # the cache directory set above
    assert rc == 0, err
    assert any("could not write the tuning cache" in l for l in err) and blocker.read_text() == "not a directory"


# ---- the scripts keep the CLI's rules --------------------------------------------------------
def script(name, *args, env=None, timeout=300):
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / name), *map(str, args)], capture_output=True,
                       text=True, timeout=timeout, env=dict(os.environ, **(env or {})))
    return r.returncode, [l for l in r.stderr.splitlines() if l.strip() and "XDG_RUNTIME_DIR" not in l]


def test_the_scripts_keep_the_cli_rules(tmp_path):
    mine = tmp_path / "mine"
    (mine / "logs").mkdir(parents=True)
    (mine / "logs" / "tune.log").write_text("my log")
    rc, err = script("gpu_report.py", "--out", mine, "--smallest")
    assert rc != 0 and "logs/tune.log" in err[-1] and not any("Traceback" in l for l in err), err
    assert (mine / "logs" / "tune.log").read_text() == "my log" and not (mine / "report.md").exists()
    out = tmp_path / "report"           # every section stopped at once: each reported, the rest run
    rc, err = script("gpu_report.py", "--out", out, "--smallest", "--section-timeout", 1,
                     env={"TINYGPT_CACHE_DIR": str(tmp_path / "cache")})
    assert rc == 1 and not any("Traceback" in l for l in err), err
    md = (out / "report.md").read_text()
    assert "failed (timeout)" in md and "stopped after 1 s" in md
    hostile = [["bench_matmul.py", "--sizes", "abc"], ["bench_matmul.py", "--shapes", "8x8"],
               ["compare_attention.py", "--T", "0"], ["bench_kernels.py", "--preset", "nope"],
               ["bench_train.py", "--steps", "0"],
               ["bench_train.py", "--precision", "fp32,bf16", "--blocks", "gpt2,nanochat", "--interleave"],
               ["bench_train.py", "--preset", "tiny", "--steps", "1", "--data", str(tmp_path / "absent.txt")],
               ["compare_precision.py", "--preset", "nope"], ["probe_adapter.py", "--iters", "-1"],
               ["browser_step.py", "--lr", "-1"], ["bench_chat.py", "--gguf", str(tmp_path / "absent.gguf")],
               ["bench_chat.py", "--gguf", __file__, "--precisions", "fp64"],
               ["compare_gguf.py", "--gguf", str(tmp_path / "absent.gguf")],
               ["bench_sft.py", "--gguf", str(tmp_path / "absent.gguf")], ["bench_sft.py", "--gguf", __file__, "--ctx", "0"],
               ["bench_sft.py", "--gguf", __file__, "--steps", "1000"]]
    code = ("import io, json, runpy, sys\nfor argv in json.loads(sys.argv[1]):\n"      # one process for all
            "    sys.argv, err, sys.stderr = argv, io.StringIO(), io.StringIO()\n"
            "    try:\n        runpy.run_path(sys.argv[0], run_name='__main__')\n        rc = 0\n"
            "    except SystemExit as e:\n        rc = e.code\n"
            "    err, sys.stderr = sys.stderr.getvalue(), sys.__stderr__\n"
            "    print(json.dumps([argv[0], rc, err]), flush=True)\n")
    r = subprocess.run([sys.executable, "-c", code, json.dumps([[str(ROOT / "scripts" / a[0]), *a[1:]] for a in hostile])],
                       capture_output=True, text=True, timeout=300)
    rows = [json.loads(l) for l in r.stdout.splitlines() if l.startswith("[")]
    assert len(rows) == len(hostile), r.stderr[-3000:]
    for name, rc, err in rows:
        lines = [l for l in err.splitlines() if l.strip() and "XDG_RUNTIME_DIR" not in l]
        assert rc in (1, 2) and lines and "error:" in lines[-1] and "Traceback" not in err, (name, rc, err)
    notes = tmp_path / "notes.png"
    notes.write_bytes(b"\x89PNG my own picture")
    for args in (["compare_attention.py", "--T", "8", "--plot", notes],
                 ["bench_learning.py", "--replot", tmp_path / "rows.jsonl", "--plot", notes]):
        rc, err = script(*args, timeout=120)
        assert rc == 2 and "--plot" in err[-1] and "written by tinygpt" in err[-1] and "--force" not in err[-1], err
        assert notes.read_bytes() == b"\x89PNG my own picture"
    # train_ddp without PyTorch: the extra named, no traceback
    code = ("import runpy, sys; sys.modules['torch'] = None; sys.argv = ['train_ddp.py', '--resume', 'x'];"
            f"runpy.run_path({str(ROOT / 'scripts' / 'train_ddp.py')!r}, run_name='__main__')")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "Traceback" not in r.stderr and ".[torch]" in r.stderr, r.stderr


# ---- an export is whole or absent ------------------------------------------------------------
def test_an_export_is_whole_or_absent(tmp_path, tmpfs):  # noqa: F811  (the fixture above)
    m = tmp_path / "m.tinygpt"
    cfg = Config(layers=2, d_model=48, heads=3, ctx=32, batch=4, vocab=256)
    ckpt.save(m, ckpt.Checkpoint(cfg, init_params(cfg), step=0))
    rc, err = in_process("export", "--model", m, "--format", "hf", tmpfs / "hf")
    one_line_error(rc, err, "No space left on device", str(tmpfs / "hf"))
    assert list(tmpfs.iterdir()) == []               # no config.json without its weights, no temporary
    rc, err = in_process("export", "--model", m, "--format", "safetensors", tmpfs / "w.safetensors")
    one_line_error(rc, err, "w.safetensors", "free some space")
    assert list(tmpfs.iterdir()) == []
    keep = tmpfs / "mine.txt"
    keep.write_text("the user's own file")
    (tmpfs / "filler").write_bytes(b"\0" * (200 << 10))          # what is left is less than an fp16 file
    for fmt, name in (("tinygpt", "m2.tinygpt"), ("tinygpt-fp16", "m3.tinygpt")):
        rc, err = in_process("export", "--model", m, "--format", fmt, tmpfs / name)
        one_line_error(rc, err, name, "free some space")
        assert sorted(p.name for p in tmpfs.iterdir()) == ["filler", "mine.txt"]
        assert keep.read_text() == "the user's own file"


# ---- what a file says is checked against what it holds -----------------------------------------
def test_what_a_config_says_is_checked_against_the_weights(tmp_path):
    d = tmp_path / "hf"
    export_hf(model(), d)                             # two layers of weights
    rewrite(d, config={"n_layer": 1})
    rc, err = in_process("import-hf", d, "--out", tmp_path / "m.tinygpt")
    one_line_error(rc, err, "h.1.", "does not account for")
    assert not (tmp_path / "m.tinygpt").exists()


# ---- messages name the file and the field ------------------------------------------------------
@pytest.mark.parametrize("edit, needle", [
    (dict(config={"layer_norm_epsilon": "abc"}), "layer_norm_epsilon is 'abc'"),
    (dict(config={"n_positions": 1e300 * 1e300}), "n_positions is"),
    (dict(config={"n_layer": 2.5}), "n_layer is 2.5"),
])
def test_messages_name_the_file_and_the_field(tmp_path, edit, needle):
    d = tmp_path / "hf"
    export_hf(model(), d)
    c = json.loads((d / "config.json").read_text())
    c.update(edit["config"])
    (d / "config.json").write_text(json.dumps(c))     # json writes inf as Infinity, as Python's json reads it
    rc, err = in_process("import-hf", d, "--out", tmp_path / "m.tinygpt")
    one_line_error(rc, err, "config.json", needle)


def test_damaged_headers_name_the_entry(tmp_path):
    d = tmp_path / "hf"
    export_hf(model(), d)
    f = d / "model.safetensors"
    raw = f.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    header["wte.weight" if "wte.weight" in header else "transformer.wte.weight"] = "oops"
    hb = json.dumps(header).encode().ljust(n)
    if len(hb) <= n:
        f.write_bytes(raw[:8] + hb + raw[8 + n:])
        rc, err = in_process("import-hf", d, "--out", tmp_path / "m.tinygpt")
        one_line_error(rc, err, "wte.weight is 'oops'")
    (d / "config.json").write_text("[" * 100_000 + "]" * 100_000)
    rc, err = in_process("import-hf", d, "--out", tmp_path / "m.tinygpt")
    one_line_error(rc, err, "config.json", "too deeply")


# ---- a checkpoint is read as one version of itself ------------------------------------------------
def test_a_checkpoint_is_read_as_one_version(tmp_path):
    """Two writers replace a file (through the project's atomic writer) with versions of two
    sizes while a reader loads it: every load is whole, of one version or the other."""
    cfg = Config(layers=1, d_model=16, heads=2, ctx=8, batch=2, vocab=256)
    p = init_params(cfg)
    path = tmp_path / "m.tinygpt"
    versions = [ckpt.Checkpoint(cfg, p, p, p, 1, [{"step": 1, "train": 5.0}] * k, {"tokenizer": "byte"})
                for k in (1, 400)]
    ckpt.save(path, versions[0])
    stop = threading.Event()

    def writer(v):
        while not stop.is_set():
            ckpt.save(path, v)
    threads = [threading.Thread(target=writer, args=(v,)) for v in versions]
    for t in threads:
        t.start()
    loads, t0 = 0, time.monotonic()
    try:
        while time.monotonic() - t0 < 4:
            ck = ckpt.load(path)
            assert len(ck.loss_history) in (1, 400)
            loads += 1
    finally:
        stop.set()
        for t in threads:
            t.join()
    print(f"{loads} loads while two writers replaced the file: all whole")
    assert loads > 50


# ---- work on user data is bounded in memory ------------------------------------------------------
def test_tokenizing_in_pieces_keeps_gpt2s_pre_tokens():
    """GPT-2's BPE runs on each pre-token (r50k's split pattern) alone, so cutting a text where the
    pattern cuts anyway gives the whole text's ids: the pre-tokens of the pieces are the text's."""
    import regex
    import tiktoken_ext.openai_public as op
    from tinygpt.files.data import builtin_corpus
    from tinygpt.tokenizers.gpt2 import text_pieces
    pat = regex.compile(op.r50k_pat_str)
    base = builtin_corpus()[:300_000].decode("utf-8", "ignore")
    for t in (base, base.replace("\n", " "), "a  b\n\nc \n d e\nf " * 3000, "ab" * 50_000):
        pieces = list(text_pieces(t, 5000))
        assert "".join(pieces) == t and max(map(len, pieces)) <= 5000
        if not t.startswith("abab"):           # no place to cut: cut every 5000, the one exception
            assert [m for p in pieces for m in pat.findall(p)] == pat.findall(t)
    print(f"{len(pieces)} pieces")


@pytest.mark.skipif(not (SHARED / "r50k_base.tiktoken").exists(), reason="needs ../shared/data/r50k_base.tiktoken")
def test_tokenizing_is_bounded_in_memory_and_exact(tmp_path):
    """The ids themselves, and 11 MB with no newline under an address-space limit."""
    from tinygpt.files.data import builtin_corpus
    from tinygpt.tokenizers import get_tokenizer
    from tinygpt.tokenizers.gpt2 import text_pieces
    text = builtin_corpus()[:200_000].decode("utf-8", "ignore")
    tok = get_tokenizer("gpt2", str(SHARED / "r50k_base.tiktoken"))
    for t in (text, text.replace("\n", " ")):
        want = np.asarray(tok.enc.encode(t, disallowed_special=()))
        got = np.concatenate([tok.enc.encode(p, disallowed_special=()) for p in text_pieces(t, 5000)])
        assert np.array_equal(want, got)
    big = tmp_path / "nonl.txt"
    big.write_text((text.replace("\n", " ") + " ") * (11_000_000 // len(text) + 1))
    code = ("import resource, sys; resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30));"
            "from tinygpt.tokenizers import get_tokenizer;"
            f"tok = get_tokenizer('gpt2', {str(SHARED / 'r50k_base.tiktoken')!r});"
            f"print(len(tok.encode(open({str(big)!r}, 'rb').read())))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and int(r.stdout) > 2_000_000, r.stderr[-2000:]


# ---- the byte tokenizer takes any bytes ------------------------------------------------------------
def test_the_byte_tokenizer_takes_any_bytes(tmp_path):
    m = tmp_path / "m.tinygpt"
    cfg = Config(layers=1, d_model=16, heads=2, ctx=8, batch=2, vocab=256)
    ckpt.save(m, ckpt.Checkpoint(cfg, init_params(cfg), step=0, extra={"tokenizer": "byte"}))
    rc, err = in_process("sample", "--model", m, "--prompt", os.fsdecode(b"\xff\xfe bad"), "--tokens", 4)
    assert rc == 0, err                                # (os.fsdecode: how Python hands over such an argv)
    from tinygpt.tokenizers import ByteTokenizer
    assert list(ByteTokenizer().encode(os.fsdecode(b"\xff\xfe x"))) == [255, 254, 32, 120]


# ---- flags mean one thing on every command ----------------------------------------------------------
def test_flags_mean_one_thing_on_every_command(tmp_path, sentences):
    """A train command line is planned by changing its verb, every flag included."""
    line = [*TINY, "--data", sentences, "--steps", 3, "--log", tmp_path / "l.jsonl", "--tokenizer", "byte",
            "--tokenizer-file", tmp_path / "absent.tiktoken", "--out", tmp_path / "m.tinygpt", "--lr", "1e-3",
            "--warmup", 1, "--eval-every", 0, "--sample-tokens", 0]
    rc, err = in_process("plan", *line)
    assert rc == 0, err
    rc, err = in_process("train", *line[:-4], "--log-file", tmp_path / "l2.jsonl", "--sample-tokens", 0)
    assert rc == 0 and (tmp_path / "l2.jsonl").read_text().strip(), err
    rc, err = in_process("plan", "--resume", tmp_path / "m.tinygpt", "--grad-accum", 2)
    assert rc == 0, err
