"""scripts/train_ddp.py under torchrun with gloo on this machine's CPUs: two ranks step as one
process at twice the batch, and a run goes WebGPU -> DDP -> WebGPU without losing its state.
Skipped where torch is not installed (pip install 'tinygpt[torch]' or torch==2.13.0 here)."""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from support import ROOT
from tinygpt.files import checkpoint as ckpt
from tinygpt.commands.cli import main

torch = pytest.importorskip("torch", reason="torch is not installed: the DDP hand-off needs it (an optional extra)")

SHARED = ROOT.parent / "shared" / "data"


@pytest.fixture
def start(tmp_path):
    """A 5-step tinygpt AdamW run (batch 4) on a small corpus: the file every test continues. A constant
    lr, so that runs of different lengths step alike and can be compared step by step."""
    corpus = tmp_path / "c.txt"
    text = (SHARED / "tinyshakespeare.txt").read_text()[:100_000] if (SHARED / "tinyshakespeare.txt").exists() \
        else ("To be, or not to be, that is the question. " * 2500)
    corpus.write_text(text)
    f = tmp_path / "a.tinygpt"
    assert main(["train", "--preset", "tiny", "--batch", "4", "--ctx", "16", "--data", str(corpus), "--steps", "5",
                 "--eval-every", "0", "--sample-tokens", "0", "--quiet", "--out", str(f), "--schedule", "constant",
                 "--lr", "3e-3", "--optimizer", "adamw"]) == 0      # AdamW's moments, compared below
    return f, corpus


def ddp(ranks, *args, timeout=300):
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks),
                        str(ROOT / "scripts" / "train_ddp.py"), *map(str, args)],
                       capture_output=True, text=True, timeout=timeout)
    return r.returncode, r.stderr


def losses(path):
    return {r["step"]: r["train_loss"] for r in map(json.loads, Path(path).read_text().splitlines()) if "train_loss" in r}


def test_two_ranks_step_as_one_process_at_twice_the_batch(start, tmp_path):
    f, corpus = start
    out = {}
    for ranks, batch in ((2, 2), (1, 4)):
        o, log = tmp_path / f"r{ranks}.tinygpt", tmp_path / f"r{ranks}.jsonl"
        rc, err = ddp(ranks, "--resume", f, "--data", corpus, "--steps", 10, "--batch", batch, "--out", o,
                      "--log-every", 1, "--log-file", log)
        assert rc == 0, err[-3000:]
        out[ranks] = (ckpt.load(o), losses(log))
    (two, l2), (one, l1) = out[2], out[1]
    assert sorted(l2) == sorted(l1) == list(range(6, 11))
    diff = max(abs(l2[s] - l1[s]) for s in l1)
    print(f"2 ranks x 2 against 1 x 4: max loss difference {diff:.2e} over 5 steps")
    assert diff < 1e-5
    assert two.step == one.step == 10 and two.cfg.batch == one.cfg.batch == 4
    for name in one.params:
        np.testing.assert_allclose(two.params[name], one.params[name], atol=1e-5)
        np.testing.assert_allclose(two.m[name], one.m[name], atol=1e-6)


def common_flags(corpus):
    return ["--data", str(corpus), "--eval-every", "0", "--sample-tokens", "0", "--quiet", "--log-every", "1"]


def hand_off(f, corpus, tmp_path, web_steps: int, ddp_steps: int):
    """The file continued on WebGPU to web_steps (the losses DDP must reproduce) and under 2 DDP
    ranks to ddp_steps: (WebGPU's losses, DDP's, DDP's file)."""
    assert main(["train", "--resume", str(f), "--steps", str(web_steps), "--out", str(tmp_path / "w.tinygpt"),
                 "--log", str(tmp_path / "w.jsonl"), *common_flags(corpus)]) == 0
    d = tmp_path / "d.tinygpt"
    rc, err = ddp(2, "--resume", f, "--data", corpus, "--steps", ddp_steps, "--out", d, "--log-every", 1,
                  "--log-file", tmp_path / "d.jsonl")
    assert rc == 0, err[-3000:]
    return losses(tmp_path / "w.jsonl"), losses(tmp_path / "d.jsonl"), d


def test_webgpu_to_ddp_to_webgpu_keeps_the_run(start, tmp_path):
    f, corpus = start
    common = common_flags(corpus)
    web, dd, d = hand_off(f, corpus, tmp_path, 9, 7)
    print(f"first DDP step's loss {dd[6]:.7f}, WebGPU's for the same batch {web[6]:.7f}")
    assert abs(dd[6] - web[6]) < 1e-5 and abs(dd[7] - web[7]) < 1e-5
    back = ckpt.load(d)
    assert back.step == 7 and back.m is not None and back.extra["schedule"]["total"] == 7
    assert any(np.abs(back.v[n]).max() > 0 for n in back.v)
    # back on WebGPU from the DDP file: steps 8 and 9 as the uninterrupted WebGPU run had them,
    # which needs the weights, both moments, the step count and the sampler state carried over
    assert main(["train", "--resume", str(d), "--steps", "9", "--log", str(tmp_path / "b.jsonl"), *common]) == 0
    bb = losses(tmp_path / "b.jsonl")
    assert sorted(bb) == [8, 9] and ckpt.load(d).step == 9
    assert max(abs(bb[s] - web[s]) for s in (8, 9)) < 1e-4


def test_a_refused_output_stops_every_rank(start, tmp_path):
    f, corpus = start
    mine = tmp_path / "mine.tinygpt"
    mine.write_bytes(b"not ours")
    rc, err = ddp(2, "--resume", f, "--data", corpus, "--steps", 7, "--out", mine, timeout=120)
    assert rc != 0 and "train_ddp: error:" in err and "--force" in err
    assert mine.read_bytes() == b"not ours"


def test_a_lora_run_is_refused(start, tmp_path):
    """DDP trains every weight: a LoRA run's file is refused in one line, pointing at --merge."""
    f, corpus = start
    ft = tmp_path / "ft.tinygpt"
    assert main(["train", "--resume", str(f), "--lora", "2", "--data", str(corpus), "--steps", "2", "--eval-every",
                 "0", "--sample-tokens", "0", "--quiet", "--out", str(ft)]) == 0
    rc, err = ddp(1, "--resume", ft, "--data", corpus, "--steps", 4, timeout=120)
    assert rc != 0 and "is a LoRA run, which DDP does not train" in err and "--merge" in err


def test_muon_continues_under_ddp_and_lion_is_refused(start, tmp_path):
    """A Muon run continues under DDP with torch.optim.Muon on the blocks' matrices and AdamW on
    the rest, its state carried both ways (its first step's loss is the WebGPU run's: the batch
    and the weights are the same); a Lion run is refused in one line (PyTorch has no Lion)."""
    f, corpus = start
    common = ["--data", str(corpus), "--eval-every", "0", "--sample-tokens", "0", "--quiet", "--log-every", "1"]
    for opt in ("muon", "lion"):
        assert main(["train", "--resume", str(f), "--optimizer", opt, "--steps", "7", "--out",
                     str(tmp_path / f"{opt}.tinygpt"), "--log", str(tmp_path / f"{opt}.jsonl"), *common]) == 0
    web = losses(tmp_path / "muon.jsonl")
    d = tmp_path / "d.tinygpt"
    assert main(["train", "--resume", str(f), "--optimizer", "muon", "--steps", "6", "--out", str(d), *common]) == 0
    rc, err = ddp(1, "--resume", d, "--data", corpus, "--steps", 7, "--log-every", 1, "--log-file", tmp_path / "d.jsonl")
    assert rc == 0, err[-3000:]
    dd = losses(tmp_path / "d.jsonl")
    print(f"muon: DDP's step 7 loss {dd[7]:.7f}, WebGPU's {web[7]:.7f}")
    assert abs(dd[7] - web[7]) < 1e-5
    back = ckpt.load(d)
    assert back.step == 7 and back.extra["optimizer"]["name"] == "muon" and back.extra["optimizer"]["steps"] == 2
    assert main(["train", "--resume", str(d), "--steps", "8", *common]) == 0
    rc, err = ddp(1, "--resume", tmp_path / "lion.tinygpt", "--data", corpus, "--steps", 9, timeout=120)
    lines = [line for line in err.splitlines() if line.startswith("train_ddp: error:")]
    assert rc != 0 and len(lines) == 1 and "lion, which PyTorch does not ship" in lines[0]


def test_a_token_file_trains_as_its_text(start, tmp_path):
    """--data takes what tinygpt train takes: a token file from `tinygpt prepare` continues the run
    with the same losses as the text it was prepared from (it was read as text and byte-encoded,
    training on its bytes)."""
    f, corpus = start
    tokens = tmp_path / "c.bin"
    assert main(["prepare", str(corpus), "--out", str(tokens)]) == 0
    got = {}
    for name, data in (("text", corpus), ("tokens", tokens)):
        o, log = tmp_path / f"{name}.tinygpt", tmp_path / f"{name}.jsonl"
        rc, err = ddp(1, "--resume", f, "--data", data, "--steps", 8, "--out", o, "--log-every", 1, "--log-file", log,
                      "--eval-every", 0)
        assert rc == 0, err[-3000:]
        got[name] = losses(log)
    print("text:", got["text"], "tokens:", got["tokens"])
    assert sorted(got["text"]) == list(range(6, 9))
    assert got["tokens"] == got["text"]


@pytest.mark.parametrize("block, more", [("nanochat", []), ("llama", ["--head-dim", "8"])])
def test_the_modern_blocks_go_webgpu_to_ddp_and_back(tmp_path, block, more):
    """Each part in PyTorch's form (the mirror): nanochat's block (RoPE, QK-norm, ReLU², free RMSNorm
    also on the embedding, no biases, an untied head, the soft-cap) and Llama's (RMSNorm with gains,
    SwiGLU; 3 heads of 8, q 24 wide in 48) with one kv head step under DDP as on WebGPU, and come back
    with their block."""
    corpus = tmp_path / "c.txt"
    corpus.write_text("To be, or not to be, that is the question. " * 2500)
    f = tmp_path / "a.tinygpt"
    common = common_flags(corpus)
    assert main(["train", "--preset", "tiny", "--batch", "4", "--ctx", "16", "--steps", "4", "--out", str(f),
                 "--schedule", "constant", "--lr", "3e-3", "--optimizer", "adamw", "--block", block,
                 "--kv-heads", "1", *more, *common]) == 0
    web, dd, d = hand_off(f, corpus, tmp_path, 7, 6)
    diff = max(abs(dd[s] - web[s]) for s in (5, 6))
    print(f"{block}: DDP's losses against WebGPU's for the same batches: max difference {diff:.2e}")
    assert diff < 1e-5
    back = ckpt.load(d)
    assert back.cfg.block == ckpt.load(f).cfg.block and back.step == 6
    assert main(["train", "--resume", str(d), "--steps", "7", "--log", str(tmp_path / "b.jsonl"), *common]) == 0
    assert abs(losses(tmp_path / "b.jsonl")[7] - web[7]) < 1e-4
