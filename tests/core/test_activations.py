"""A new MLP activation is its room (core/activations.py) and one line in core.block's MLPS, nothing
else (docs/architecture.md, "How to add"): a scratch activation registered here at run time, never
in the package, runs through elementwise.wgsl in float32 at both widths, in bf16 and in f16 against
its own twins, reaches `--mlp`'s choices and help, and trains from the command line in every
precision, each run passing the start check against the twins."""
import inspect
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from conftest import check
from support import ROOT, TINY
from upstream import header_of
from tinygpt.core import activations, block
from tinygpt.reference import kernels as R

pytestmark = pytest.mark.kernel

# x sigmoid(1.702 x), the sigmoid approximation of GELU: written as a contributor would write one
SCRATCH_WGSL = """
fn act4(v: vec4<f32>) -> vec4<f32> { return v / (1.0 + exp(-1.702 * v)); }
fn act_grad4(v: vec4<f32>) -> vec4<f32> {
  let s = 1.0 / (1.0 + exp(-1.702 * v));
  return s + 1.702 * v * s * (1.0 - s);
}
"""


def scratch_forward(x):
    return x / (1.0 + np.exp(-1.702 * x))


def scratch_backward(x, dy):
    s = 1.0 / (1.0 + np.exp(-1.702 * x))
    return dy * (s + 1.702 * x * s * (1.0 - s))


@pytest.fixture
def scratch(monkeypatch):
    """The two lines a new activation adds: its room's entry, and its MLP's."""
    act = activations.Activation("scratch", SCRATCH_WGSL, scratch_forward, scratch_backward)
    monkeypatch.setitem(activations.ACTIVATIONS, "scratch", act)
    monkeypatch.setitem(block.MLPS, "scratch", block.Mlp("scratch", act, summary="a scratch x sigmoid(1.702x)"))
    return act


@pytest.mark.parametrize("n", [5, 1024, 4 * 64 * 16 + 8])
def test_a_new_activation_runs_in_every_stored_type(gpu, kn, rng, scratch, n):
    """float32 at the scalar and vec4 widths; bf16 and f16 (n a multiple of their unit) within one
    rounding of the float64 twin of the same stored values; the backward in float32."""
    x = (rng.standard_normal(n) * 3).astype(np.float32)
    dy = rng.standard_normal(n).astype(np.float32)
    out, dx = gpu.tensor((n,)), gpu.tensor((n,))
    for variant in ("scalar", "vec4") if n % 4 == 0 else ("scalar",):
        gpu.run([kn.act_forward(scratch, gpu.upload(x), out, n, variant),
                 kn.act_backward(scratch, gpu.upload(x), gpu.upload(dy), dx, n, variant)])
        check(f"scratch_forward {variant} n={n}", gpu.read(out), scratch_forward(x.astype(np.float64)), 1e-6, 1e-6)
        check(f"scratch_backward {variant} n={n}", gpu.read(dx), scratch_backward(x.astype(np.float64), dy), 1e-6, 1e-6)
    halves = [("bf16", R.cast_bf16, lambda h: R.cast_f32(h, n))]
    if "shader-f16" in gpu.features:
        halves.append(("f16", R.cast_f16, lambda h: R.cast_f16_to_f32(h, n)))
    for dtype, cast, back in halves if n % 8 == 0 else []:
        xh = cast(x)
        outh = gpu.tensor((n // 2,), dtype)
        gpu.run([kn.act_forward(scratch, gpu.upload(xh, dtype=dtype), outh, n),
                 kn.act_backward(scratch, gpu.upload(xh, dtype=dtype), gpu.upload(dy), dx, n)])
        values = back(xh).astype(np.float64)
        check(f"scratch_forward {dtype} n={n} (one rounding)", back(gpu.read(outh)), scratch_forward(values), 2e-6,
              (2.0 ** -8 if dtype == "bf16" else 2.0 ** -11) + 1e-6)
        check(f"scratch_backward {dtype} n={n}", gpu.read(dx),
              R.stored_backward(scratch_backward, xh, dy.astype(np.float64), dtype), 2e-6, 1e-5)


@pytest.fixture(scope="module")
def scratch_checkout(tmp_path_factory):
    """A copy of the package and its shaders with the scratch activation's lines added to the source, as
    a contributor adds them: its room at the end of core/activations.py, its MLP at the end of
    core/block.py. No other file changes."""
    d = tmp_path_factory.mktemp("checkout")
    shutil.copytree(ROOT / "tinygpt", d / "tinygpt", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "shaders", d / "shaders")
    room = "\n\n".join([f"SCRATCH_WGSL = {SCRATCH_WGSL!r}", inspect.getsource(scratch_forward),
                         inspect.getsource(scratch_backward),
                         'ACTIVATIONS["scratch"] = Activation("scratch", SCRATCH_WGSL, scratch_forward, scratch_backward)'])
    with open(d / "tinygpt" / "core" / "activations.py", "a") as f:
        f.write("\n\n" + room + "\n")
    with open(d / "tinygpt" / "core" / "block.py", "a") as f:
        f.write('\nMLPS["scratch"] = Mlp("scratch", ACTIVATIONS["scratch"], summary="a scratch x sigmoid(1.702x)")\n')
    return d


def registered(checkout, *args):
    """`tinygpt ARGS` run from that copy: (exit code, stdout, stderr)."""
    r = subprocess.run([sys.executable, "-m", "tinygpt", *map(str, args)], capture_output=True, text=True,
                       timeout=300, cwd=checkout, env=dict(os.environ, PYTHONPATH=str(checkout)))
    return r.returncode, r.stdout, r.stderr


def test_a_new_activation_reaches_the_flag_and_trains(gpu, scratch_checkout, tmp_path, sentences):
    rc, out, err = registered(scratch_checkout, "train", "--help")
    shown = " ".join(out.split())      # the help as one line, whatever its wrapping
    assert rc == 0 and "{gelu,gelu_tanh,relu2,swiglu,scratch}" in shown, err
    assert "scratch (a scratch x sigmoid(1.702x))" in shown, shown
    precisions = ["fp32", "bf16"] + (["f16"] if "shader-f16" in gpu.features else [])
    for precision in precisions:
        path = tmp_path / f"{precision}.tinygpt"
        rc, out, err = registered(scratch_checkout, "train", *TINY, "--mlp", "scratch", "--precision", precision,
                                  "--steps", 3, "--data", sentences, "--out", path)
        assert rc == 0, err
        assert header_of(path.read_bytes())["config"]["activation"] == "scratch"
    print(f"trained with the scratch activation in {', '.join(precisions)}")
