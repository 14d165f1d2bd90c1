"""The Python API (tinygpt.GPT, docs/api.md) as a user meets it: `import tinygpt` and nothing else
for the model; the float64 reference, the CLI and the file format only to check what it returns."""
import ast
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import tinygpt

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def text(tmp_path_factory):
    """Some 40 kB of English, written by a test (the project ships no corpus of its own)."""
    p = tmp_path_factory.mktemp("api") / "text.txt"
    words = "the king and queen of a small country met at night to speak of war and peace".split()
    rng = np.random.default_rng(0)
    p.write_text("\n".join(" ".join(rng.choice(words, 12)) for _ in range(600)))
    return str(p)


@pytest.fixture(scope="module")
def gpt():
    return tinygpt.GPT.from_preset("tiny", layers=1, seed=5)


def test_names_are_exported():
    for name in ("GPT", "Trainer", "Config", "PRESETS", "get_tokenizer", "TinyGPTError", "UsageError",
                 "CheckpointError", "DataError", "OutputError", "TrainingStopped", "__version__"):
        assert hasattr(tinygpt, name), name


def test_logits_of_any_length_and_batch_against_float64(gpt):
    from tinygpt.reference.gpt import forward
    cfg = gpt.config
    rng = np.random.default_rng(1)
    full = rng.integers(0, cfg.vocab, (cfg.batch + 3, cfg.ctx))      # more windows than the model's batch
    ref = forward({k: v.astype(np.float64) for k, v in gpt.params().items()}, cfg, full)
    got = gpt.logits(full)
    err = np.abs(got - ref).max()
    print(f"\nlogits [{cfg.batch + 3}, {cfg.ctx}] against float64: max error {err:.2e}")
    assert got.shape == ref.shape and err < 2e-5
    for T in (1, 7, cfg.ctx - 1):                   # shorter windows: the prefix of the full ones
        short = gpt.logits(full[:, :T])
        e = np.abs(short - ref[:, :T]).max()
        print(f"T = {T}: max error {e:.2e}")
        assert short.shape == (len(full), T, cfg.vocab) and e < 2e-5
    one = gpt.logits(full[3, :9])                   # one window [T] -> [T, V]
    assert one.shape == (9, cfg.vocab) and np.abs(one - ref[3, :9]).max() < 2e-5


def test_loss_against_float64(gpt):
    cfg = gpt.config
    rng = np.random.default_rng(2)
    ids = rng.integers(0, cfg.vocab, (3, 12))
    logits = gpt.logits(ids[:, :-1]).astype(np.float64)
    logp = logits - logits.max(-1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
    want = -np.take_along_axis(logp, ids[:, 1:, None], -1).mean()
    for got in (gpt.loss(ids), gpt.loss(ids[:, :-1], ids[:, 1:])):
        print(f"\nloss {got:.6f}, from the logits {want:.6f}")
        assert abs(got - want) < 1e-5
    assert abs(gpt.loss("To be, or not") - gpt.loss(gpt.encode("To be, or not"))) < 1e-9


def test_generate_text_ids_cache_and_seed(gpt):
    prompt = "ROMEO:"
    text = gpt.generate(prompt, 20)
    ids = gpt.generate(gpt.encode(prompt), 20)
    assert text == gpt.decode(ids) and text.startswith(prompt) and len(ids) == len(gpt.encode(prompt)) + 20
    assert np.array_equal(gpt.generate(gpt.encode(prompt), 20, cache=False), ids)
    a = gpt.generate(prompt, 30, temperature=1.0, top_k=20, top_p=0.9, seed=7)
    assert a == gpt.generate(prompt, 30, temperature=1.0, top_k=20, top_p=0.9, seed=7)
    two = gpt.generate(prompt, 10, temperature=1.0, num_samples=2, seed=3)
    assert isinstance(two, list) and len(two) == 2
    assert len(gpt.generate(prompt, 300)) > 300           # past the first decoder's capacity of 256


def test_training_is_the_trainers_bit_for_bit(tmp_path, text):
    """GPT.train on a new model takes the same steps as `tinygpt train` with the same settings."""
    g = tinygpt.GPT.from_preset("tiny", layers=1, seed=5)
    rec = g.train(4, data=text, batch=4, optimizer="adamw", lr=3e-3)
    assert rec["step"] == 4 and np.isfinite(rec["loss"]) and rec["grad_norm"] > 0
    out = tmp_path / "cli.tinygpt"
    r = subprocess.run([sys.executable, "-m", "tinygpt", "train", "--preset", "tiny", "--layers", "1", "--seed", "5",
                        "--steps", "4", "--batch", "4", "--optimizer", "adamw", "--lr", "3e-3", "--data", text,
                        "--eval-every", "0", "--sample-tokens", "0", "--quiet", "--out", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    from tinygpt.files import checkpoint as ckpt
    cli = ckpt.load(out)
    for name, w in cli.params.items():
        assert np.array_equal(g.checkpoint.params[name], w), name
    for name, m in cli.m.items():
        assert np.array_equal(g.checkpoint.m[name], m), name
    # trained in parts: a trainer of 6 steps run as 2 + 4 is the run of 6
    a, b = tinygpt.GPT.load(out), tinygpt.GPT.load(out)
    with pytest.warns(UserWarning, match="run at the schedule's final lr"):     # the file's run has ended
        a.train(6, data=text)
    with pytest.warns(UserWarning, match="run at the schedule's final lr"):
        t = b.trainer(6, data=text)
    t.run(2)
    t.run()
    assert all(np.array_equal(a.checkpoint.params[n], b.checkpoint.params[n]) for n in cli.params)
    assert a.step == b.step == 10


def test_errors_are_the_clis_checks_in_the_apis_words(gpt, text, tmp_path):
    """The flags' own checks, each option named by its keyword (lr, top_k), not its flag."""
    with pytest.raises(tinygpt.UsageError, match="^train: lr: must be a positive"):
        gpt.train(2, data=text, lr=-1)
    with pytest.raises(tinygpt.UsageError, match="not a setting of tinygpt train"):
        gpt.train(2, data=text, learning_rate=1e-3)
    with pytest.raises(tinygpt.UsageError, match="tokens; this model takes 1 to 32"):
        gpt.logits(np.zeros(33, np.int64))
    with pytest.raises(tinygpt.UsageError, match="token ids must be 0 to 255"):
        gpt.loss([1, 2, 300])
    with pytest.raises(tinygpt.UsageError, match="^top_k must be positive"):
        gpt.generate("a", 5, top_k=0)
    with pytest.raises(tinygpt.UsageError, match="^max_new_tokens must be 1 to 100,000, got 0"):
        gpt.generate("a", 0)
    with pytest.raises(tinygpt.CheckpointError, match="no such file"):
        tinygpt.GPT.load(tmp_path / "missing.tinygpt")
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(tinygpt.OutputError, match="not a checkpoint written by tinygpt"):
        gpt.save(tmp_path / "notes.txt")
    assert (tmp_path / "notes.txt").read_text() == "mine"
    with pytest.raises(tinygpt.UsageError, match="unknown preset"):
        tinygpt.GPT.from_preset("enormous")
    with pytest.raises(tinygpt.UsageError, match="seed is GPT.from_preset's setting"):
        gpt.train(2, data=text, seed=9)         # it would draw other weights than the model has
    with pytest.raises(tinygpt.UsageError, match="vocabulary 256 or 50257"):
        tinygpt.GPT.from_config(tinygpt.Config(layers=1, d_model=32, heads=2, ctx=16, vocab=300))


HOSTILE = [   # (what, the call on a model g, the start of the error) issue 47: each was a raw Python error or accepted
    ("a misspelt keyword", lambda g: tinygpt.GPT.from_preset("tiny", n_layer=2), "GPT.from_preset: 'n_layer' is not"),
    ("a bad shape value", lambda g: tinygpt.GPT.from_preset("tiny", layers=0), "GPT.from_preset: layers: must be "),
    ("encode of a number", lambda g: g.encode(5), "encode: give text"),
    ("decode past the vocabulary", lambda g: g.decode([256]), "decode: token ids must be whole numbers 0 to 255"),
    ("decode of a negative id", lambda g: g.decode([-1]), "decode: token ids must be whole numbers 0 to 255"),
    ("decode of ragged rows", lambda g: g.decode([[1, 2], [3]]), "decode: token ids must be a list"),
    ("decode of floats", lambda g: g.decode([1.5]), "decode: token ids must be whole numbers"),
    ("decode of text", lambda g: g.decode("abc"), "decode: token ids must be whole numbers"),
    ("logits of ragged rows", lambda g: g.logits([[1, 2], [3]]), "logits: token ids must be a list"),
    ("a seed that is text", lambda g: g.generate("a", 2, seed="x"), "generate: seed must be a whole number"),
    ("a cache that is not a bool", lambda g: g.generate("a", 2, cache="no"), "generate: cache is True or False"),
    ("save to None", lambda g: g.save(None), "save: give a file name"),
    ("load of None", lambda g: tinygpt.GPT.load(None), "GPT.load: give a file name"),
    ("kernels of no family", lambda g: tinygpt.GPT.from_preset("tiny", kernels={"matmul": "warp"}), "matmul has no variant"),
    ("kernels as a list", lambda g: tinygpt.GPT.from_preset("tiny", kernels=["sg"]), "kernels: a dict"),
    ("a gpu that is a name", lambda g: tinygpt.GPT.from_preset("tiny", gpu="cuda"), "gpu: a tinygpt GPU"),
    ("a tokenizer's decode past its vocabulary", lambda g: tinygpt.get_tokenizer("byte").decode([256]),
     "decode: token ids must be whole numbers 0 to 255"),
    ("a tokenizer's encode of None", lambda g: tinygpt.get_tokenizer("byte").encode(None), "encode: give text"),
    ("load with a misspelt keyword", lambda g: tinygpt.GPT.load("x.tinygpt", precison="bf16"), "GPT.load: 'precison'"),
]


@pytest.mark.parametrize("what,call,start", HOSTILE, ids=[h[0] for h in HOSTILE])
def test_hostile_arguments_are_refused_at_the_call(gpt, what, call, start):
    with pytest.raises(tinygpt.UsageError) as e:
        call(gpt)
    print(what, "->", e.value)
    assert str(e.value).startswith(start), str(e.value)


def test_a_trainers_own_arguments_are_checked(gpt, text):
    t = gpt.trainer(2, data=text)
    for call, start in ((lambda: t.run(1, every=0), "train: run's every must be a whole number 1 or more"),
                        (lambda: t.run(1, callback=5), "train: run's callback is a function"),
                        (lambda: t.val_loss(0), "val_loss: windows must be a whole number 1 or more"),
                        (lambda: t.val_loss("3"), "val_loss: windows must be a whole number")):
        with pytest.raises(tinygpt.UsageError) as e:
            call()
        assert str(e.value).startswith(start), str(e.value)
    assert t.step_count == 0        # nothing ran


def test_a_trainer_takes_the_recipes_tables(gpt, text):
    """The keywords may come in the recipe's group tables, as a config's do; a table does not let
    through what the trainer refuses bare (a shape, a file, its own steps)."""
    t = gpt.trainer(2, data=text, training={"lr": 1e-3}, optimization={"optimizer": "adamw", "beta1": 0.8})
    assert (t.o.lr, t.o.optimizer, t.o.beta1) == (1e-3, "adamw", 0.8)
    for tables, start in (({"shape": {"layers": 2}}, "train: layers is GPT.from_preset's setting"),
                          ({"outputs": {"out": "x.tinygpt"}}, "train: out is tinygpt train's own"),
                          ({"training": {"steps": 3}}, "train: steps and data are the trainer's own arguments"),
                          ({"training": {"d_model": 3}}, "train: [training] holds 'd_model', but it belongs in [shape]")):
        with pytest.raises(tinygpt.UsageError) as e:
            gpt.trainer(2, data=text, **tables)
        assert str(e.value).startswith(start), str(e.value)


def test_steps_past_a_finished_schedule_are_said(text):
    """Issue 47: a finished run trained on from Python ran at its final lr without a word, and the
    error for a new lr named the CLI's switch (add rewarm), not the keyword."""
    g = tinygpt.GPT.from_preset("tiny", seed=3)
    g.train(2, data=text)
    with pytest.warns(UserWarning, match=r"steps 3 to 3 run at the schedule's final lr .*rewarm=True starts"):
        g.train(1, data=text)
    with pytest.raises(tinygpt.UsageError, match="add rewarm=True to start a new warm-up"):
        g.train(1, data=text, lr=1e-3)


def test_from_config_is_from_preset_of_its_shape():
    cfg = tinygpt.Config(layers=1, d_model=32, heads=2, ctx=16, batch=3, seed=11)
    a, b = tinygpt.GPT.from_config(cfg), tinygpt.GPT.from_preset("tiny", layers=1, d_model=32, heads=2, ctx=16,
                                                                  batch=3, seed=11)
    assert a.config == b.config and a.config.batch == 3
    assert all(np.array_equal(a.params()[n], b.params()[n]) for n in a.params())


def test_the_example_imports_only_tinygpt_and_its_file_evaluates(tmp_path, text):
    """The issue's test of done: load a checkpoint, score a batch shorter than ctx, generate 50
    tokens from the cache, train 10 steps, save a file `tinygpt eval` reads."""
    script = ROOT / "scripts" / "api_example.py"
    imports = {a.name.split(".")[0] for node in ast.walk(ast.parse(script.read_text()))
               if isinstance(node, (ast.Import, ast.ImportFrom)) for a in node.names}
    imports |= {node.module.split(".")[0] for node in ast.walk(ast.parse(script.read_text()))
                if isinstance(node, ast.ImportFrom) and node.module}
    assert imports <= {"argparse", "sys", "tinygpt"}, imports
    start = tmp_path / "start.tinygpt"
    tinygpt.GPT.from_preset("tiny", layers=1).save(start)
    out = tmp_path / "more.tinygpt"
    run = lambda *a: subprocess.run([sys.executable, *map(str, a)], capture_output=True, text=True, timeout=300,
                                    env=dict(os.environ, PYTHONPATH=str(ROOT)))
    r = run(script, "--model", start, "--data", text, "--out", out)
    assert r.returncode == 0, r.stderr
    print("\n" + r.stdout)
    assert "loss of 2 windows of 16 tokens (context 32)" in r.stdout and "trained steps 1 to 10" in r.stdout
    r = run("-m", "tinygpt", "eval", "--model", out, "--data", text, "--max-windows", "8", "--json")
    assert r.returncode == 0, r.stderr
    assert tinygpt.GPT.load(out).step == 10
    r = run(script, "--model", tmp_path / "missing.tinygpt", "--out", out)
    assert r.returncode == 1 and "Traceback" not in r.stderr and "api_example: error:" in r.stderr


# a value `tinygpt train` takes for each option the trainer refuses (that it is refused is the point)
REFUSED_VALUES = {"out": "x.tinygpt", "force": True, "resume": "x.tinygpt", "log": "x.jsonl", "quiet": True,
                  "save_every": 5, "minutes": 1.0, "sample_tokens": 5, "sample_prompt": "a", "eval_every": 5,
                  "eval_windows": 2, "log_every": 5, "keep_best": True, "tensorboard": "tb", "config": "x.toml",
                  "preset": "tiny", "layers": 2, "d_model": 32, "heads": 2, "ctx": 16, "sliding_window": 8,
                  "tokenizer": "byte", "tokenizer_file": "x.tiktoken", "seed": 3}


def test_every_train_option_is_read_by_the_trainers_run_or_refused(gpt, text, monkeypatch):
    """Issue 67: the trainer took tensorboard= and keep_best=, ran, and wrote no event file and kept no
    best file. Every option of `tinygpt train` is either read by the run the trainer sets up (the
    same start.setup the CLI runs, spied on for the options it reads; the run's settings of
    evaluation, logging and saving drive the CLI's loop alone, so they do not count) or refused in
    one line that names it."""
    import dataclasses
    from tinygpt import api
    from tinygpt.run.options import RUN_SETTINGS, TrainOptions
    names = [f.name for f in dataclasses.fields(TrainOptions)]
    read = set()

    class Spy(TrainOptions):
        def __getattribute__(self, name):
            if name in names:
                read.add(name)
            return object.__getattribute__(self, name)

    real = api.setup
    monkeypatch.setattr(api, "setup", lambda o, *a, **k: real(Spy(**{n: getattr(o, n) for n in names}), *a, **k))
    before = set(read)
    gpt.trainer(1, data=text)
    assert read - before, "the spy saw the run read its options"
    applied = read - set(RUN_SETTINGS)
    refused = set(api.CLI_ONLY) | set(api.SHAPE)
    assert set(REFUSED_VALUES) == refused - {"steps"}
    for name in names:
        if name in ("steps", "data"):
            continue                     # the trainer's own arguments
        if name in refused:
            with pytest.raises(tinygpt.UsageError) as e:
                gpt.trainer(1, data=text, **{name: REFUSED_VALUES[name]})
            msg = str(e.value)
            assert len(msg.splitlines()) == 1 and msg.startswith(f"train: {name} is "), msg
        else:
            assert name in applied, f"train: {name} is taken by the trainer, but its run never reads it"
    print(f"{len(applied)} options read by the trainer's run, {len(refused) - 1} refused in one line")
