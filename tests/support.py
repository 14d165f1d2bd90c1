"""What the tests of several rooms share: where the checkout and its shared data lie, the command line
run in a process of its own or in this one, the one-line error every failure must end in, and a
small model to export."""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from tinygpt.commands.cli import main
from tinygpt.core.config import preset
from tinygpt.core.init import init_params
from tinygpt.files import checkpoint as ckpt

ROOT = Path(__file__).resolve().parents[1]           # the checkout
SHARED = ROOT.parent / "shared" / "data"             # ../shared/data: Tiny Shakespeare, r50k_base (optional)

# no samples at the end (3.7 s of a 9 s tiny run here): the tests that sample say so
TINY = ["--preset", "tiny", "--batch", "4", "--ctx", "16", "--quiet", "--sample-tokens", "0"]


def cli(*args, env=None, timeout=180):
    """A subprocess run: (exit code, stderr lines other than the driver's XDG noise)."""
    r = subprocess.run([sys.executable, "-m", "tinygpt", *[str(a) for a in args]], capture_output=True, text=True,
                       env=dict(os.environ, **(env or {})), timeout=timeout)
    err = [l for l in r.stderr.splitlines() if "XDG_RUNTIME_DIR" not in l and l.strip()]
    return r.returncode, err


def in_process(*args):
    """The same as cli() without a new process (which costs ~2.5 s of imports and adapter here):
    for commands that cannot hang; stderr captured, (exit code, lines)."""
    from io import StringIO
    from tinygpt.commands.cli import main
    old, sys.stderr = sys.stderr, StringIO()
    try:
        rc = main([str(a) for a in args])
    except SystemExit as e:
        rc = e.code
    finally:
        err, sys.stderr = sys.stderr.getvalue(), old
    return rc, [l for l in err.splitlines() if l.strip() and "XDG_RUNTIME_DIR" not in l]


def one_line_error(rc, err, *needles):
    """Non-zero exit; the error is one line (the last), with no traceback; progress lines may precede it."""
    assert rc != 0, err
    assert not any("Traceback" in l for l in err), err
    errors = [l for l in err if "error" in l.lower()]
    assert len(errors) == 1 and errors[0] == err[-1], err
    assert err[-1].startswith("tinygpt: error:"), err
    for n in needles:
        assert n in err[-1], (n, err[-1])


def run_cli(*args):
    """In-process; returns the exit code."""
    return main([str(a) for a in args])


def read_log(path, final=False):
    """A run's JSON Lines log: the logged steps' rows (final: the run's final-loss row too)."""
    rows = [json.loads(l) for l in Path(path).read_text().splitlines()]
    return rows if final else [r for r in rows if "train_loss" in r]


def model(vocab=256, seed=0):
    cfg = preset("tiny", layers=2, d_model=16, heads=2, ctx=12, vocab=vocab)
    p = init_params(cfg)
    r = np.random.default_rng(seed)
    p = {k: (v + r.standard_normal(v.shape) * 0.1).astype(np.float32) for k, v in p.items()}
    extra = {"tokenizer": "gpt2" if vocab == 50257 else "byte"}
    return ckpt.Checkpoint(cfg, p, None, None, 7, [], extra)


def rewrite(d, config=None, tensors=None, drop=None):
    """Edit an exported directory: config keys, tensors (name -> array), or a dropped tensor."""
    from safetensors.numpy import load_file, save_file
    if config:
        c = json.loads((d / "config.json").read_text())
        c.update(config)
        (d / "config.json").write_text(json.dumps(c))
    if tensors or drop:
        sd = load_file(d / "model.safetensors")
        sd.update(tensors or {})
        sd.pop(drop, None)
        save_file(sd, d / "model.safetensors")
