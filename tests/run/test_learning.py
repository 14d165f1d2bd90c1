"""The first run: the built-in corpus, the schedule and its defaults, the time budget on a fake
clock, the end-of-run report, and `tinygpt inspect` against the float64 reference."""
import io
import json
import math
from pathlib import Path

import numpy as np
import pytest

from conftest import check
from tinygpt.files import checkpoint as ckpt
from tinygpt.reference import kernels as R
from tinygpt.reference import attention as RA
from tinygpt.commands.cli import main
from tinygpt.core.config import TINYGPT_LR, TRAIN_DEFAULTS, preset
from tinygpt.model.optimizers import DEFAULT as DEFAULT_OPTIMIZER
from tinygpt.model.optimizers import schedule as train_defaults
from tinygpt.files.data import Dataset, builtin_corpus, read_corpus
from tinygpt.tokenizers import ByteTokenizer
from tinygpt.core.errors import UsageError
from tinygpt.model.gpt import Model
from tinygpt.run.options import TrainOptions
from tinygpt.run.schedule import Schedule, resolve
from tinygpt.reference import gpt as RG
from tinygpt.core.init import init_params

TINY = dict(preset="tiny", batch=4, ctx=16, quiet=True)


# ---- the built-in corpus ------------------------------------------------------------------------
def test_builtin_corpus_is_text_that_ships_with_python_and_trains(tmp_path, gpu):
    raw = builtin_corpus()
    text = raw.decode("utf-8")                       # valid UTF-8, whole
    assert len(raw) > 400_000 and raw == builtin_corpus()
    assert "def " in text and "class" in text        # Python's documentation, not some other text
    got, name = read_corpus(None)
    assert got == raw and name.startswith("built-in")
    ds = Dataset(ByteTokenizer().encode(raw), 64)
    assert len(ds.val) == len(raw) - int(0.9 * len(raw))
    from tinygpt.run.train import train
    s = train(TrainOptions(**TINY, steps=3, eval_every=0, sample_tokens=0, out=str(tmp_path / "b.tinygpt")), gpu,
              out=io.StringIO(), err=io.StringIO())
    assert s["steps"] == 3 and ckpt.load(tmp_path / "b.tinygpt").extra["data"] is None


# ---- the schedule -------------------------------------------------------------------------------
def test_default_schedule_warms_up_then_decays_to_the_floor():
    d = TRAIN_DEFAULTS["small"]
    s = resolve(TrainOptions())
    assert (s.kind, s.lr, s.warmup, s.min_lr) == ("cosine", d.lr, d.warmup, d.min_lr)
    s.total = 2000
    lrs = [s.at(i) for i in range(s.total)]
    assert lrs[0] == pytest.approx(d.lr / d.warmup) and lrs[d.warmup - 1] == pytest.approx(d.lr)
    assert all(a >= b for a, b in zip(lrs[d.warmup:], lrs[d.warmup + 1:]))      # never rises after warm-up
    assert lrs[-1] == pytest.approx(d.min_lr, rel=1e-3)
    s.total = 50                                                                  # warm-up: at most a tenth
    assert s.at(4) == pytest.approx(d.lr) and s.at(0) == pytest.approx(d.lr / 5)
    for name in TRAIN_DEFAULTS:                                                   # every preset has its own
        r = resolve(TrainOptions(preset=name, optimizer="adamw"))
        assert r.lr == TRAIN_DEFAULTS[name].lr and r.min_lr < r.lr
        assert resolve(TrainOptions(preset=name)).lr == train_defaults(name, DEFAULT_OPTIMIZER).lr
    # an optimizer's own where its sweep found one (Muon on tiny), else AdamW's
    assert (DEFAULT_OPTIMIZER, resolve(TrainOptions(preset="tiny")).lr) == ("muon", 2e-2)
    assert resolve(TrainOptions(preset="small", optimizer="muon")).lr == TRAIN_DEFAULTS["small"].lr


def test_constant_schedule_is_tinygpts_and_flags_override():
    c = resolve(TrainOptions(schedule="constant"))
    c.total = 100
    assert {c.at(i) for i in range(100)} == {TINYGPT_LR}
    assert resolve(TrainOptions(schedule="constant", lr=1e-3)).at(5) == 1e-3
    s = resolve(TrainOptions(lr=1e-2, warmup=7, min_lr=0.0))
    assert (s.lr, s.warmup, s.min_lr) == (1e-2, 7, 0.0)
    with pytest.raises(UsageError, match="warmup"):
        resolve(TrainOptions(schedule="constant", warmup=10))
    with pytest.raises(UsageError, match="min-lr 0.01 is above"):
        resolve(TrainOptions(lr=1e-3, min_lr=1e-2))


def test_resumed_schedule_comes_from_the_file():
    saved = Schedule("cosine", 2e-3, 30, 1e-5, 900).as_dict()
    s = resolve(TrainOptions(), saved, file_lr=2e-3)
    assert (s.kind, s.lr, s.warmup, s.min_lr, s.total) == ("cosine", 2e-3, 30, 1e-5, 900)
    old = resolve(TrainOptions(), None, file_lr=3e-4)                             # TinyGPT's files: constant
    assert (old.kind, old.lr) == ("constant", 3e-4)
    bad = resolve(TrainOptions(), {"kind": "cosine", "lr": "nan"}, file_lr=5e-4)  # malformed: the file's lr
    assert (bad.kind, bad.lr) == ("constant", 5e-4)


def test_extending_a_run_keeps_the_past_of_its_schedule():
    """Past the planned end the extra steps stay at the final lr (the decay is held at the planned
    end, never stretched over the new one); --rewarm restarts warm-up and decay at the resumed step;
    an end before the planned one ends the decay there."""
    planned = Schedule("cosine", 1e-2, 20, 1e-4, 200)
    s = Schedule(**planned.as_dict())
    held = s.resume_at(200, rewarm=False)
    s.end_at(300, held)
    assert held == 200 and s.total == 200
    assert [s.at(i) for i in range(200)] == [planned.at(i) for i in range(200)]
    assert {s.at(i) for i in range(200, 300)} == {1e-4}
    assert "steps 201 to 300 run at the schedule's final lr 0.0001" in s.extension(200, 300, held)
    mid = Schedule(**planned.as_dict())                       # resumed mid-run, extended past the end
    mid.end_at(400, mid.resume_at(150, rewarm=False))
    assert [mid.at(i) for i in range(150, 200)] == [planned.at(i) for i in range(150, 200)] and mid.at(399) == 1e-4
    short = Schedule(**planned.as_dict())                     # ended early: the decay ends there
    short.end_at(120, short.resume_at(100, rewarm=False))
    assert short.total == 120 and short.at(120) == 1e-4 and short.at(119) < 2e-4
    assert short.extension(100, 120, 200) is None
    r = Schedule(**planned.as_dict())
    r.end_at(400, r.resume_at(200, rewarm=True))
    assert (r.start, r.total) == (200, 400)
    assert r.at(200) == pytest.approx(1e-2 / 20) and r.at(219) == pytest.approx(1e-2) and r.at(399) < 2e-4
    assert "restarted at step 200" in r.describe()
    back = Schedule.from_dict(r.as_dict())                     # the restart is saved, and resumed as saved
    assert (back.start, back.total) == (200, 400) and back.at(250) == r.at(250)


def test_resume_past_the_planned_end_continues_at_the_final_lr(tmp_path, corpus, capsys):
    """tinygpt train --resume of a finished run with more --steps: the lr does not jump back up
    (it went from the run's final lr to a stretched cosine's), the banner says what happens, and
    --rewarm restarts the schedule instead."""
    f, log = tmp_path / "a.tinygpt", tmp_path / "a.jsonl"
    common = ["--quiet", "--eval-every", "0", "--sample-tokens", "0", "--log-every", "1"]
    assert main(["train", "--preset", "tiny", "--batch", "2", "--ctx", "16", "--data", str(corpus), "--steps", "20",
                 "--warmup", "2", "--out", str(f), "--log", str(log), *common]) == 0
    lrs = lambda p: [r["lr"] for r in map(json.loads, Path(p).read_text().splitlines())]
    final = lrs(log)[-1]
    assert final < 1e-3                          # the last step, a little above the floor
    capsys.readouterr()
    g, glog = tmp_path / "b.tinygpt", tmp_path / "b.jsonl"
    assert main(["train", "--resume", str(f), "--data", str(corpus), "--steps", "25", "--out", str(g), "--log", str(glog),
                 *common]) == 0
    err = capsys.readouterr().err
    assert lrs(glog) == [ckpt.load(f).extra["schedule"]["min_lr"]] * 5, lrs(glog)
    assert "steps 21 to 25 run at the schedule's final lr" in err and "--rewarm" in err
    h, hlog = tmp_path / "c.tinygpt", tmp_path / "c.jsonl"
    assert main(["train", "--resume", str(f), "--data", str(corpus), "--steps", "40", "--rewarm", "--out", str(h),
                 "--log", str(hlog), *common]) == 0
    again = lrs(hlog)
    assert again[1] == pytest.approx(ckpt.load(f).extra["schedule"]["lr"]) and again[-1] < again[1] / 10
    assert ckpt.load(h).extra["schedule"]["start"] == 20
    assert main(["train", "--preset", "tiny", "--data", str(corpus), "--steps", "3", "--rewarm", *common]) == 2
    assert "--rewarm restarts a resumed run's schedule" in capsys.readouterr().err
    assert main(["train", "--resume", str(f), "--data", str(corpus), "--steps", "30", "--lr", "1e-3",
                 "--out", str(tmp_path / "d.tinygpt"), *common]) == 2      # an lr past the end would do nothing
    assert "add --rewarm" in capsys.readouterr().err


def test_steps_and_minutes_together_are_refused(corpus, capsys):
    rc = main(["train", "--preset", "tiny", "--quiet", "--data", str(corpus), "--steps", "5", "--minutes", "1"])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert rc == 2 and "--steps" in err and "--minutes" in err


# ---- the time budget ----------------------------------------------------------------------------
class FakeClock:
    """Time passes only when the model works (and not while files are written)."""

    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def test_minutes_ends_on_time_on_a_fake_clock(tmp_path, corpus, gpu, monkeypatch):
    from tinygpt.run.train import train
    clock = FakeClock()
    from tinygpt.model.decode import Decoder
    step, rows, generate = Model.step, Model.row_losses, Decoder.generate

    def timed(fn, cost):
        def run(self, *a, **k):
            clock.t += cost
            return fn(self, *a, **k)
        return run
    monkeypatch.setattr(Model, "step", timed(step, 0.25))
    monkeypatch.setattr(Model, "row_losses", timed(rows, 0.004))
    monkeypatch.setattr(Decoder, "generate", lambda self, ids, n, *a: (clock.__setattr__("t", clock.t + 0.002 * n),
                                                                      generate(self, ids, n, *a))[1])
    budget = 60.0                                              # one minute of fake time
    log = tmp_path / "l.jsonl"
    o = TrainOptions(**TINY, data=str(corpus), minutes=budget / 60, eval_every=50, log_every=5, sample_tokens=20,
                     out=str(tmp_path / "m.tinygpt"), log=str(log))
    s = train(o, gpu, out=io.StringIO(), err=io.StringIO(), clock=clock)
    print(f"budget {budget} s: ended after {s['seconds']:.3f} s, {s['steps']} steps")
    assert abs(s["seconds"] - budget) <= 0.02 * budget             # on time within 2 %
    assert 200 < s["steps"] < 240                                  # 0.25 s a step
    sched = ckpt.load(tmp_path / "m.tinygpt").extra["schedule"]
    assert sched["total"] == s["steps"]                            # the decay was fitted to the run's end
    last = [r for r in map(json.loads, log.read_text().splitlines()) if "train_loss" in r][-1]    # the last step's
    assert last["step"] == s["steps"] and last["lr"] == pytest.approx(TRAIN_DEFAULTS["tiny"].min_lr, rel=0.05)


# ---- the end of a run ---------------------------------------------------------------------------
def test_end_of_run_shows_bits_and_a_reproducible_sample(tmp_path, corpus, gpu):
    from tinygpt.run.infer import evaluate
    from tinygpt.run.options import EvalOptions
    from tinygpt.run.train import train
    outs = []
    for name in ("a", "b"):
        out = io.StringIO()
        s = train(TrainOptions(**TINY, data=str(corpus), steps=40, eval_every=20, sample_tokens=60,
                               out=str(tmp_path / f"{name}.tinygpt")), gpu, out=out, err=io.StringIO())
        outs.append((out.getvalue(), s))
    (text, s), (text2, _) = outs
    assert text.split("greedy sample")[1] == text2.split("greedy sample")[1]   # same seed, same two samples
    greedy, sampled = s["samples"]
    assert greedy != sampled and greedy.startswith("The ") and len(greedy) == 64   # "The " + 60 tokens (ASCII)
    e = evaluate(EvalOptions(model=str(tmp_path / "a.tinygpt"), data=str(corpus)), gpu)
    assert s["final_val_loss"] == pytest.approx(e["loss"], abs=1e-6) and s["val_windows"] == e["windows"]
    assert f"{e['loss']:.4f} nats = {e['loss'] / math.log(2):.3f} bits/byte" in text
    assert "temperature 0.8, top-k 40" in text


# ---- tinygpt inspect ----------------------------------------------------------------------------
def reference_inspection(params, cfg, ids):
    """float64: each layer's softmax weights [L, H, T, T] and each residual stream's lens probabilities."""
    p64 = {k: v.astype(np.float64) for k, v in params.items()}
    weights = []

    def attend(q, k, v, H):
        weights.append(RA.attn_softmax(RA.attn_scores(q, k, H))[0])
        return RA.attention_forward(q, k, v, H)
    x = np.asarray(ids)[None]
    _, _, cache = RG.forward(p64, cfg, x, x, attention=attend)
    streams = [c["x"] for c in cache["layers"]] + [cache["x_final"]]
    probs = []
    for s in streams:
        y = R.layernorm_forward(s, p64["ln_f_g"], p64["ln_f_b"])[0]
        z = R.matmul_abt(y, p64["tok_emb"])
        e = np.exp(z - z.max(1, keepdims=True))
        probs.append(e / e.sum(1, keepdims=True))
    return np.stack(weights), np.stack(probs)


@pytest.mark.kernel
@pytest.mark.parametrize("T, limit, vocab", [(11, None, 256), (1, None, 256), (201, 200_000, 256),
                                             (130, 13_000_000, 50257)])
def test_inspect_weights_are_the_reference_softmax(gpu, plan, monkeypatch, T, limit, vocab):
    """Odd T, T = 1, the binding limit forced low so that the heads split into chunks, and GPT-2's
    vocabulary with the limit forced low so that the lens logits [130, 50264] split into 3."""
    from tinygpt.commands.lens import Inspector
    from tinygpt.model.layout import logit_chunks
    cfg = preset("tiny", layers=2, d_model=24, heads=3, ctx=256, vocab=vocab)
    params = init_params(cfg)
    r = np.random.default_rng(3)
    for k in params:                                   # larger weights: attention far from uniform
        params[k] = (params[k] + r.standard_normal(params[k].shape) * 0.3).astype(np.float32)
    ids = r.integers(0, cfg.vocab, T)
    if limit:
        monkeypatch.setitem(gpu.limits, "max-storage-buffer-binding-size", limit)
    insp = Inspector(gpu, plan, cfg, T)
    if limit and vocab == 256:
        assert len(insp.model.att[0].weights()) == 3    # [201, 201] floats a head: one head a chunk
    if limit and vocab > 256:
        assert len(logit_chunks(T, insp.model.layout.VP, gpu.max_binding)) == 3 and len(insp.model.layout.logit_chunks) == 3
    ins = insp.run(params, ids)
    want_w, want_p = reference_inspection(params, cfg, ids)
    check(f"attention weights T={T}", ins.weights, want_w, atol=2e-6)
    check("rows sum to 1", ins.weights.sum(-1), np.ones((cfg.layers, cfg.heads, T)), atol=1e-5)
    assert np.all(ins.weights[..., np.triu_indices(T, 1)[0], np.triu_indices(T, 1)[1]] == 0)  # written zeros
    top = want_p.argmax(-1)
    check("lens top probability", ins.lens_prob, want_p.max(-1), atol=1e-5)
    srt = np.sort(want_p, -1)
    clear = srt[..., -1] - srt[..., -2] > 1e-4              # a near-tie may pick either: detect, don't ignore
    assert clear.mean() > 0.9 and np.array_equal(ins.lens_top[clear], top[clear])


def test_inspect_cli_writes_a_png_and_keeps_what_it_did_not_write(tmp_path, corpus, capsys):
    m = tmp_path / "m.tinygpt"
    assert main(["train", "--preset", "tiny", "--batch", "4", "--ctx", "16", "--quiet", "--data", str(corpus),
                 "--steps", "5", "--eval-every", "0", "--sample-tokens", "0", "--out", str(m)]) == 0
    capsys.readouterr()
    png = tmp_path / "a.png"
    assert main(["inspect", "--model", str(m), "--prompt", "ROMEO: thou art", "--out", str(png)]) == 0
    out = capsys.readouterr().out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and "layer 2" in out and "embed" in out
    foreign = tmp_path / "mine.png"
    foreign.write_bytes(b"\x89PNG\r\n\x1a\nsomeone else's")
    assert main(["inspect", "--model", str(m), "--prompt", "x", "--out", str(foreign)]) == 2
    assert foreign.read_bytes().endswith(b"someone else's") and "--force" in capsys.readouterr().err
    assert main(["inspect", "--model", str(m), "--prompt", "", "--out", str(png)]) == 2
    long_prompt = "to be or not to be " * 3                 # 57 tokens > ctx 16: the last 16 are shown
    assert main(["inspect", "--model", str(m), "--prompt", long_prompt, "--out", str(png)]) == 0
    assert "its last 16" in capsys.readouterr().err


# ---- gradient accumulation from the command line -------------------------------------------------
def test_grad_accum_gives_the_whole_batch_losses_and_resumes_mid_run(tmp_path, corpus):
    """--batch 4 --grad-accum 4 against --batch 16: the same windows, the same losses; and a run
    stopped at step 4 and resumed (the file remembers the accumulation) ends as the whole run."""
    common = ["train", "--preset", "tiny", "--ctx", "16", "--quiet", "--data", str(corpus), "--eval-every", "0",
              "--sample-tokens", "0", "--log-every", "1", "--schedule", "constant", "--lr", "3e-3"]
    logs = {}
    for name, extra in (("whole", ["--batch", "16", "--steps", "8"]),
                        ("accum", ["--batch", "4", "--grad-accum", "4", "--steps", "8"]),
                        ("part", ["--batch", "4", "--grad-accum", "4", "--steps", "4"])):
        assert main(common + extra + ["--out", str(tmp_path / f"{name}.tinygpt"),
                                      "--log", str(tmp_path / f"{name}.jsonl")]) == 0
    assert main(["train", "--resume", str(tmp_path / "part.tinygpt"), "--quiet", "--data", str(corpus),
                 "--eval-every", "0", "--sample-tokens", "0", "--log-every", "1", "--steps", "8",
                 "--log", str(tmp_path / "part.jsonl")]) == 0
    for name in ("whole", "accum", "part"):
        logs[name] = [json.loads(l)["train_loss"] for l in (tmp_path / f"{name}.jsonl").read_text().splitlines()]
    check("losses, 4 x 4 against 16", logs["accum"], logs["whole"], 1e-5)
    assert logs["part"] == logs["accum"]                      # resumed: bit for bit
    assert ckpt.load(tmp_path / "part.tinygpt").extra["gradAccum"] == 4
