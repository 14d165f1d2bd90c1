"""A LoRA run end to end from the command line: the fine-tune learns, the base stays bit for bit in
its file and in the fine-tune's, resume is bit for bit, the file is one TinyGPT's readers read,
the PEFT export holds PEFT's names and shapes and computes the merged model, --adapters folds it
into its base only, and every refusal is one line."""
import json
import os

import numpy as np
import pytest

from support import read_log, run_cli
from upstream import upstream_problems
from support import TINY, in_process, one_line_error
from tinygpt.files import lora_files as AD
from tinygpt.files import checkpoint as ckpt
from tinygpt.core import lora as LR
from tinygpt.core.config import param_shapes

COMMON = [*TINY, "--log-every", 1]


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A tiny model (ctx 16) trained 120 steps on the built-in corpus, Python's documentation."""
    d = tmp_path_factory.mktemp("lora")
    p = d / "base.tinygpt"
    assert run_cli("train", *TINY, "--batch", 16, "--steps", 120, "--eval-every", 0, "--lr", 1e-2, "--out", p,
                   "--optimizer", "adamw") == 0      # moments the fine-tune's file keeps as read
    return p


def bits(a):
    return np.ascontiguousarray(a, np.float32).view(np.uint32)


def test_a_lora_fine_tune_learns_keeps_its_base_and_resumes_bit_for_bit(base, tmp_path, capsys, corpus):
    """Fine-tuned on another text (Tiny Shakespeare), the adapters lower the validation loss on it;
    the base file is untouched and the fine-tune's state holds its weights and moments bit for
    bit; stopped at 17 and resumed to 40, the losses and adapters are the straight run's."""
    raw_base = base.read_bytes()
    full, part = tmp_path / "full.jsonl", tmp_path / "part.jsonl"
    lora = ["--resume", base, "--data", corpus, "--batch", 8, "--lora", 8, "--lora-targets", "q,k,v,o,fc_in,fc_out",
            "--eval-every", 20, "--lr", 1e-2, "--schedule", "constant"]
    assert run_cli("train", *COMMON, *lora, "--steps", 40, "--out", tmp_path / "full.tinygpt", "--log", full) == 0
    assert base.read_bytes() == raw_base                              # the base file untouched
    assert run_cli("train", *COMMON, *lora, "--steps", 17, "--out", tmp_path / "part.tinygpt", "--log", part) == 0
    assert run_cli("train", *COMMON, "--resume", tmp_path / "part.tinygpt", "--data", corpus, "--batch", 8,
                   "--eval-every", 20, "--steps", 40, "--log", part) == 0
    a, b = read_log(full), read_log(part)
    assert [r["train_loss"] for r in a] == [r["train_loss"] for r in b] and len(a) == 40
    vals = [r["val_loss"] for r in a if r["val_loss"] is not None]
    ft, bk = ckpt.load(tmp_path / "full.tinygpt"), ckpt.load(base)
    first = ckpt.load(tmp_path / "part.tinygpt")
    held = AD.read(ft, "ft")
    for n, _, _ in param_shapes(ft.cfg):                               # the base weights, bit for bit
        assert np.array_equal(bits(ft.params[n]), bits(bk.params[n])), n
        assert np.array_equal(bits(ft.m[n]), bits(bk.m[n])) and np.array_equal(bits(ft.v[n]), bits(bk.v[n])), n
    for n in held.params:                                             # the resumed adapters, bit for bit
        assert np.array_equal(bits(held.params[n]), bits(AD.read(first, "part").params[n])), n
    assert held.base == LR.base_hash(bk.params, bk.cfg) and held.base_step == bk.step == 120
    assert ft.step == 40 and upstream_problems((tmp_path / "full.tinygpt").read_bytes()) == []
    val = {}
    for name, f in (("base", base), ("fine-tune", tmp_path / "full.tinygpt")):
        capsys.readouterr()
        assert in_process("eval", "--model", f, "--data", corpus, "--max-windows", 512, "--json")[0] == 0
        val[name] = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["loss"]
    with capsys.disabled():
        print(f"LoRA fine-tune: val {val['base']:.4f} (base) -> {val['fine-tune']:.4f} (512 windows; logged "
              f"{', '.join(f'{v:.4f}' for v in vals)}); 40 losses equal after a resume at 17")
    assert val["fine-tune"] < val["base"]


def test_peft_export_names_shapes_and_merge(base, tmp_path, capsys):
    """export --format peft: PEFT's keys and shapes for GPT2LMHeadModel (c_attn's stacked A and
    block-diagonal B, their rank and alpha in the patterns); PEFT's own arithmetic on them over
    the hf export's weights (W + lora_alpha / r (B A)^T per module) equals the merged export;
    --adapters folds the directory into its base, and only there."""
    ft, hf, mhf, pd = (tmp_path / n for n in ("ft.tinygpt", "hf", "merged", "peft"))
    assert run_cli("train", *TINY, "--resume", base, "--lora", 8, "--lora-targets", "q,v,o,fc_in", "--steps", 12,
                   "--eval-every", 0, "--lr", 1e-2, "--out", ft) == 0
    assert run_cli("export", "--model", ft, "--format", "peft", pd) == 0
    assert run_cli("export", "--model", ft, "--format", "hf", "--merge", mhf) == 0
    assert run_cli("export", "--model", base, "--format", "hf", hf) == 0
    from safetensors.numpy import load_file
    config = json.loads((pd / "adapter_config.json").read_text())
    assert config["peft_type"] == "LORA" and config["r"] == 8 and config["lora_alpha"] == 16.0
    assert config["target_modules"] == ["c_attn", "attn.c_proj", "mlp.c_fc"] and config["fan_in_fan_out"]
    assert config["rank_pattern"] == {"c_attn": 16} and config["alpha_pattern"] == {"c_attn": 32.0}
    ad, W, merged = load_file(pd / "adapter_model.safetensors"), load_file(hf / "model.safetensors"), \
        load_file(mhf / "model.safetensors")
    cfg = ckpt.load(ft).cfg
    C, M = cfg.d_model, cfg.d_mlp
    want = {"attn.c_attn": (16, C, 3 * C), "attn.c_proj": (8, C, C), "mlp.c_fc": (8, C, M)}
    assert len(ad) == 2 * len(want) * cfg.layers
    worst = 0.0
    for l in range(cfg.layers):
        for module, (r, i, o) in want.items():
            k = f"base_model.model.transformer.h.{l}.{module}"
            A, B = ad[k + ".lora_A.weight"], ad[k + ".lora_B.weight"]
            assert A.shape == (r, i) and B.shape == (o, r), (k, A.shape, B.shape)
            alpha = config["alpha_pattern"].get(module.split(".")[-1], config["lora_alpha"])
            rank = config["rank_pattern"].get(module.split(".")[-1], config["r"])
            w = f"transformer.h.{l}.{module}.weight"
            peft = W[w].astype(np.float64) + alpha / rank * (B.astype(np.float64) @ A).T   # Conv1D: [in, out]
            worst = max(worst, float(np.abs(peft - merged[w]).max()))
        assert np.array_equal(W[f"transformer.h.{l}.mlp.c_proj.weight"], merged[f"transformer.h.{l}.mlp.c_proj.weight"])
    with capsys.disabled():
        print(f"PEFT's arithmetic on the export = the merged weights within {worst:.2e}")
    assert worst < 1e-6
    capsys.readouterr()
    assert in_process("eval", "--model", base, "--adapters", pd, "--max-windows", 8, "--json")[0] == 0
    assert in_process("eval", "--model", ft, "--max-windows", 8, "--json")[0] == 0
    a, b = (json.loads(line)["loss"] for line in capsys.readouterr().out.strip().splitlines())
    with capsys.disabled():
        print(f"eval of the base with --adapters {a:.6f}, of the fine-tune's file {b:.6f}")
    assert abs(a - b) < 1e-6


def test_refusals_are_one_line(base, tmp_path):
    other = tmp_path / "other.tinygpt"
    assert run_cli("train", *TINY, "--steps", 2, "--eval-every", 0, "--seed", 5, "--out", other) == 0
    ft, pd = tmp_path / "ft.tinygpt", tmp_path / "peft"
    assert run_cli("train", *TINY, "--resume", base, "--lora", 2, "--steps", 2, "--eval-every", 0, "--out", ft) == 0
    assert run_cli("export", "--model", ft, "--format", "peft", pd) == 0
    link, hard = tmp_path / "link", tmp_path / "hard.tinygpt"      # the base's directory through a link; a hard link
    link.symlink_to(base.parent, target_is_directory=True)
    os.link(base, hard)
    before = base.read_bytes()
    cases = [
        (("train", *TINY, "--lora", 4, "--steps", 2), "--lora fine-tunes a trained model"),
        (("train", *TINY, "--resume", base, "--lora", 4, "--steps", 2), "give the fine-tune's own file with --out"),
        (("train", *TINY, "--resume", base, "--lora", 4, "--steps", 2, "--out", link / base.name),   # issue 47
         "give the fine-tune's own file with --out"),
        (("train", *TINY, "--resume", base, "--lora", 4, "--steps", 2, "--out", hard), "give the fine-tune's own"),
        (("train", *TINY, "--resume", ft, "--lora", 8, "--steps", 4), "drop them to continue these adapters"),
        (("train", *TINY, "--resume", base, "--lora-alpha", 4, "--out", tmp_path / "x.tinygpt"), "give their rank"),
        (("train", *TINY, "--resume", base, "--lora", 4, "--precision", "bf16", "--out", tmp_path / "y.tinygpt"),
         "needs a rank that is a multiple of 8"),
        (("export", "--model", ft, "--format", "hf", tmp_path / "hf"), "write them with --format peft"),
        (("export", "--model", base, "--format", "peft", tmp_path / "p2"), "holds no LoRA adapters"),
        (("export", "--model", base, "--format", "hf", "--merge", tmp_path / "h2"), "holds no LoRA adapters to merge"),
        (("eval", "--model", other, "--adapters", pd, "--max-windows", 4), "trained on another base model"),
        (("eval", "--model", ft, "--adapters", pd, "--max-windows", 4), "holds LoRA adapters of its own"),
        (("train", *TINY, "--resume", base, "--lora-targets", "q,x"), "comma-separated list of q, k, v, o"),
    ]
    for args, needle in cases:
        rc, err = in_process(*args)
        one_line_error(rc, err, needle)
    assert base.read_bytes() == before
    assert not (tmp_path / "hf").exists() and not (tmp_path / "p2").exists()


def test_lora_record_is_checked(base, tmp_path):
    """A damaged LoRA record is refused in one line, naming what is wrong."""
    ft = tmp_path / "ft.tinygpt"
    assert run_cli("train", *TINY, "--resume", base, "--lora", 2, "--steps", 2, "--eval-every", 0, "--out", ft) == 0
    ck = ckpt.load(ft)
    name = next(iter(ck.extra["lora"]["tensors"]))
    for change, needle in ((lambda r: r["tensors"][name].update(w="AAAA"), "needs"),
                           (lambda r: r.update(rank=0), "settings this tinygpt refuses"),
                           (lambda r: r["tensors"].pop(name), "lacks"),
                           (lambda r: r.update(base=None), "names no base model")):
        rec = json.loads(json.dumps(ck.extra["lora"]))
        change(rec)
        bad = ckpt.Checkpoint(ck.cfg, ck.params, ck.m, ck.v, ck.step, ck.loss_history, dict(ck.extra, lora=rec))
        p = tmp_path / "bad.tinygpt"
        ckpt.save(p, bad)
        rc, err = in_process("eval", "--model", p, "--max-windows", 4)
        one_line_error(rc, err, needle)


def test_peft_loads_the_export_with_the_same_logits(base, tmp_path):
    """Where peft, transformers and torch are installed (pip install peft transformers torch):
    PeftModel.from_pretrained over the hf export of the base gives the merged export's logits.
    They run in a process of their own: torch beside lavapipe's LLVM in one process crashes."""
    import importlib.util
    import subprocess
    import sys
    missing = [m for m in ("torch", "transformers", "peft") if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed: pip install peft transformers torch to run this")
    ft, hf, mhf, pd = (tmp_path / n for n in ("ft.tinygpt", "hf", "merged", "peft"))
    assert run_cli("train", *TINY, "--resume", base, "--lora", 4, "--lora-targets", "q,k,v,o,fc_in,fc_out",
                   "--steps", 8, "--eval-every", 0, "--lr", 1e-2, "--out", ft) == 0
    for args in (("--model", ft, "--format", "peft", pd), ("--model", ft, "--format", "hf", "--merge", mhf),
                 ("--model", base, "--format", "hf", hf)):
        assert run_cli("export", *args) == 0
    code = f"""
import numpy as np, torch, transformers, peft
ids = torch.tensor([[1, 50, 100, 7, 9, 33, 200, 17]])
model = peft.PeftModel.from_pretrained(transformers.GPT2LMHeadModel.from_pretrained({str(hf)!r}), {str(pd)!r}).eval()
want = transformers.GPT2LMHeadModel.from_pretrained({str(mhf)!r}).eval()
base = transformers.GPT2LMHeadModel.from_pretrained({str(hf)!r}).eval()
with torch.no_grad():
    a, b, c = (m(ids).logits.numpy() for m in (model, want, base))
print(float(np.abs(a - b).max()), float(np.abs(c - b).max()))
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    err, moved = map(float, r.stdout.split()[-2:])
    print(f"peft's logits against the merged export's: max difference {err:.2e} (the base's differ by {moved:.2e})")
    assert err < 1e-4 and moved > 100 * err


def test_an_adapters_directory_is_checked_before_it_is_trusted(base, tmp_path, capsys):
    """--adapters reads adapter_config.json (a config PEFT would load with another rank, scale or
    modules is refused, as are rsLoRA and DoRA), takes float tensors (F32, or PEFT's F16 and F64,
    read as float32) of the shapes the adapters' settings give (an integer tensor is not a weight),
    and sizes the file from its header
    before reading it: a file larger than its tensors is refused unread."""
    import shutil
    from safetensors.numpy import load_file, save_file
    ft, pd = tmp_path / "ft.tinygpt", tmp_path / "peft"
    assert run_cli("train", *TINY, "--resume", base, "--lora", 4, "--lora-targets", "q,v,fc_in", "--steps", 2,
                   "--eval-every", 0, "--out", ft) == 0
    assert run_cli("export", "--model", ft, "--format", "peft", pd) == 0
    assert in_process("eval", "--model", base, "--adapters", pd, "--max-windows", 4)[0] == 0

    def variant(name, config=None, tensors=None, tail=b""):
        d = tmp_path / name
        shutil.copytree(pd, d)
        if config:
            c = json.loads((d / "adapter_config.json").read_text())
            c.update(config)
            (d / "adapter_config.json").write_text(json.dumps(c))
        if tensors:
            f = d / "adapter_model.safetensors"
            raw = f.read_bytes()
            meta = json.loads(raw[8:8 + int.from_bytes(raw[:8], "little")])["__metadata__"]
            t = load_file(f)
            tensors(t)
            save_file(t, f, metadata=meta)
        if tail:
            with open(d / "adapter_model.safetensors", "ab") as f:
                f.write(tail)
        return d

    key = "base_model.model.transformer.h.0.mlp.c_fc.lora_A.weight"
    cases = [
        (variant("rank", {"r": 8}), "r is 8, where the adapters beside it were written with 4"),
        (variant("alpha", {"lora_alpha": 1.0}), "lora_alpha is 1.0"),
        (variant("modules", {"target_modules": ["c_attn"]}), "target_modules is"),
        (variant("pattern", {"rank_pattern": {}}), "rank_pattern is {}"),
        (variant("rslora", {"use_rslora": True}), "use_rslora is set"),
        (variant("ints", tensors=lambda t: t.update({key: t[key].astype(np.int32)})), "is I32"),
        (variant("extra", tensors=lambda t: t.update(stray=np.zeros(3, np.float32))), "an unexpected tensor stray"),
        (variant("long", tail=b"\0" * 4096), "bytes where its tensors need"),
    ]
    for d, needle in cases:
        rc, err = in_process("eval", "--model", base, "--adapters", d, "--max-windows", 4)
        one_line_error(rc, err, needle)
    # PEFT saves a half-precision or double model's adapters in its dtype: read as float32, and said
    # (issue 47); the F64 copy of our float32 values scores exactly as they do, F16 within its rounding
    losses, _ = {}, capsys.readouterr()
    for dtype in ("F32", "F16", "F64"):
        kind = {"F32": np.float32, "F16": np.float16, "F64": np.float64}[dtype]
        d = variant(dtype.lower(), tensors=lambda t: t.update({k: v.astype(kind) for k, v in t.items()}))
        rc, err = in_process("eval", "--model", base, "--adapters", d, "--max-windows", 4, "--json")
        assert rc == 0, err
        assert (dtype == "F32") != any(f"stored as {dtype}; read as float32" in line for line in err), err
        losses[dtype] = json.loads(capsys.readouterr().out)["loss"]
    print(f"--adapters as F32, F16, F64: {losses}")
    assert losses["F64"] == losses["F32"] and abs(losses["F16"] - losses["F32"]) < 1e-3


def test_the_readmes_lora_line_runs_as_written(base, tmp_path, corpus):
    """train --resume BASE --lora 8 --data my.txt --out ft.tinygpt, no --steps: a new LoRA run
    is its own run of train.LORA_STEPS steps (it failed: "the checkpoint is at step 0, the end of
    its run", the base's planned end taken for the fine-tune's)."""
    from tinygpt.run.recipe import LORA_STEPS
    ft = tmp_path / "ft.tinygpt"
    assert run_cli("train", "--resume", base, "--lora", 8, "--data", corpus, "--out", ft, "--quiet",
                   "--eval-every", 0, "--sample-tokens", 0) == 0
    assert ckpt.load(ft).step == LORA_STEPS
