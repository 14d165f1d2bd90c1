"""The command line end to end on the tiny preset: train, resume, eval, sample,
info, export, and the .tinygpt round trip."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from support import read_log, ROOT, run_cli, SHARED
from tinygpt.files import checkpoint as ckpt
from tinygpt.core.config import Config, param_shapes
from tinygpt.commands.cli import main
from tinygpt.tokenizers import ByteTokenizer
from tinygpt.model.decode import window_start
from tinygpt.reference import gpt as RG
from tinygpt.core.init import init_params


TINY = ["--preset", "tiny", "--batch", "4", "--ctx", "16", "--quiet"]


def test_train_writes_checkpoint_log_plot_and_sample(tmp_path, corpus, capsys):
    out, log = tmp_path / "m.tinygpt", tmp_path / "log.jsonl"
    assert run_cli("train", *TINY, "--data", corpus, "--steps", 30, "--eval-every", 15, "--log-every", 5,
                   "--out", out, "--log", log) == 0
    printed = capsys.readouterr().out
    assert "final train loss" in printed and "greedy sample" in printed
    rows, final = read_log(log), read_log(log, final=True)[-1]
    assert [r["step"] for r in rows] == [5, 10, 15, 20, 25, 30]
    assert set(rows[0]) == {"time", "step", "train_loss", "val_loss", "lr", "grad_norm", "tokens_per_s"}
    assert set(final) == {"time", "step", "final_train_loss", "final_val_loss", "val_windows"}
    assert rows[2]["val_loss"] is not None and rows[0]["val_loss"] is None
    assert rows[-1]["train_loss"] < rows[0]["train_loss"]
    assert out.exists() and (tmp_path / "m.loss.png").exists()
    ck = ckpt.load(out)
    assert ck.step == 30 and ck.cfg.layers == 2 and ck.cfg.ctx == 16
    assert ck.extra["tokenizer"] == "byte" and "dataRngState" in ck.extra


def test_same_seed_same_losses(tmp_path, corpus):
    logs = []
    for i in range(2):
        log = tmp_path / f"{i}.jsonl"
        assert run_cli("train", *TINY, "--data", corpus, "--steps", 12, "--log-every", 1, "--eval-every", 0,
                       "--out", tmp_path / f"{i}.tinygpt", "--log", log) == 0
        logs.append([r["train_loss"] for r in read_log(log)])
    assert logs[0] == logs[1]


def test_resume_reproduces_the_uninterrupted_run(tmp_path, corpus):
    """Stop at step 7 (a shorter run, constant lr), resume to 16: the same 16 losses, bit for bit."""
    full, part = tmp_path / "full.jsonl", tmp_path / "part.jsonl"
    common = [*TINY, "--data", corpus, "--log-every", 1, "--eval-every", 0, "--schedule", "constant"]
    assert run_cli("train", *common, "--steps", 16, "--out", tmp_path / "full.tinygpt", "--log", full) == 0
    assert run_cli("train", *common, "--steps", 7, "--out", tmp_path / "part.tinygpt", "--log", part) == 0
    assert run_cli("train", "--resume", tmp_path / "part.tinygpt", "--quiet", "--data", corpus, "--log-every", 1,
                   "--eval-every", 0, "--steps", 16, "--out", tmp_path / "part.tinygpt", "--log", part) == 0
    a = [r["train_loss"] for r in read_log(full)]
    b = [r["train_loss"] for r in read_log(part)]
    assert len(a) == len(b) == 16
    assert a == b, "resumed losses differ from the uninterrupted run"


def _train_cmd(*args):
    return [sys.executable, "-m", "tinygpt", "train", *[str(a) for a in args]]


def test_ctrl_c_saves_exits_130_and_resume_matches(tmp_path, corpus):
    """A real SIGINT mid-run (warmup + cosine schedule): saved, exit 130, resumed to the same losses."""
    import signal
    import time
    common = [*TINY, "--data", corpus, "--log-every", 1, "--eval-every", 0, "--warmup", 5, "--min-lr", 1e-5,
              "--steps", 60, "--lr", 3e-3]       # not the default: this test is about signals, on any corpus
    full, part, ck = tmp_path / "full.jsonl", tmp_path / "part.jsonl", tmp_path / "part.tinygpt"
    assert run_cli("train", *common, "--out", tmp_path / "full.tinygpt", "--log", full) == 0
    proc = subprocess.Popen(_train_cmd(*common, "--out", ck, "--log", part), stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while time.time() < deadline and (not part.exists() or len(part.read_text().splitlines()) < 5):
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr and "saved; continue with" in stderr
    stopped = ckpt.load(ck).step
    assert 5 <= stopped < 60
    printed = next(l for l in stderr.splitlines() if "continue with:" in l).split("continue with: ")[1]
    kept = ck.read_bytes()
    # no schedule flags and no --steps: the file's schedule (warm-up 5, floor 1e-5) runs to its planned end
    assert run_cli("train", "--resume", ck, *common[len(TINY):len(TINY) + 6], "--out", ck, "--log", part) == 0
    a = [r["train_loss"] for r in read_log(full)]
    b = [r["train_loss"] for r in read_log(part)]
    assert [r["step"] for r in read_log(part)] == list(range(1, 61))
    assert a == b, f"resumed after step {stopped}: losses differ"
    # the command printed at the interrupt runs as printed (with the run's --data: a path in a file is never opened)
    import shlex
    resumed = ck.read_bytes()
    ck.write_bytes(kept)
    argv = shlex.split(printed)
    assert argv[:2] == ["tinygpt", "train"], printed
    r = subprocess.run([sys.executable, "-m", "tinygpt", *argv[1:]], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    again, first = ckpt.load(ck), tmp_path / "first.tinygpt"
    first.write_bytes(resumed)
    assert again.step == 60
    assert all(np.array_equal(again.params[k], ckpt.load(first).params[k]) for k in again.params)


def test_checkpoint_round_trip_is_byte_identical(tmp_path):
    cfg = Config(layers=1, d_model=8, heads=2, ctx=4, batch=2, vocab=256)
    p = init_params(cfg)
    m = {k: np.full_like(v, 0.5) for k, v in p.items()}
    v = {k: np.full_like(x, 0.25) for k, x in p.items()}
    ck = ckpt.Checkpoint(cfg, p, m, v, step=7, loss_history=[{"step": 7, "train": 5.0}], extra={"tokenizer": "byte"})
    raw = ckpt.encode(ck)
    assert raw[:4] == b"TGPT" and int.from_bytes(raw[4:8], "little") == 2
    back = ckpt.decode(raw)
    assert back.step == 7 and back.cfg.d_model == 8
    for name in p:
        assert np.array_equal(back.params[name], p[name]) and np.array_equal(back.v[name], v[name])
    assert ckpt.encode(back) == raw
    hdr = json.loads(raw[12:12 + int.from_bytes(raw[8:12], "little")])
    assert hdr["includesOptimizerState"] is True and hdr["weightDtype"] == "fp32"
    assert hdr["stateByteLength"] == len(raw) - 12 - len(json.dumps(hdr, separators=(",", ":")))
    assert [e["name"] for e in hdr["manifest"]][:6] == ["token_embedding.weight", "position_embedding.weight",
                                                        "ln_final.weight", "ln_final.bias", "blocks.0.ln1.weight",
                                                        "blocks.0.ln1.bias"]
    assert hdr["manifest"][-4] == {"name": "blocks.0.mlp.fc_in.weight", "shape": [32, 8],
                                   "floatOffset": ckpt.n_params(cfg) - 32 * 8 - 32 - 8 * 32 - 8}


def test_version_1_file_without_optimizer_state_loads(tmp_path):
    cfg = Config(layers=1, d_model=8, heads=2, ctx=4, batch=2, vocab=256)
    p = init_params(cfg)
    header = {"config": ckpt.config_to_header(cfg), "includesOptimizerState": False}
    body = b"".join(p[n].astype("<f4").tobytes() for n, _, _ in param_shapes(cfg))
    hb = json.dumps(header).encode()
    raw = b"TGPT" + (1).to_bytes(4, "little") + len(hb).to_bytes(4, "little") + hb + (3).to_bytes(4, "little") + body
    ck = ckpt.decode(raw)
    assert ck.step == 3 and ck.m is None and np.array_equal(ck.params["h0.Wq"], p["h0.Wq"])


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    d = tmp_path_factory.mktemp("trained")
    corpus = d / "c.txt"
    corpus.write_text(("The quick brown fox jumps over the lazy dog. " * 400))
    out = d / "m.tinygpt"
    assert main(["train", *TINY, "--data", str(corpus), "--steps", "60", "--lr", "3e-3", "--eval-every", "0",
                 "--out", str(out)]) == 0
    return out, corpus


def test_eval_json_is_deterministic(trained, capsys):
    out, corpus = trained
    results = []
    for _ in range(2):
        assert run_cli("eval", "--model", out, "--data", corpus, "--json") == 0
        results.append(json.loads(capsys.readouterr().out))
    r = results[0]
    assert results[0] == results[1]
    assert set(r) == {"loss", "perplexity", "windows", "tokens", "bits_per_byte", "data", "ctx"}
    assert r["data"] == str(corpus)                  # it names what it scored (issue 47)
    assert abs(r["bits_per_byte"] - r["loss"] / np.log(2)) < 1e-12
    n = len(corpus.read_bytes())
    val = n - int(np.floor(0.9 * n))
    assert r["windows"] == (val - 1) // 16 and r["tokens"] == r["windows"] * 16
    assert abs(r["perplexity"] - np.exp(r["loss"])) < 1e-6 * r["perplexity"]
    assert run_cli("eval", "--model", out, "--data", corpus, "--json", "--max-windows", 3) == 0
    assert json.loads(capsys.readouterr().out)["windows"] == 3
    assert run_cli("eval", "--model", out, "--data", corpus, "--max-windows", 3) == 0
    assert capsys.readouterr().out.strip().endswith(f"tokens of {corpus}")


def test_eval_matches_the_reference(trained, capsys):
    out, corpus = trained
    assert run_cli("eval", "--model", out, "--data", corpus, "--json", "--max-windows", 5) == 0
    got = json.loads(capsys.readouterr().out)["loss"]
    ck = ckpt.load(out)
    toks = ByteTokenizer().encode(corpus.read_bytes())
    val = toks[int(np.floor(0.9 * len(toks))):]
    x = np.stack([val[i * 16:i * 16 + 16] for i in range(5)])
    y = np.stack([val[i * 16 + 1:i * 16 + 17] for i in range(5)])
    params = {k: v.astype(np.float64) for k, v in ck.params.items()}
    cfg = ck.cfg
    cfg.batch = 5
    _, loss, _ = RG.forward(params, cfg, x, y)
    assert abs(got - loss) < 1e-4


def test_greedy_sample_matches_reference(trained, capsys):
    out, _ = trained
    prompt = "The quick"
    assert run_cli("sample", "--model", out, "--prompt", prompt, "--tokens", 24, "--temperature", 0) == 0
    text = capsys.readouterr().out
    ck = ckpt.load(out)
    params = {k: v.astype(np.float64) for k, v in ck.params.items()}
    ids, s = list(prompt.encode()), 0
    for _ in range(24):                        # 33 tokens > ctx 16: the window restarts twice
        s = window_start(s, len(ids), ck.cfg.ctx)
        logits = RG.forward(params, ck.cfg, np.array([ids[s:]]))
        ids.append(int(np.argmax(logits[0, -1])))
    assert text == bytes(ids).decode("utf-8", errors="replace") + "\n"
    assert text.startswith(prompt)


def test_sample_long_prompt_and_top_k(trained, capsys):
    out, _ = trained
    assert run_cli("sample", "--model", out, "--prompt", "x" * 100, "--tokens", 5, "--top-k", 3, "--seed", 1) == 0
    assert capsys.readouterr().out.startswith("x" * 100)


def test_info_json(capsys):
    assert run_cli("info", "--json") == 0
    info = json.loads(capsys.readouterr().out)
    assert info["adapter"] and info["backend"] and "max-storage-buffer-binding-size" in info["limits"]


def test_export_safetensors_and_hf(trained, tmp_path):
    out, _ = trained
    from safetensors.numpy import load_file
    st = tmp_path / "w.safetensors"
    assert run_cli("export", "--model", out, "--format", "safetensors", st) == 0
    ck = ckpt.load(out)
    loaded = load_file(str(st))       # TinyGPT's names, PyTorch's [out, in] for the linear weights
    assert set(loaded) == {ckpt.upstream_name(n)[0] for n in ck.params}
    assert np.array_equal(loaded["blocks.1.mlp.fc_in.weight"], ck.params["h1.fc_in_W"].T)
    assert np.array_equal(loaded["blocks.0.attn.q_proj.bias"], ck.params["h0.bq"])
    assert np.array_equal(loaded["token_embedding.weight"], ck.params["tok_emb"])
    hf = tmp_path / "hf"
    assert run_cli("export", "--model", out, "--format", "hf", hf) == 0
    config = json.loads((hf / "config.json").read_text())
    assert config["model_type"] == "gpt2" and config["n_layer"] == 2 and config["activation_function"] == "gelu"
    sd = load_file(str(hf / "model.safetensors"))
    assert sd["transformer.h.0.attn.c_attn.weight"].shape == (48, 144)
    try:
        import torch
        from transformers import GPT2LMHeadModel
    except ImportError:
        pytest.skip("transformers/torch not installed: the export's names and shapes were checked")
    model = GPT2LMHeadModel.from_pretrained(str(hf)).eval()
    x = np.random.default_rng(0).integers(0, 256, (2, 16))
    with torch.no_grad():
        got = model(torch.tensor(x)).logits.numpy()
    want = RG.forward({k: v.astype(np.float64) for k, v in ck.params.items()}, ck.cfg, x)
    np.testing.assert_allclose(got, want, atol=1e-4)


def test_gpt2_tokenizer_from_file(tmp_path, corpus):
    f = SHARED / "r50k_base.tiktoken"
    if not f.exists():
        pytest.skip("no r50k_base.tiktoken beside the checkout")
    out = tmp_path / "g.tinygpt"
    assert run_cli("train", "--preset", "tiny", "--batch", "2", "--ctx", "8", "--quiet", "--steps", 3,
                   "--tokenizer", "gpt2", "--tokenizer-file", f, "--data", corpus, "--eval-every", 0, "--out", out) == 0
    ck = ckpt.load(out)
    hdr = ck.header["config"]
    assert hdr["vocabSize"] == 50257 and hdr["tokenizerSource"] == "r50k_base"


def test_gpt2_without_file_or_cache_says_what_to_do(tmp_path, corpus):
    env = dict(os.environ, TIKTOKEN_CACHE_DIR=str(tmp_path / "empty"))
    r = subprocess.run([sys.executable, "-m", "tinygpt", "train", "--preset", "tiny", "--steps", "1", "--quiet",
                        "--tokenizer", "gpt2", "--data", str(corpus), "--out", str(tmp_path / "x.tinygpt")],
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    err = [l for l in r.stderr.splitlines() if "XDG_RUNTIME_DIR" not in l]
    assert len(err) == 1 and "TIKTOKEN_CACHE_DIR" in err[0] and "--tokenizer-file" in err[0]
    assert "Traceback" not in r.stderr


def test_layers_below_the_cli_know_no_flags():
    """Only the command line (commands/cli.py, chat.py, train's flags in settings.py, and their argument
    types, argtypes.py) knows argparse and flag names; the runtime never imports the reference (the judge)."""
    import re
    root = ROOT / "tinygpt"
    for f in sorted(root.rglob("*.py")):
        if f.parent.name == "commands" and f.name in ("cli.py", "chat.py", "settings.py", "argtypes.py") \
                or f.parent.name == "reference" or f.name == "browser.py":     # browser.py: Chromium's flags
            continue
        text = f.read_text()
        assert "argparse" not in text and not re.search(r"\bargs\.", text), f"{f.name} reads an argparse namespace"
        found = re.search(r"--[a-z][a-z-]*", text)
        assert not found, f"{f.name} writes a flag name: {found and found[0]}"
        if f.name not in ("tune.py", "numerics.py", "twincheck.py"):  # they check kernels against it
            assert not re.search(r"from \.+reference\b|import reference\b|from \.+ import reference", text), \
                f"{f.name} imports the reference"


def test_kernels_flag_banner_and_info(tmp_path, corpus, capsys):
    out = tmp_path / "m.tinygpt"
    assert run_cli("train", *TINY, "--data", corpus, "--steps", 3, "--eval-every", 0, "--out", out,
                   "--kernels", "matmul=scalar,attention=tiles,loss=scalar") == 0
    err = capsys.readouterr().err
    assert "kernels: matmul=scalar(forced) attention=tiles(forced) loss=scalar(forced)" in err
    with pytest.raises(SystemExit) as e:
        run_cli("train", "--kernels", "matmul=fast")
    assert e.value.code == 2 and "matmul has no variant 'fast'; choose sg|tiled|vec4|scalar" in capsys.readouterr().err
    assert run_cli("info", "--model", out, "--json") == 0
    d = json.loads(capsys.readouterr().out)
    assert (d["layers"], d["ctx"], d["step"], d["tokenizer"], d["optimizer_state"]) == (2, 16, 3, "byte", True)
    assert d["params"] == 2 * (12 * 48 * 48 + 9 * 48 + 192) + 256 * 48 + 16 * 48 + 96
    assert run_cli("info", "--json") == 0
    plan = json.loads(capsys.readouterr().out)["kernel_plan"]
    assert set(plan) >= {"matmul", "attention", "loss", "reduce", "elementwise", "subgroups"}


def test_resume_a_tinygpt_gpt2_file_without_our_fields(tmp_path, corpus):
    """A file TinyGPT's app wrote (vocabSize 50257, no tinygptPy.tokenizer) resumes with the gpt2
    tokenizer, as its vocabulary says; it used to be read as bytes and fail on the shapes."""
    f = SHARED / "r50k_base.tiktoken"
    if not f.exists():
        pytest.skip("no r50k_base.tiktoken beside the checkout")
    cfg = Config(layers=1, d_model=8, heads=2, ctx=8, batch=2, vocab=50257)
    p = tmp_path / "app.tinygpt"
    ckpt.save(p, ckpt.Checkpoint(cfg, init_params(cfg), step=0))
    assert "tokenizer" not in ckpt.load(p).extra
    assert run_cli("train", "--resume", p, "--tokenizer-file", f, "--data", corpus, "--steps", 2, "--quiet",
                   "--eval-every", 0) == 0
    assert ckpt.load(p).step == 2 and ckpt.load(p).extra["tokenizer"] == "gpt2"


def test_precision_bf16_trains_resumes_evaluates_and_samples(tmp_path, corpus, capsys, gpu):
    """--precision bf16: refused in one line for a width it cannot pack; recorded in the checkpoint
    (which stays float32), kept on resume unless the flag says otherwise, accepted by eval and sample
    (which samples from its bf16 key/value cache)."""
    rc = run_cli("train", *TINY, "--d-model", 36, "--data", corpus, "--steps", 2, "--precision", "bf16",
                 "--out", tmp_path / "odd.tinygpt")
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert rc == 2 and "--precision bf16 needs --d-model and the MLP width multiples of 8, got 36" in err, err
    assert not (tmp_path / "odd.tinygpt").exists()
    out = tmp_path / "m.tinygpt"
    assert run_cli("train", *TINY, "--data", corpus, "--steps", 3, "--eval-every", 0, "--precision", "bf16",
                   "--out", out, "--quiet", "--sample-tokens", 8) == 0
    assert ", bf16 on " in capsys.readouterr().err
    ck = ckpt.load(out)
    assert ck.extra["precision"] == "bf16" and all(v.dtype == np.float32 for v in ck.params.values())
    assert run_cli("train", "--resume", out, "--data", corpus, "--steps", 5, "--eval-every", 0, "--quiet",
                   "--sample-tokens", 0) == 0
    assert ", bf16 on " in capsys.readouterr().err and ckpt.load(out).step == 5
    assert run_cli("train", "--resume", out, "--data", corpus, "--steps", 6, "--eval-every", 0, "--quiet",
                   "--sample-tokens", 0, "--precision", "fp32") == 0          # and back to fp32
    assert ", fp32 on " in capsys.readouterr().err and ckpt.load(out).extra["precision"] == "fp32"
    assert run_cli("eval", "--model", out, "--data", corpus, "--precision", "bf16", "--json") == 0
    bf, fp = json.loads(capsys.readouterr().out)["loss"], None
    assert run_cli("eval", "--model", out, "--data", corpus, "--json") == 0
    fp = json.loads(capsys.readouterr().out)["loss"]
    print(f"eval after 6 steps: fp32 {fp:.5f}, bf16 {bf:.5f}")
    assert abs(bf - fp) < 0.02
    assert run_cli("sample", "--model", out, "--precision", "bf16", "--tokens", 5, "--prompt", "ab") == 0
    assert "key/value cache, bf16" in capsys.readouterr().err


def test_precision_f16_resumes_its_loss_scaler_bit_for_bit(tmp_path, corpus, capsys, gpu):
    """--precision f16 from a loss scale that overflows at first (2^21 on tiny): 10 steps straight,
    or 5 then a resume to 10, give the same losses, scales and skip counts (the scaler's state and
    AdamW's count of the steps taken are in the checkpoint). --loss-scale elsewhere: one line."""
    if "shader-f16" not in gpu.features:
        pytest.skip(f"{gpu.name} has no shader-f16")
    full, part = tmp_path / "full.jsonl", tmp_path / "part.jsonl"
    common = [*TINY, "--data", corpus, "--log-every", 1, "--eval-every", 0, "--schedule", "constant",
              "--precision", "f16", "--sample-tokens", 0, "--optimizer", "adamw"]     # adamSteps: AdamW's count
    assert run_cli("train", *common, "--loss-scale", 2 ** 21, "--steps", 10, "--out", tmp_path / "a.tinygpt",
                   "--log", full) == 0
    assert run_cli("train", *common, "--loss-scale", 2 ** 21, "--steps", 5, "--out", tmp_path / "b.tinygpt",
                   "--log", part) == 0
    ck = ckpt.load(tmp_path / "b.tinygpt")
    assert ck.extra["precision"] == "f16" and ck.extra["adamSteps"] == 5 - ck.extra["skippedSteps"]
    assert run_cli("train", "--resume", tmp_path / "b.tinygpt", "--quiet", "--data", corpus, "--log-every", 1,
                   "--eval-every", 0, "--steps", 10, "--sample-tokens", 0, "--log", part) == 0
    a = [(r["train_loss"], r["loss_scale"], r["skipped_steps"]) for r in read_log(full)]
    b = [(r["train_loss"], r["loss_scale"], r["skipped_steps"]) for r in read_log(part)]
    print("loss, scale, skipped:", a)
    assert a == b and len(a) == 10, "resumed f16 run differs from the uninterrupted one"
    assert a[-1][2] >= 1 and a[-1][1] < 2 ** 21, "the test meant to start from an overflowing scale"
    capsys.readouterr()
    assert run_cli("train", *TINY, "--data", corpus, "--steps", 1, "--loss-scale", 1024, "--out",
                   tmp_path / "c.tinygpt") == 2
    err = capsys.readouterr().err.strip()
    assert err.splitlines()[-1].startswith("tinygpt: error: --loss-scale sets the loss scaler of --precision f16"), err


def test_help_texts_state_the_real_defaults():
    """The defaults `tinygpt train --help` names are the config's, and every flag's parser default
    is the options object's, so neither can drift from what a run does."""
    import re
    from dataclasses import MISSING, fields
    from tinygpt.commands.cli import build_parser
    from tinygpt.core.config import TINYGPT_LR, TRAIN_DEFAULTS, Config
    from tinygpt.run.options import EvalOptions, SampleOptions, TrainOptions
    ap = build_parser()
    sub = next(a for a in ap._actions if a.dest == "cmd").choices
    text = " ".join(sub["train"].format_help().split())
    small, base = TRAIN_DEFAULTS["small"], Config()
    named = {r"peak learning rate \(default: the preset's, ([\d.e+-]+) for small\)": small.lr,
             r"linear warm-up steps \(default: the preset's, (\d+) for small": small.warmup,
             r"where the cosine decay ends \(default: the preset's, ([\d.e+-]+) for small\)": small.min_lr,
             r"total steps \(default: the preset's, (\d+) for small": small.steps,
             r"TinyGPT's, lr ([\d.e+-]+)\)": TINYGPT_LR,
             r"global grad-norm clip \(default ([\d.e+-]+),": base.grad_clip,
             r"init and data sampling seed \(default (\d+)\)": base.seed}
    for pattern, want in named.items():
        m = re.search(pattern, text)
        assert m, f"the help text no longer says {pattern!r}"
        print(f"help says {m.group(1)}, the config {want}")
        assert float(m.group(1)) == want, (pattern, m.group(1), want)
    compared = 0
    for cmd, cls in (("train", TrainOptions), ("eval", EvalOptions), ("sample", SampleOptions)):
        defaults = {a.dest: a.default for a in sub[cmd]._actions}
        for f in fields(cls):
            if f.name not in defaults or (f.default is MISSING and f.default_factory is MISSING):
                continue                                    # not a flag of this command, or required
            want = f.default if f.default is not MISSING else f.default_factory()
            assert defaults[f.name] == want, f"{cmd} --{f.name}: parser default {defaults[f.name]!r}, options {want!r}"
            compared += 1
    print(f"{compared} parser defaults equal to the options objects'")
    assert compared > 40


def test_a_saved_models_run_trains_windows_of_its_own(tmp_path, corpus, capsys):
    """Issue 64: --ctx on a saved model is the run's windows, at most the model's context; the file
    keeps its context, and a resumed run keeps its windows; over the context is refused."""
    base, ft = tmp_path / "base.tinygpt", tmp_path / "ft.tinygpt"
    common = ["--data", corpus, "--eval-every", 0, "--sample-tokens", 0, "--quiet"]
    assert run_cli("train", *TINY, *common, "--steps", 2, "--out", base) == 0
    ctx = ckpt.load(base).cfg.ctx
    capsys.readouterr()
    assert run_cli("train", "--resume", base, "--lora", 4, "--ctx", ctx // 2, *common, "--steps", 2, "--out", ft) == 0
    assert f"(windows of {ctx // 2})" in capsys.readouterr().err
    saved = ckpt.load(ft)
    assert saved.cfg.ctx == ctx and saved.extra["trainWindow"] == ctx // 2
    assert run_cli("train", "--resume", ft, *common, "--steps", 4) == 0
    assert f"(windows of {ctx // 2})" in capsys.readouterr().err
    assert run_cli("train", "--resume", base, "--ctx", 2 * ctx, *common, "--steps", 3) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"--ctx {2 * ctx} (file: {ctx}), over the model's context" in err[0], err
