"""How a run is set up, logged and kept, as the field's trainers do it: --config files, the settings
a resumed run keeps, the JSON Lines log and TensorBoard's event files (read back with TensorBoard's
own reader), --keep-best, and the command line's habits (--version, --help, plan's exit code, a
closed pipe)."""
import argparse
import json
import subprocess
import sys

import numpy as np
import pytest

from support import ROOT
from tinygpt.files import checkpoint as ckpt
from tinygpt.commands.cli import build_parser, main
from tinygpt.commands.settings import train_options

TINY = ["--preset", "tiny", "--layers", "1", "--batch", "4", "--ctx", "16", "--quiet", "--sample-tokens", "0"]


def test_a_config_is_the_same_run_as_its_flags_bit_for_bit(tmp_path, sentences):
    (tmp_path / "run.toml").write_text(f'preset = "tiny"\nlayers = 1\nbatch = 4\nctx = 16\nquiet = true\n'
                                       f'sample_tokens = 0\nsteps = 5\nlr = 3e-3\neval_every = 0\n'
                                       f'optimizer = "adamw"\nkernels = {{ matmul = "scalar" }}\n'
                                       f'data = "{sentences}"\n')
    a, b = tmp_path / "a.tinygpt", tmp_path / "b.tinygpt"
    assert main(["train", "--config", str(tmp_path / "run.toml"), "--out", str(a)]) == 0
    assert main(["train", *TINY, "--steps", "5", "--lr", "3e-3", "--eval-every", "0", "--optimizer", "adamw",
                 "--kernels", "matmul=scalar", "--data", str(sentences), "--out", str(b)]) == 0
    ca, cb = ckpt.load(a), ckpt.load(b)
    assert ca.step == cb.step == 5
    for name in ca.params:
        assert np.array_equal(ca.params[name], cb.params[name]), name
    # the command line wins over the file
    c = tmp_path / "c.tinygpt"
    assert main(["train", "--config", str(tmp_path / "run.toml"), "--steps", "2", "--out", str(c)]) == 0
    assert ckpt.load(c).step == 2
    # and over a file's minutes, where it gives steps (issue 47: "give --steps or --minutes, not both")
    (tmp_path / "timed.toml").write_text((tmp_path / "run.toml").read_text().replace("steps = 5", "minutes = 3.5")
                                         + 'sample_prompt = "-- a prompt that begins with a dash"\n')
    d = tmp_path / "d.tinygpt"
    assert main(["train", "--config", str(tmp_path / "timed.toml"), "--steps", "3", "--out", str(d)]) == 0
    assert ckpt.load(d).step == 3
    assert train_options({"sample_prompt": "-x"}, "a mapping").sample_prompt == "-x"     # as --sample-prompt=-x


@pytest.mark.parametrize("text, needle", [
    ("lr = -1\n", ": lr: must be a positive finite number"),           # the key, as the file names it
    ("learning_rate = 1e-3\n", "'learning_rate' is not a setting of tinygpt train"),
    ("steps = \n", "not TOML"),
    ("quiet = 1\n", "quiet is true or false"),
    ('config = "other.toml"\n', "does not name another config"),
    ('steps = "50"\n', "steps takes a number, not the text '50'"),          # typed as the flag is (issue 47)
    ('lr = "1e-3"\n', "lr takes a number, not the text '1e-3'"),
    ("[training]\nd_model = 96\n", "[training] holds 'd_model', but it belongs in [shape]"),   # the recipe's groups
    ("[training]\nwarmpu = 5\n", "[training] holds 'warmpu', but it is not a setting of tinygpt train"),
    ("steps = 5\n[training]\nsteps = 6\n", "steps is given twice, in [training] and outside it"),
    ("[schedule]\nlr = 1e-3\n", "schedule takes one value"),      # a field's name is no table
])
def test_a_bad_config_is_one_line(tmp_path, capsys, text, needle):
    (tmp_path / "bad.toml").write_text(text)
    assert main(["train", "--config", str(tmp_path / "bad.toml")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0] and f"--config {tmp_path / 'bad.toml'}" in err[0], err


def test_the_recipes_groups_hold_every_setting_once_and_section_the_help(capsys):
    """run/options.py's GROUPS: every field of TrainOptions in exactly one group, no group named
    as a field; train's --help shows them as its sections, in that order, each flag in its group's;
    a config in tables is the same recipe as its bare keys."""
    import dataclasses
    import tomllib
    from tinygpt.run.options import GROUPS, TrainOptions
    names = [n for _, members in GROUPS.values() for n in members]
    fields = [f.name for f in dataclasses.fields(TrainOptions)]
    print(f"{len(GROUPS)} groups, {len(names)} settings, {len(fields)} fields")
    assert sorted(names) == sorted(fields) and not set(GROUPS) & set(fields)
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    help_text = capsys.readouterr().out
    at = [help_text.index(f"\n{title}:\n") for title, _ in GROUPS.values()]
    assert at == sorted(at)
    for (title, members), start, end in zip(GROUPS.values(), at, at[1:] + [len(help_text)]):
        for name in members:
            assert f"  --{name.replace('_', '-')}" in help_text[start:end], (title, name)
    flat = 'preset = "tiny"\nsteps = 7\nlr = 2e-3\nbeta1 = 0.8\nprecision = "bf16"\neval_every = 0\nout = "x.tinygpt"\n'
    tables = ('[shape]\npreset = "tiny"\n[training]\nsteps = 7\nlr = 2e-3\n[optimization]\nbeta1 = 0.8\n'
              '[numerics]\nprecision = "bf16"\n[evaluation]\neval_every = 0\n[outputs]\nout = "x.tinygpt"\n')
    assert train_options(tomllib.loads(tables), "tables") == train_options(tomllib.loads(flat), "flat")


def test_trains_flags_are_the_recipes_fields():
    """Each flag of tinygpt train (and plan) is made from its field of TrainOptions: the same name,
    default, help (its {opt:NAME} as flags) and check; no setting has a flag of its own making, and
    the flags a mapping may not set (profile, json) are the only others. The Python API's keywords
    go through the same flags, so a field's check is the keyword's."""
    import argparse
    import dataclasses
    from tinygpt.commands.argtypes import flag
    from tinygpt.commands.settings import cli_words, train_flags
    from tinygpt.core.errors import UsageError
    from tinygpt.run.options import TrainOptions
    p = argparse.ArgumentParser(add_help=False)
    train_flags(p)
    actions = {a.dest: a for a in p._actions}
    fields = {f.name: f for f in dataclasses.fields(TrainOptions)}
    print(f"{len(fields)} settings, {len(actions)} flags")
    assert set(actions) == set(fields) | {"profile", "json"}
    for name, f in fields.items():
        a, m = actions[name], f.metadata
        default = f.default_factory() if callable(f.default_factory) else f.default
        assert a.option_strings[0] == flag(name) and a.default == default and a.help == cli_words(m["help"]), name
        assert "{opt:" not in a.help and (a.choices == m["choices"] or m["toggle"]), name
        if m["check"] is not None:            # the flag's type is the field's check, and so the API's
            assert a.type.__name__ == m["check"].__name__, name
    assert train_options({"layers": 2}, "k").layers == 2
    with pytest.raises(UsageError, match="layers: must be positive"):
        train_options({"layers": 0}, "k")


def test_the_example_configs_load():
    names = sorted(p.name for p in (ROOT / "configs").glob("*.toml"))
    assert names == ["first-run.toml", "lora.toml", "shakespeare.toml"]
    import tomllib
    for name in names:
        o = train_options(tomllib.loads((ROOT / "configs" / name).read_text()), name)
        print(f"\n{name}: preset {o.preset}, steps {o.steps}, minutes {o.minutes}, lora {o.lora}, out {o.out}")
        assert o.out and o.out.startswith("runs/")
    assert train_options(tomllib.loads((ROOT / "configs" / "lora.toml").read_text()), "lora").lora_targets == \
        ["q", "k", "v", "o"]


def test_a_resumed_run_keeps_its_settings(tmp_path, sentences):
    out, log = tmp_path / "m.tinygpt", tmp_path / "l.jsonl"
    assert main(["train", *TINY, "--steps", "7", "--log-every", "3", "--eval-every", "0", "--save-every", "0",
                 "--data", str(sentences), "--out", str(out)]) == 0
    settings = ckpt.load(out).extra["settings"]
    assert settings["log_every"] == 3 and settings["eval_every"] == 0 and settings["sample_tokens"] == 0
    assert main(["train", "--resume", str(out), "--steps", "13", "--quiet", "--data", str(sentences),
                 "--log", str(log)]) == 0
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    assert rows[0]["resumed_from"] == 7 and all("resumed_from" not in r for r in rows[1:]), rows
    steps = [r["step"] for r in rows]
    assert steps == [9, 12, 13], steps          # every 3rd step and the last, no evaluation
    assert main(["train", "--resume", str(out), "--steps", "15", "--log-every", "1", "--quiet",
                 "--data", str(sentences)]) == 0
    assert ckpt.load(out).extra["settings"]["log_every"] == 1           # an option given replaces it


def test_logs_tensorboard_and_keep_best(tmp_path, sentences):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    out, log, tb = tmp_path / "m.tinygpt", tmp_path / "l.jsonl", tmp_path / "tb"
    r = subprocess.run([sys.executable, "-m", "tinygpt", "train", *TINY, "--steps", "12", "--eval-every", "4",
                        "--eval-windows", "4", "--log-every", "2", "--data", str(sentences), "--out", str(out),
                        "--log", str(log), "--tensorboard", str(tb), "--keep-best"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    steps = [r for r in rows if "train_loss" in r]
    assert [r["step"] for r in steps] == [2, 4, 6, 8, 10, 12]
    assert all({"time", "lr", "grad_norm", "tokens_per_s"} <= set(r) and r["grad_norm"] > 0 for r in steps)
    final = rows[-1]
    assert final["step"] == 12 and final["final_val_loss"] > 0 and final["val_windows"] > 4
    (run_dir,) = tb.iterdir()                     # a folder per run inside --tensorboard (issue 47)
    assert run_dir.name.startswith("m-")
    ea = EventAccumulator(str(run_dir))
    ea.Reload()
    tags = set(ea.Tags()["scalars"])
    print(f"\nTensorBoard's reader: {sorted(tags)}")
    assert {"loss/train", "loss/val", "lr", "grad_norm", "tokens_per_s", "loss/val_final"} <= tags
    assert [e.step for e in ea.Scalars("loss/train")] == [2, 4, 6, 8, 10, 12]
    assert abs(ea.Scalars("loss/val_final")[0].value - final["final_val_loss"]) < 1e-5
    # keep-best: the file of the lowest validation loss, said at the end
    vals = {r["step"]: r["val_loss"] for r in steps if r["val_loss"] is not None}
    best_step = min(vals, key=vals.get)
    best = tmp_path / "m.best.tinygpt"
    assert ckpt.load(best).step == best_step
    assert f"best checkpoint {best} (step {best_step}" in r.stdout and f"TensorBoard logs in {run_dir}" in r.stdout


def test_a_resumed_run_continues_its_logs_and_each_run_has_its_folder(tmp_path, sentences):
    """Issue 47: a resumed run appends to its JSON Lines log and to its own TensorBoard run (the
    folder its checkpoint names), its first row saying where it resumed; a second run given the
    same --tensorboard directory, even in the same second, gets a folder of its own. The command
    an interrupted run prints names its logs, so that they go on."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    out, log, tb = tmp_path / "m.tinygpt", tmp_path / "l.jsonl", tmp_path / "tb"
    common = [*TINY, "--eval-every", "0", "--log-every", "2", "--data", str(sentences), "--tensorboard", str(tb)]
    assert main(["train", *common, "--steps", "4", "--out", str(out), "--log", str(log)]) == 0
    assert main(["train", *common, "--resume", str(out), "--steps", "8", "--log", str(log)]) == 0
    assert main(["train", *common, "--steps", "2", "--out", str(tmp_path / "m2.tinygpt")]) == 0
    assert main(["train", *common, "--steps", "2", "--out", str(tmp_path / "m2.tinygpt"), "--force"]) == 0
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    assert [r["step"] for r in rows if "train_loss" in r] == [2, 4, 6, 8]
    assert [r.get("resumed_from") for r in rows if "train_loss" in r] == [None, None, 4, None]
    runs = sorted(p.name for p in tb.iterdir())
    print(f"\nTensorBoard runs: {runs}")
    assert len(runs) == 3 and ckpt.load(out).extra["tensorboardRun"] in runs
    ea = EventAccumulator(str(tb / ckpt.load(out).extra["tensorboardRun"]))
    ea.Reload()
    assert [e.step for e in ea.Scalars("loss/train")] == [2, 4, 6, 8]


def test_f16_logs_its_loss_scale(gpu, tmp_path, sentences):
    if "shader-f16" not in gpu.features:
        pytest.skip(f"{gpu.name} has no shader-f16")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    tb = tmp_path / "tb"
    assert main(["train", *TINY, "--steps", "2", "--eval-every", "0", "--log-every", "1", "--precision", "f16",
                 "--data", str(sentences), "--out", str(tmp_path / "m.tinygpt"), "--tensorboard", str(tb)]) == 0
    ea = EventAccumulator(str(next(tb.iterdir())))
    ea.Reload()
    assert [e.value for e in ea.Scalars("loss_scale")] == [65536.0, 65536.0]


def test_version_help_and_a_closed_pipe():
    r = subprocess.run([sys.executable, "-m", "tinygpt", "--version"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.startswith("tinygpt 0.") and "wgpu-py" in r.stdout
    # every flag says what it does, and its default where it takes a value
    missing = []

    def walk(p, name):
        for a in p._actions:
            if isinstance(a, argparse._SubParsersAction):
                for n, sp in a.choices.items():
                    walk(sp, n)
            elif a.option_strings and not isinstance(a, (argparse._HelpAction, argparse._VersionAction)):
                takes_value = not isinstance(a, (argparse._StoreTrueAction, argparse.BooleanOptionalAction))
                if not a.help or takes_value and not a.required and "default" not in a.help:
                    missing.append(f"{name} {a.option_strings[0]}")
    walk(build_parser(), "tinygpt")
    assert not missing, missing
    # `tinygpt info | head -1`: the reader leaves; tinygpt ends without a word, as Unix tools do
    for argv in (["info"], ["train", "--help"]):
        p = subprocess.Popen([sys.executable, "-m", "tinygpt", *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
        p.stdout.close()                        # before it writes a line
        err = [line for line in p.stderr.read().splitlines() if "XDG_RUNTIME_DIR" not in line]
        p.stderr.close()
        rc = p.wait(timeout=120)
        assert not err and rc == (141 if argv == ["info"] else 0), (argv, rc, err)     # --help has said all


def test_no_output_lands_on_or_in_an_input(tmp_path, sentences, capsys):
    """--force replaces files tinygpt did not write, but never the run's own config; TensorBoard's
    files never go inside a --data directory (the next run would read them as text)."""
    cfg = tmp_path / "run.toml"
    cfg.write_text('preset = "tiny"\nsteps = 1\n')
    texts = tmp_path / "texts"
    texts.mkdir()
    (texts / "a.txt").write_text(sentences.read_text())
    for argv, needle in ((["--config", str(cfg), "--out", str(cfg), "--force"], "is also this command's --config"),
                         (["--data", str(texts), "--tensorboard", str(texts / "tb")], "lies inside --data")):
        assert main(["train", *TINY, *argv]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and needle in err[0], err
    assert cfg.read_text() == 'preset = "tiny"\nsteps = 1\n' and not (texts / "tb").exists()
    with pytest.raises(Exception, match="not a setting of tinygpt train"):
        train_options({"config": str(cfg)}, "train")          # the API cannot name a file it would not read


def test_keep_best_compares_like_with_like(tmp_path, sentences, capsys):
    """Issue 47: keep-best compares a step's loss over the evaluation windows with the best file's
    loss over as many windows (its keepBest record), never with the end's whole-split loss in the
    history: a resumed run whose file's last point is a low whole-split loss still keeps a better
    estimate; and over another number of windows the first evaluation starts the record again."""
    out, best = tmp_path / "m.tinygpt", tmp_path / "m.best.tinygpt"
    common = ["--data", str(sentences), "--eval-every", "2", "--eval-windows", "4", "--sample-tokens", "0", "--quiet"]
    assert main(["train", *TINY, "--steps", "4", "--out", str(out), "--keep-best", *common]) == 0
    ck = ckpt.load(out)
    rec = ck.extra["keepBest"]
    print("keepBest after the first run:", rec)
    assert rec["windows"] == 4 and rec["step"] == ckpt.load(best).step and rec["val"] > 0
    ck.loss_history[-1]["val"] = 0.01               # as if the end's whole-split loss were far below
    ck.extra["keepBest"] = dict(rec, val=99.0)      # and the best file's own estimate far above
    ckpt.save(out, ck)
    capsys.readouterr()
    assert main(["train", "--resume", str(out), "--steps", "6", *common]) == 0
    said = capsys.readouterr().out
    print(said.splitlines()[-1])
    assert "best checkpoint" in said and "(step 6, val" in said and ckpt.load(best).step == 6
    ck = ckpt.load(out)
    ck.extra["keepBest"] = dict(ck.extra["keepBest"], val=0.01)        # unbeatable, but over 4 windows
    ckpt.save(out, ck)
    assert main(["train", "--resume", str(out), "--steps", "8", *common[:4], "--eval-windows", "3",
                 "--sample-tokens", "0", "--quiet"]) == 0
    assert ckpt.load(best).step == 8 and ckpt.load(out).extra["keepBest"]["windows"] == 3
