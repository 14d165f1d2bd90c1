"""Bad input, faults and long runs: every case ends in one line on stderr that
says what happened and what to do, a non-zero exit code, no traceback, and
nothing the user saved lost or half-written."""
import errno
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from support import cli, in_process, one_line_error, ROOT, SHARED, TINY
from tinygpt.model.spec import RunSpec
from tinygpt.files import checkpoint as ckpt
from tinygpt.commands.cli import main
from tinygpt.core.config import Config
from tinygpt.core.init import init_params


@pytest.fixture
def saved(tmp_path, sentences):
    out = tmp_path / "m.tinygpt"
    assert main(["train", *TINY, "--data", str(sentences), "--steps", "4", "--eval-every", "0", "--out", str(out)]) == 0
    return out


# ---- bad input -----------------------------------------------------------------------------------
def test_no_adapter_says_how_to_get_one():
    rc, err = cli("info", env={"TINYGPT_BACKEND": "d3d12"})  # no D3D12 adapter on Linux
    one_line_error(rc, err, "no WebGPU adapter", "mesa-vulkan-drivers")


def test_no_adapter_at_all(monkeypatch, capsys):
    import wgpu
    monkeypatch.setattr(wgpu.gpu, "enumerate_adapters_sync", lambda: [])
    assert main(["info"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "mesa-vulkan-drivers" in err[0] and "GPU driver" in err[0]


@pytest.mark.parametrize("case", ["missing", "directory", "empty", "short"])
def test_bad_data(tmp_path, case):
    """A directory is a corpus of its files: an empty one is refused."""
    (tmp_path / "empty dir").mkdir()
    path = {"missing": tmp_path / "nope.txt", "directory": tmp_path / "empty dir", "empty": tmp_path / "e.txt",
            "short": tmp_path / "s.txt"}[case]
    if case == "empty":
        path.write_text("")
    if case == "short":
        path.write_text("x" * 100)
    rc, err = cli("train", *TINY, "--steps", 1, "--data", path, "--out", tmp_path / "o.tinygpt")
    want = {"missing": "no such file", "directory": "holds no files", "empty": "empty",
            "short": "at least 170 tokens"}[case]
    one_line_error(rc, err, want)


def test_unreadable_data(tmp_path, monkeypatch, capsys):
    p = tmp_path / "locked.txt"
    p.write_text("some text")
    import builtins
    real = builtins.open

    def deny(path, *a, **k):
        if str(path) == str(p):
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real(path, *a, **k)
    monkeypatch.setattr(builtins, "open", deny)  # root reads anything: simulate the denial
    assert main(["train", *TINY, "--steps", "1", "--data", str(p), "--out", str(tmp_path / "o.tinygpt")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert "cannot read it (Permission denied)" in err[-1] and "permissions" in err[-1]


def test_invalid_utf8_with_gpt2(tmp_path):
    f = SHARED / "r50k_base.tiktoken"
    if not f.exists():
        pytest.skip("no r50k_base.tiktoken beside the checkout")
    p = tmp_path / "bad.txt"
    p.write_bytes(b"fine text \xff\xfe broken " * 100)
    rc, err = cli("train", *TINY, "--steps", 1, "--tokenizer", "gpt2", "--tokenizer-file", f, "--data", p,
                  "--out", tmp_path / "o.tinygpt")
    one_line_error(rc, err, "not valid UTF-8", "--tokenizer byte")


@pytest.mark.parametrize("args,needle", [
    (["--preset", "giant"], "unknown preset 'giant'"),
    (["--d-model", "48", "--heads", "5"], "must divide --d-model"),
    (["--steps", "0"], "--steps: must be positive"),
    (["--batch", "-2"], "--batch: must be positive"),
    (["--ctx", "0"], "--ctx: must be positive"),
    (["--lr", "0"], "--lr: must be a positive"),
    (["--lr", "nan"], "--lr: must be a positive"),
    (["--attention", "fused_sv", "--batch", "1", "--ctx", "30000"], "attn P [B, NH, T, T] binds"),
])
def test_bad_flags(tmp_path, args, needle):
    base = ["--preset", "tiny", "--quiet", "--steps", "1"]
    rc, err = cli("train", *base, *args, "--out", tmp_path / "o.tinygpt")
    one_line_error(rc, err, needle)
    assert rc == 2


def test_sampling_limits(saved):
    rc, err = cli("sample", "--model", saved, "--tokens", 10**7)
    one_line_error(rc, err, "--tokens must be 1 to 100,000")
    rc, err = cli("sample", "--model", saved, "--top-k", 0)
    one_line_error(rc, err, "--top-k must be positive")


def test_too_big_for_the_device_is_caught_before_training(tmp_path, sentences):
    rc, err = cli("train", "--preset", "tiny", "--quiet", "--steps", "1", "--data", sentences, "--layers", "1",
                  "--d-model", "4096", "--heads", "32", "--out", tmp_path / "o.tinygpt")
    # the first buffer over the limit: Muon's Newton-Schulz scratch (Muon is the default at every size
    # now that its state lies in the file's moment slots), as large as h0.fc_in_W
    one_line_error(rc, err, "does not fit", "binds 268,435,456 bytes", "binding limit", "--d-model")
    rc, err = cli("train", "--preset", "tiny", "--quiet", "--steps", "1", "--data", sentences, "--batch", "4096",
                  "--ctx", "32", "--out", tmp_path / "o.tinygpt")
    one_line_error(rc, err, "131,072", "--batch")
    # where the end-of-run samples are what does not fit, the advice is about them (not --ctx)
    rc, err = cli("train", "--preset", "tiny", "--quiet", "--steps", "1", "--data", sentences, "--sample-tokens", 10**12,
                  "--out", tmp_path / "o.tinygpt")
    one_line_error(rc, err, "does not fit", "samples at the end", "--sample-tokens")


def test_large_logits_are_split_not_refused(gpu, plan, monkeypatch):
    """Logits over one binding are bound in row chunks; the losses and updates are unchanged."""
    from tinygpt.core.config import preset
    from tinygpt.model.gpt import Model
    cfg = preset("tiny", batch=16, ctx=32, vocab=300)
    x = np.random.default_rng(0).integers(0, 300, (16, 33))
    runs = []
    for limit in (None, 400_000):
        if limit:
            monkeypatch.setitem(gpu.limits, "max-storage-buffer-binding-size", limit)
        m = Model(gpu, plan, RunSpec(cfg, "online"))
        m.set_params(init_params(cfg))
        losses = []
        for _ in range(3):
            m.step(x[:, :-1], x[:, 1:], 1e-3)
            losses.append(m.loss())
        runs.append((len(m.layout.logit_chunks), losses, m.get_params()["tok_emb"]))
    assert runs[0][0] == 1 and runs[1][0] == 2
    np.testing.assert_allclose(runs[1][1], runs[0][1], atol=1e-5)
    np.testing.assert_allclose(runs[1][2], runs[0][2], atol=1e-5)


# ---- .tinygpt files ------------------------------------------------------------------------------
def _file(tmp_path, name, raw):
    p = tmp_path / name
    p.write_bytes(raw)
    return p


def test_bad_checkpoint_files(tmp_path, saved):
    good = saved.read_bytes()
    hlen = int.from_bytes(good[8:12], "little")
    header = json.loads(good[12:12 + hlen])
    def with_header(h):
        hb = json.dumps(h).encode()
        return good[:8] + len(hb).to_bytes(4, "little") + hb + good[12 + hlen:]
    cases = {
        "magic": (b"NOPE" + good[4:], "not a .tinygpt file"),
        "version": (good[:4] + (9).to_bytes(4, "little") + good[8:], "version 9"),
        "truncated": (good[:-100], "truncated"),
        "notjson": (good[:12] + b"{" * hlen + good[12 + hlen:], "not valid JSON"),
        "hugeheader": (good[:8] + (10**9).to_bytes(4, "little") + good[12:], "truncated or corrupt"),
        "statesize": (with_header(dict(header, stateByteLength=12)), "disagrees with its config"),
        "dtype": (with_header(dict(header, weightDtype="fp16")), "fp16"),
        "config": (with_header(dict(header, config={**header["config"], "heads": 5})), "must divide"),
    }
    for name, (raw, needle) in cases.items():
        p = _file(tmp_path, name + ".tinygpt", raw)
        rc, err = cli("eval", "--model", p)
        one_line_error(rc, err, needle)


def test_resume_with_contradicting_flags_lists_them(saved, sentences):
    rc, err = cli("train", "--resume", saved, "--layers", 3, "--ctx", 32, "--steps", 10, "--data", sentences,
                  "--out", saved)
    one_line_error(rc, err, "--layers 3 (file: 2)", "--ctx 32 (file: 16)")


def test_out_over_a_foreign_file_needs_force(tmp_path, sentences):
    precious = tmp_path / "notes.txt"
    precious.write_text("my notes")
    rc, err = cli("train", *TINY, "--steps", 1, "--data", sentences, "--out", precious)
    one_line_error(rc, err, "not a checkpoint written by tinygpt", "--force")
    assert precious.read_text() == "my notes"
    rc, _ = cli("train", *TINY, "--steps", 1, "--data", sentences, "--eval-every", 0, "--out", precious, "--force")
    assert rc == 0 and ckpt.is_tinygpt(precious)


def test_no_pickle_anywhere():
    """Loading a file never executes code from it: no pickle, no allow_pickle, no eval."""
    import re
    root = ROOT / "tinygpt"
    for f in root.rglob("*.py"):
        text = f.read_text()
        for bad in (r"import pickle", r"allow_pickle=True", r"torch\.load\(", r"(?<![\w.])eval\(", r"(?<![\w.])exec\("):
            assert not re.search(bad, text), f"{f.name} uses {bad}"


# ---- faults --------------------------------------------------------------------------------------
def test_kill_9_during_checkpoint_writes_leaves_a_loadable_file(tmp_path):
    """A writer saving in a loop is killed with SIGKILL at random moments: the file always loads."""
    path = tmp_path / "k.tinygpt"
    cfg = Config(layers=4, d_model=128, heads=4, ctx=64, batch=2)
    ckpt.save(path, ckpt.Checkpoint(cfg, init_params(cfg), step=0))
    code = f"""
import sys; sys.path.insert(0, {str(ROOT)!r})
from tinygpt.files import checkpoint as ck
from tinygpt.core.config import Config
from tinygpt.core.init import init_params
cfg = Config(layers=4, d_model=128, heads=4, ctx=64, batch=2)
p = init_params(cfg)
i = 0
while True:
    i += 1
    ck.save({str(path)!r}, ck.Checkpoint(cfg, p, step=i))
"""
    rng = np.random.default_rng(0)
    for trial in range(4):
        proc = subprocess.Popen([sys.executable, "-c", code])
        time.sleep(0.5 + rng.random())
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        back = ckpt.load(path)
        assert back.cfg.d_model == 128 and back.step >= 0


def test_second_ctrl_c_during_the_save_leaves_a_whole_file(tmp_path, sentences):
    out = tmp_path / "m.tinygpt"
    proc = subprocess.Popen([sys.executable, "-m", "tinygpt", "train", *TINY, "--data", str(sentences),
                             "--steps", "100000", "--eval-every", "0", "--log-every", "1", "--log", str(tmp_path / "l.jsonl"),
                             "--out", str(out)], stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while time.time() < deadline and (not (tmp_path / "l.jsonl").exists() or
                                      len((tmp_path / "l.jsonl").read_text().splitlines()) < 3):
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr
    assert ckpt.load(out).step >= 3
    assert not list(tmp_path.glob(".tinygpt-*"))


@pytest.mark.parametrize("final", [True, False])
def test_disk_full_at_save(tmp_path, sentences, saved, monkeypatch, capsys, final):
    """A failed save says so and keeps the last good checkpoint; a periodic one lets training go on."""
    before = saved.read_bytes()
    real = os.fsync

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(os, "fsync", full)
    args = ["train", *TINY, "--data", str(sentences), "--eval-every", "0", "--out", str(saved), "--force"]
    if final:
        rc = main(args + ["--steps", "3"])
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 1 and "No space left on device" in err[-1] and "keeps the checkpoint of step 4" in err[-1]
    else:
        calls = {"n": 0}

        def full_once(fd):
            calls["n"] += 1
            if calls["n"] == 1:
                raise OSError(errno.ENOSPC, "No space left on device")
            return real(fd)
        monkeypatch.setattr(os, "fsync", full_once)
        rc = main(args + ["--steps", "4", "--save-every", "2"])
        err = capsys.readouterr().err
        assert rc == 0 and "warning: could not save" in err
        assert ckpt.load(saved).step == 4
        return
    assert saved.read_bytes() == before
    assert not list(tmp_path.glob(".tinygpt-*"))


def test_nan_stops_with_the_step_and_a_hint(tmp_path, sentences, saved):
    before = saved.read_bytes()
    rc, err = cli("train", *TINY, "--data", sentences, "--steps", 50, "--lr", "1e30", "--log-every", 1,
                  "--eval-every", 0, "--out", saved)
    one_line_error(rc, err, "at step", "lower --lr", "every kernel of this run agrees with its float64 reference",
                   "wrote the step's first value that is not finite")     # issue 49: checked, then --lr
    assert rc == 3
    assert saved.read_bytes() == before


def test_gpu_validation_error_names_the_kernel(gpu):
    from tinygpt.device.kernels import Kernels
    from tinygpt.device.plan import PORTABLE
    from tinygpt.device.gpu import GPUError
    x = gpu.tensor((64,))
    d = Kernels(gpu, PORTABLE).add(x, x, x, 64)  # one buffer bound read-only and writable in one dispatch: invalid
    with pytest.raises(GPUError, match=r"GPU validation error in .*\(add4?\)") as e:
        gpu.run([d])
    assert "\n" not in str(e.value)


# ---- long runs -----------------------------------------------------------------------------------
def resident_kib() -> int:
    """The process's resident set now, in KiB (Linux's /proc; the peak would hide later growth)."""
    return int([ln.split() for ln in open("/proc/self/status") if ln.startswith("VmRSS:")][0][1])


def test_memory_and_buffers_stay_flat(gpu, plan):
    """After the first steps, neither live GPU objects nor process memory grow. Memory is the
    resident size now (VmRSS), not the peak: within the suite the peak was set by earlier tests,
    and a growth under it would not show."""
    from tinygpt.core.config import preset
    from tinygpt.model.gpt import Model
    cfg = preset("tiny")
    m = Model(gpu, plan, RunSpec(cfg, "online"))
    m.set_params(init_params(cfg))
    x = np.random.default_rng(0).integers(0, 256, (cfg.batch, cfg.ctx + 1))
    for _ in range(20):
        m.step(x[:, :-1], x[:, 1:], 1e-3)
    m.loss()
    counts = dict(vars(gpu.counters))
    rss0 = resident_kib()
    for i in range(200):
        m.step(x[:, :-1], x[:, 1:], 1e-3)
        if i % 20 == 0:
            m.loss()
    rss1 = resident_kib()
    now = dict(vars(gpu.counters))
    for k in ("buffers", "bind_groups", "pipelines"):
        assert now[k] == counts[k], k
    print(f"RSS {rss0 / 1024:.1f} MiB -> {rss1 / 1024:.1f} MiB over 200 steps")
    assert rss1 - rss0 < 20 * 1024  # KiB: 20 MiB of slack for allocator noise


def test_the_engine_choice_is_checked(monkeypatch):
    """TINYGPT_WEBGPU: an unknown engine, or one whose package is missing, is one line naming
    the fix; the default is wgpu, and the banner's engine label follows the choice."""
    from tinygpt.device import gpu as G
    monkeypatch.setenv("TINYGPT_WEBGPU", "vulkan")
    rc, err = in_process("info", "--brief")
    one_line_error(rc, err, "unknown WebGPU engine 'vulkan'", "wgpu or dawn")
    monkeypatch.setitem(G.ENGINES, "dawn", ("tinygpt_no_such_module", "wgpudawn"))
    monkeypatch.setenv("TINYGPT_WEBGPU", "dawn")
    rc, err = in_process("info", "--brief")
    one_line_error(rc, err, "needs the wgpudawn package", "pip install 'tinygpt[dawn]'")
    monkeypatch.delenv("TINYGPT_WEBGPU")
    assert G.engine_name() == "wgpu" and G.ENGINE_LABELS["wgpu"] == "wgpu-native"
