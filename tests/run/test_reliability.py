"""Nothing a user owns is lost: each class of the reliability promises on real files, real
signals and a real full disk (a small tmpfs, where this machine lets us mount one)."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from support import TINY, cli, in_process, one_line_error
from tinygpt.files import checkpoint as ckpt
from tinygpt.commands.cli import main
from tinygpt.core.config import Config
from tinygpt.core.init import init_params


def train(sentences, out, *extra, steps=3):
    return cli("train", *TINY, "--data", sentences, "--steps", steps, "--eval-every", 0, "--out", out, *extra)


@pytest.fixture
def saved(tmp_path, sentences):
    out = tmp_path / "m.tinygpt"
    rc, err = train(sentences, out, steps=4)
    assert rc == 0, err
    return out


def foreign_png(path):
    """A PNG some other program wrote."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig = plt.figure(figsize=(1, 1))
    fig.savefig(path)
    plt.close(fig)
    return path.read_bytes()


# ---- 1. files: write only what is ours -----------------------------------------------------------
def test_out_named_png_keeps_the_checkpoint(tmp_path, sentences):
    out = tmp_path / "model.png"
    rc, err = train(sentences, out)
    assert rc == 0, err
    assert ckpt.load(out).step == 3                      # the plot went beside it, not over it
    assert (tmp_path / "model.loss.png").read_bytes().startswith(b"\x89PNG")


def test_a_foreign_png_beside_the_checkpoint_is_never_replaced(tmp_path, sentences):
    holiday = foreign_png(tmp_path / "holiday.png")
    rc, err = train(sentences, tmp_path / "holiday.tinygpt")
    assert rc == 0 and (tmp_path / "holiday.png").read_bytes() == holiday
    # where the plot would go, a file of someone else's is refused before training, unless --force
    other = foreign_png(tmp_path / "trip.loss.png")
    rc, err = train(sentences, tmp_path / "trip.tinygpt")
    one_line_error(rc, err, "trip.loss.png exists and is not a loss-curve plot written by tinygpt", "--force")
    assert rc == 2 and (tmp_path / "trip.loss.png").read_bytes() == other
    assert not (tmp_path / "trip.tinygpt").exists()
    rc, err = train(sentences, tmp_path / "trip.tinygpt", "--force")
    assert rc == 0 and (tmp_path / "trip.loss.png").read_bytes() != other
    rc, err = train(sentences, tmp_path / "trip.tinygpt")  # our own plot and checkpoint: replaced freely
    assert rc == 0, err


def test_log_appends_only_to_json_lines(tmp_path, sentences, saved):
    before = saved.read_bytes()
    rc, err = train(sentences, tmp_path / "n.tinygpt", "--log", saved)
    one_line_error(rc, err, "is not a JSON Lines log")
    assert saved.read_bytes() == before and ckpt.load(saved).step == 4
    log = tmp_path / "l.jsonl"
    log.write_text('{"step": 1}\n')
    rc, err = train(sentences, tmp_path / "n.tinygpt", "--log", log, "--log-every", 1)
    assert rc == 0 and len(log.read_text().splitlines()) == 4


def test_an_input_is_never_an_output(tmp_path, sentences, saved):
    rc, err = train(sentences, sentences, "--force")
    one_line_error(rc, err, "is also this command's --data")
    rc, err = train(sentences, tmp_path / "x.tinygpt", "--log", sentences)
    one_line_error(rc, err, "is also this command's --data")
    before = saved.read_bytes()
    for force in ([], ["--force"]):
        rc, err = cli("export", "--model", saved, "--format", "safetensors", saved, *force)
        one_line_error(rc, err, "is also this command's --model")
    assert saved.read_bytes() == before


def test_the_files_an_input_stands_for_are_inputs_too(tmp_path, sentences):
    """An input is every file reading it opens, compared by identity: a directory's text files
    (also through a symbolic link to it), a token file's sidecar, the tokenizer file, an adapters
    directory's files; none is ever written, --force or not. A directory's own token files are
    not its text: `prepare DIR --out DIR/corpus.bin` twice reads the same text both times."""
    d = tmp_path / "texts"
    d.mkdir()
    (d / "a.txt").write_text("To be, or not to be. " * 200)
    (d / "b.txt").write_text("That is the question. " * 200)
    (tmp_path / "link").symlink_to(d)
    before = (d / "b.txt").read_bytes()
    for out in (d / "b.txt", tmp_path / "link" / "b.txt"):
        rc, err = train(d, out, "--force")
        one_line_error(rc, err, "is also this command's --data", "b.txt")
    assert (d / "b.txt").read_bytes() == before
    tokens = tmp_path / "c.bin"
    assert cli("prepare", sentences, "--out", tokens)[0] == 0
    side = tokens.with_name("c.bin.json")
    kept = side.read_bytes()
    rc, err = train(tokens, side, "--force")
    one_line_error(rc, err, "is also this command's --data", "c.bin.json")
    assert side.read_bytes() == kept
    vocab = tmp_path / "r50k.tiktoken"
    vocab.write_text("not really a vocabulary")
    rc, err = cli("prepare", sentences, "--tokenizer", "gpt2", "--tokenizer-file", vocab, "--out", vocab, "--force")
    one_line_error(rc, err, "is also this command's --tokenizer-file")
    peft = tmp_path / "peft"
    peft.mkdir()
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        (peft / name).write_text("{}")
    rc, err = cli("inspect", "--model", tmp_path / "m.tinygpt", "--adapters", peft, "--prompt", "To",
                  "--out", peft / "adapter_config.json", "--force")
    one_line_error(rc, err, "is also this command's --adapters", "adapter_config.json")
    assert (peft / "adapter_config.json").read_text() == "{}"
    made = []
    for _ in range(2):
        rc, err = cli("prepare", d, "--out", d / "corpus.bin")
        assert rc == 0, err
        made.append(json.loads((d / "corpus.bin.json").read_text())["tokens"])
    assert made[0] == made[1] == len((d / "a.txt").read_bytes()) + len(before), made


def test_export_replaces_only_its_own_files(tmp_path, saved):
    mine = tmp_path / "w.safetensors"
    notes = tmp_path / "notes.safetensors"
    notes.write_text("not weights")
    rc, err = cli("export", "--model", saved, "--format", "safetensors", notes)
    one_line_error(rc, err, "not a safetensors file written by tinygpt", "--force")
    assert notes.read_text() == "not weights"
    for _ in range(2):  # the second replaces the first: it is ours
        rc, err = cli("export", "--model", saved, "--format", "safetensors", mine)
        assert rc == 0, err
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text('{"mine": true}')
    rc, err = cli("export", "--model", saved, "--format", "hf", hf)
    one_line_error(rc, err, "config.json exists and is not a Hugging Face config written by tinygpt")
    assert json.loads((hf / "config.json").read_text()) == {"mine": True}


@pytest.mark.parametrize("mask", [0o022, 0o027])
def test_outputs_honour_the_umask(tmp_path, sentences, mask):
    """Every output is created as open() and mkdir() would create it under the umask (the
    temporary files they are renamed from were 0600 and 0700 whatever the umask); a file replaced
    keeps the mode it had."""
    old = os.umask(mask)
    try:
        out, log, tokens, hf = tmp_path / "m.tinygpt", tmp_path / "m.jsonl", tmp_path / "c.bin", tmp_path / "hf"
        assert train(sentences, out, "--log", log)[0] == 0
        assert cli("prepare", sentences, "--out", tokens)[0] == 0
        assert cli("export", "--model", out, "--format", "hf", hf)[0] == 0
        mode = lambda p: oct(p.stat().st_mode & 0o777)
        files = [out, out.with_suffix(".loss.png"), log, tokens, tokens.with_name(tokens.name + ".json"),
                 hf / "config.json", hf / "model.safetensors"]
        got = {p.name: mode(p) for p in files if p.exists()}
        print(f"umask {oct(mask)}:", got, "hf/:", mode(hf))
        assert len(got) == len(files), got
        assert set(got.values()) == {oct(0o666 & ~mask)} and mode(hf) == oct(0o777 & ~mask)
        out.chmod(0o600)                        # replaced: the user's mode stays
        assert train(sentences, out, "--force")[0] == 0
        assert mode(out) == oct(0o600)
    finally:
        os.umask(old)


def test_resume_without_out_writes_back_to_the_resumed_file(tmp_path, sentences, saved):
    (tmp_path / "runs").mkdir()
    bystander = tmp_path / "runs" / "tiny.tinygpt"
    bystander.write_bytes(saved.read_bytes())
    r = subprocess.run([sys.executable, "-m", "tinygpt", "train", "--resume", str(saved), "--quiet", "--data",
                        str(sentences), "--steps", "6", "--eval-every", "0"], cwd=tmp_path, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert ckpt.load(saved).step == 6 and ckpt.load(bystander).step == 4


def test_long_names(tmp_path, sentences):
    """A legal 248-byte name trains and saves (the temporary name is short); the plot's derived
    name stays under the limit; a name over the limit is refused before the first step."""
    out = tmp_path / ("m" * 240 + ".tinygpt")
    rc, err = train(sentences, out)
    assert rc == 0, err
    assert ckpt.load(out).step == 3
    pngs = list(tmp_path.glob("*.loss.png"))
    assert len(pngs) == 1 and len(pngs[0].name) <= 255
    rc, err = train(sentences, tmp_path / ("m" * 300 + ".tinygpt"))
    one_line_error(rc, err, "over this file system's limit")
    assert rc == 2


def test_unwritable_output_is_refused_before_the_first_step(tmp_path, sentences):
    blocker = tmp_path / "file.txt"
    blocker.write_text("x")
    t0 = time.time()
    rc, err = train(sentences, blocker / "m.tinygpt", steps=100000)
    one_line_error(rc, err, "cannot write in")
    assert rc == 2 and time.time() - t0 < 60 and not any("step" in l for l in err)


# ---- 2. a finished run is never lost ---------------------------------------------------------------
def test_full_disk_at_the_final_save_puts_the_model_elsewhere(tmp_path, sentences, tmpfs):
    r = subprocess.run([sys.executable, "-m", "tinygpt", "train", *TINY, "--data", str(sentences), "--steps", "3",
                        "--eval-every", "0", "--out", str(tmpfs / "m.tinygpt")], cwd=tmp_path,
                       capture_output=True, text=True, timeout=300)
    err = [l for l in r.stderr.splitlines() if "XDG" not in l and l.strip()]
    one_line_error(r.returncode, err, "No space left on device", "saved to", "instead")
    rescued = Path(err[-1].split("saved to ")[1].split(" instead")[0])
    assert rescued.parent == tmp_path and ckpt.load(rescued).step == 3
    assert not list(tmpfs.glob(".tinygpt-*"))


def test_full_disk_for_the_log_warns_and_the_run_goes_on(tmp_path, sentences, tmpfs):
    (tmpfs / "filler").write_bytes(b"\0" * (256 * 1024 - 8192))
    rc, err = train(sentences, tmp_path / "m.tinygpt", "--log", tmpfs / "l.jsonl", "--log-every", 1, steps=120)
    assert rc == 0, err
    assert sum("warning: could not write the log" in l for l in err) == 1
    assert ckpt.load(tmp_path / "m.tinygpt").step == 120


def test_full_disk_for_tensorboard_warns_once_without_a_traceback(tmp_path, sentences, tmpfs):
    """tensorboardX writes from a thread of its own and flushes at exit: its full disk is said once,
    the run goes on and ends 0, and neither its thread nor its exit hook prints a traceback."""
    (tmpfs / "filler").write_bytes(b"\0" * (256 * 1024 - 8192))
    rc, err = train(sentences, tmp_path / "m.tinygpt", "--tensorboard", tmpfs / "tb", "--log-every", 1, steps=60)
    assert rc == 0, err
    assert sum("warning: could not write the TensorBoard log (No space left on device)" in l for l in err) == 1, err
    assert not any("Traceback" in l or "Exception" in l for l in err), err
    assert ckpt.load(tmp_path / "m.tinygpt").step == 60


def test_a_peft_export_onto_a_full_disk_leaves_nothing(tmp_path, sentences, tmpfs):
    """A LoRA run's adapters as PEFT's directory, onto a full disk: one line, no half directory."""
    base, ft = tmp_path / "m.tinygpt", tmp_path / "ft.tinygpt"
    assert train(sentences, base, steps=2)[0] == 0
    assert train(sentences, ft, "--resume", base, "--lora", 64, steps=2)[0] == 0
    (tmpfs / "filler").write_bytes(b"\0" * (200 << 10))
    rc, err = cli("export", "--model", ft, "--format", "peft", tmpfs / "peft")
    assert rc == 1 and len(err) == 1 and "No space left on device" in err[0] and "Traceback" not in err[0], err
    assert sorted(p.name for p in tmpfs.iterdir()) == ["filler"]


def test_prepare_stopped_by_sigterm_leaves_nothing(tmp_path, sentences, monkeypatch, capsys):
    """SIGTERM (or Ctrl-C) in the middle of prepare: its temporary file is removed, the output
    stays as it was, exit 143, and the message speaks of what prepare writes (a token file), not
    of a checkpoint."""
    from tinygpt.files import tokenfile
    pieces = tokenfile._pieces

    def killed_midway(*a, **k):
        for i, ids in enumerate(pieces(*a, **k)):
            if i == 1:
                os.kill(os.getpid(), signal.SIGTERM)
            yield ids
    monkeypatch.setattr(tokenfile, "CHUNK", 1024)         # many pieces
    monkeypatch.setattr(tokenfile, "_pieces", killed_midway)
    out = tmp_path / "c.bin"
    assert main(["prepare", str(sentences), "--out", str(out), "--quiet"]) == 143
    err = capsys.readouterr().err
    assert "prepare stopped by SIGTERM; nothing was written" in err and "checkpoint" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.txt"]
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_prepare_onto_a_full_disk_blames_the_output(tmp_path, sentences, tmpfs):
    """No space for the token file: the error names the output and says to free space (it said the
    input "cannot be read (No space left on device)"); nothing is left behind."""
    big = tmp_path / "big.txt"
    big.write_text("word " * 200_000)
    rc, err = cli("prepare", big, "--out", tmpfs / "c.bin", "--quiet")
    one_line_error(rc, err, "c.bin", "No space left on device", "free some space")
    assert "cannot be read" not in err[-1] and "big.txt" not in err[-1]
    assert list(tmpfs.iterdir()) == []


def test_a_failing_plot_never_kills_a_run(tmp_path, sentences, monkeypatch, capsys):
    import tinygpt.run.train as T

    def broken(*_):
        raise RuntimeError("no fonts")
    monkeypatch.setattr(T, "plot_losses", broken)
    assert main(["train", *TINY, "--data", str(sentences), "--steps", "3", "--out", str(tmp_path / "m.tinygpt")]) == 0
    assert "could not write the loss-curve plot (no fonts)" in capsys.readouterr().err


def _run_and_signal(tmp_path, sentences, sig, when_lines, steps):
    out, log = tmp_path / "m.tinygpt", tmp_path / "l.jsonl"
    proc = subprocess.Popen([sys.executable, "-m", "tinygpt", "train", *TINY, "--data", str(sentences),
                             "--steps", str(steps), "--eval-every", "0", "--log-every", "1", "--log", str(log),
                             "--out", str(out)], stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while time.time() < deadline and (not log.exists() or len(log.read_text().splitlines()) < when_lines):
        time.sleep(0.01)
    proc.send_signal(sig)
    _, stderr = proc.communicate(timeout=120)
    return proc.returncode, stderr, out


def test_sigterm_saves_like_ctrl_c(tmp_path, sentences):
    rc, stderr, out = _run_and_signal(tmp_path, sentences, signal.SIGTERM, 3, 100000)
    assert rc == 143 and "Traceback" not in stderr and "SIGTERM" in stderr, stderr
    assert ckpt.load(out).step >= 3


@pytest.mark.parametrize("trial", range(3))
def test_ctrl_c_after_the_last_step_still_saves(tmp_path, sentences, trial):
    """The signal lands between the last step's log line and the end of the run: exit 0 or 130,
    and the checkpoint holds the last step either way."""
    steps = 6
    rc, stderr, out = _run_and_signal(tmp_path, sentences, signal.SIGINT, steps, steps)
    assert rc in (0, 130) and "Traceback" not in stderr, stderr
    assert ckpt.load(out).step == steps


# ---- 3. a checkpoint saved is a good one -------------------------------------------------------------
def test_divergence_is_never_saved_over_a_good_checkpoint(tmp_path, sentences, saved):
    before = saved.read_bytes()
    rc, err = cli("train", "--resume", saved, "--quiet", "--data", sentences, "--steps", 40, "--eval-every", 0,
                  "--lr", "1e4", "--rewarm", "--save-every", 1, "--log-every", 100)
    one_line_error(rc, err, "not saved", "keeps the checkpoint of step 4", "lower --lr")
    assert rc == 3 and saved.read_bytes() == before


def test_unhealthy_rules():
    from tinygpt.run.safety import unhealthy
    assert unhealthy(float("nan"), 1.0, None, 256) and unhealthy(3.0, float("inf"), None, 256)
    assert unhealthy(20.0, 1.0, None, 256)            # > 3 ln 256 = 16.6
    assert unhealthy(6.0, 1.0, 1.5, 256)              # worse than guessing, 4x the best
    assert unhealthy(5.0, 1.0, 1.5, 256) is None      # bad, but better than guessing
    assert unhealthy(10.9, 1.0, None, 50257) is None  # ln 50257 = 10.8 at init


# ---- 4. inputs bounded before they are read --------------------------------------------------------
def test_data_that_is_not_a_regular_file(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    for path, kind in ((fifo, "is a FIFO"), ("/dev/zero", "is a device"), ("/dev/urandom", "is a device")):
        rc, err = cli("train", *TINY, "--steps", 1, "--data", path, "--out", tmp_path / "o.tinygpt", timeout=60)
        one_line_error(rc, err, kind)
    rc, err = cli("eval", "--model", fifo, timeout=60)
    one_line_error(rc, err, "is a FIFO")


def test_data_over_the_memory_bound_is_refused_unread(tmp_path, monkeypatch, capsys):
    import tinygpt.files.data as D
    monkeypatch.setattr(D, "max_corpus_bytes", lambda: 1000)
    p = tmp_path / "big.txt"
    p.write_text("x" * 5000)
    assert main(["train", *TINY, "--steps", "1", "--data", str(p), "--out", str(tmp_path / "o.tinygpt")]) == 1
    assert "5,000 bytes is more than the 1,000 this can read" in capsys.readouterr().err


def test_a_bounded_read_allocates_what_the_file_holds(tmp_path):
    """A read bounded at 4 GiB of a 22 KB file runs under a 1 GiB address-space limit (f.read(bound)
    reserved the bound first: MemoryError), still sees a file that grows while read, and _head
    of a short file is short."""
    f = tmp_path / "small.bin"
    f.write_bytes(b"x" * 22_000)
    code = ("import resource, sys; resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30)); "
            "from tinygpt.core.fs import read_user_file; "
            f"d = read_user_file({str(f)!r}, ValueError, 'f', 'a file', 4 << 30); print(len(d))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "22000", r.stderr[-2000:]
    from tinygpt.core.fs import read_most
    with open(f, "rb") as h:
        h.read(1000)
        with open(f, "ab") as w:                 # appended to while open: all of it is read
            w.write(b"y" * 5000)
        assert read_most(h, 1 << 30) == b"x" * 21_000 + b"y" * 5000
    with open(f, "rb") as h:
        assert len(read_most(h, 10)) == 10


def test_crafted_header_is_refused_by_arithmetic(tmp_path, saved):
    good = saved.read_bytes()
    hlen = int.from_bytes(good[8:12], "little")
    header = json.loads(good[12:12 + hlen])
    header["config"]["layers"] = 1e8
    hb = json.dumps(header).encode()
    p = tmp_path / "crafted.tinygpt"
    p.write_bytes(good[:8] + len(hb).to_bytes(4, "little") + hb + good[12 + hlen:])
    t0 = time.time()
    rc, err = cli("eval", "--model", p)
    one_line_error(rc, err, "layers 100,000,000 is more than this tinygpt allows")
    assert time.time() - t0 < 30


def test_another_writers_nan_is_kept_as_null_and_the_run_saves(tmp_path, sentences, saved):
    """A header field of another writer holding NaN or Infinity (JSON has neither; Python's json
    writes them) is read as null, as TinyGPT's JSON.stringify writes it: the resumed run trains
    and saves (it trained, then failed the save, its work lost), the field kept as null."""
    good = saved.read_bytes()
    hlen = int.from_bytes(good[8:12], "little")
    header = json.loads(good[12:12 + hlen])
    header["otherWriter"] = {"score": float("nan"), "range": [float("-inf"), 1.5]}
    hb = json.dumps(header).encode()                      # allow_nan: NaN, -Infinity as bare words
    assert b"NaN" in hb and b"-Infinity" in hb
    p = tmp_path / "other.tinygpt"
    p.write_bytes(good[:8] + len(hb).to_bytes(4, "little") + hb + good[12 + hlen:])
    rc, err = cli("train", "--resume", p, "--data", sentences, "--steps", 6, "--eval-every", 0, "--quiet",
                  "--sample-tokens", 0)
    assert rc == 0, err
    back = ckpt.load(p)
    assert back.step == 6 and back.header["otherWriter"] == {"score": None, "range": [None, 1.5]}


def test_model_flags_too_big_are_refused_by_arithmetic(tmp_path, sentences):
    for args, needle in ((["--layers", 10 ** 8], "--layers 100,000,000 is more than"),
                         (["--layers", 4000, "--d-model", 8192, "--heads", 64], "parameters, more than")):
        rc, err = cli("train", *TINY, "--steps", 1, "--data", sentences, *args, "--out", tmp_path / "o.tinygpt",
                      timeout=60)
        one_line_error(rc, err, needle)
        assert rc == 2


def test_a_path_inside_a_checkpoint_is_never_opened(tmp_path, sentences):
    """The checkpoint records its --data; resuming or evaluating without --data asks for it
    (the recorded path is a FIFO here: opening it would hang)."""
    out = tmp_path / "m.tinygpt"
    rc, err = train(sentences, out)
    assert rc == 0, err
    sentences.unlink()
    os.mkfifo(sentences)
    rc, err = cli("eval", "--model", out, timeout=60)
    one_line_error(rc, err, f"was trained on {sentences}", "--data")
    rc, err = cli("train", "--resume", out, "--steps", 5, "--quiet", timeout=60)
    one_line_error(rc, err, f"was trained on {sentences}", "--data")


def test_tokenizer_that_cannot_produce_the_vocabulary(tmp_path):
    cfg = Config(layers=1, d_model=8, heads=2, ctx=4, batch=2, vocab=300)
    p = tmp_path / "v.tinygpt"
    ckpt.save(p, ckpt.Checkpoint(cfg, init_params(cfg), extra={"tokenizer": "byte"}))
    rc, err = cli("eval", "--model", p)
    one_line_error(rc, err, "tokenizer 'byte' cannot produce its vocabulary of 300")


# ---- 5. caches never brick the tool ------------------------------------------------------------------
@pytest.mark.parametrize("bad", [{"matmul_wx": 0}, {"online_block": [0, 32]}, {"matmul_wx": "8"},
                                 {"online_variant": 3}, "a number", None])
def test_bad_tuning_cache_warns_and_runs(tmp_path, sentences, bad, monkeypatch, capsys):
    """In this process (the cache is read afresh by every plan): a process a run costs ~2.5 s."""
    from tinygpt.device.gpu import GPU
    cache = tmp_path / "cache"
    cache.mkdir()
    key = GPU().key
    (cache / "tuning.json").write_text(json.dumps({key: bad}) if bad is not None else "{not json")
    monkeypatch.setenv("TINYGPT_CACHE_DIR", str(cache))
    line = ["train", *TINY, "--data", sentences, "--steps", 2, "--eval-every", 0, "--sample-tokens", 0,
            "--out", tmp_path / "m.tinygpt"]
    rc, err = in_process(*line)
    assert rc == 0, err
    warnings = [l for l in err if "warning" in l]
    assert len(warnings) == 1 and str(cache / "tuning.json") in warnings[0] and "tinygpt tune --reset" in warnings[0]
    assert main(["tune", "--reset"]) == 0 and "remove" in capsys.readouterr().out
    rc, err = in_process(*line)
    assert rc == 0 and not [l for l in err if "warning" in l], err


# ---- 6. messages and codes ----------------------------------------------------------------------------
def test_bad_flag_values_exit_2(tmp_path, sentences):
    for args in (["--seed", "-1"], ["--seed", str(2 ** 70)], ["--warmup", "x"], ["--min-lr", "inf"]):
        rc, err = cli("train", *TINY, "--steps", 1, "--data", sentences, *args, "--out", tmp_path / "o.tinygpt")
        one_line_error(rc, err, args[0])
        assert rc == 2


def test_the_file_records_the_whole_split_loss_and_eval_every(tmp_path, sentences):
    """finalLoss.val (and bestVal, where lowest) hold the whole-split loss the run prints and
    eval computes, not the 64-window estimate; the header's config carries evalEvery, which
    upstream's continue loop counts its next evaluation from (NaN without it)."""
    out = tmp_path / "m.tinygpt"
    rc, err = train(sentences, out, "--eval-every", 2, steps=4)
    assert rc == 0, err
    h = ckpt.load(out).header
    whole = json.loads(subprocess.run([sys.executable, "-m", "tinygpt", "eval", "--model", str(out), "--data",
                                       str(sentences), "--json"], capture_output=True, text=True).stdout)["loss"]
    print("finalLoss", h["finalLoss"], "bestVal", h["bestVal"], "eval", whole)
    assert h["finalLoss"]["step"] == 4 and abs(h["finalLoss"]["val"] - whole) < 1e-5
    assert h["config"]["evalEvery"] == 2
    assert h["bestVal"]["loss"] <= h["finalLoss"]["val"]


def test_non_finite_weights_are_refused_before_anything_runs(tmp_path, sentences, saved):
    """A file whose weights hold NaN or inf (a diverged run another tool saved): eval, sample,
    inspect and train --resume say so in one line, naming the tensor (eval printed nan, sample
    failed in Python's bytes())."""
    ck = ckpt.load(saved)
    ck.params["h0.Wq"][0, :3] = [np.nan, np.inf, -np.inf]
    p = tmp_path / "nan.tinygpt"
    ckpt.save(p, ck)
    for args in (("eval", "--model", p, "--data", sentences), ("sample", "--model", p, "--tokens", 5),
                 ("inspect", "--model", p, "--prompt", "It", "--out", tmp_path / "i.png"),
                 ("train", "--resume", p, "--data", sentences, "--steps", 8)):
        rc, err = cli(*args)
        one_line_error(rc, err, "h0.Wq hold 3 NaN or infinite values", "use an earlier checkpoint")
    assert not (tmp_path / "i.png").exists()


def test_eval_of_an_exploded_model_prints_what_it_can(tmp_path, sentences, saved, capsys):
    ck = ckpt.load(saved)
    ck.params["tok_emb"] = ck.params["tok_emb"] * 1e4   # logits of ~1e4: a loss too large for exp
    p = tmp_path / "big.tinygpt"
    ckpt.save(p, ck)
    assert main(["eval", "--model", str(p), "--data", str(sentences)]) == 0
    out = capsys.readouterr().out
    assert "perplexity too large to show" in out
    assert main(["eval", "--model", str(p), "--data", str(sentences), "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["perplexity"] is None and r["loss"] > 700 and np.isfinite(r["loss"])


def test_a_runs_outputs_are_distinct_from_each_other(tmp_path, sentences):
    """Issue 47: the checkpoint, its plot, the log, the best checkpoint and the TensorBoard directory
    are claimed before the first step and none may be another: each pair that collides is refused
    in one line, and nothing is made (the TensorBoard directory took the checkpoint's name before)."""
    out = tmp_path / "a.tinygpt"
    for extra, needle in ((["--log", tmp_path / "a.loss.png"], "loss-curve plot"),
                          (["--keep-best", "--log", tmp_path / "a.best.tinygpt"], "log is written there"),
                          (["--tensorboard", out], "checkpoint is written there"),
                          (["--tensorboard", tmp_path / "a.loss.png"], "loss-curve plot is written there")):
        rc, err = in_process("train", *TINY, "--data", sentences, "--steps", 1, "--eval-every", 0, "--out", out, *extra)
        print(err[-1])
        one_line_error(rc, err, needle)
        assert not out.exists() and not (tmp_path / "a.loss.png").exists()
