"""Right whatever the driver's shader cache holds (docs/engines.md, "The shader cache").

Each test runs kernels in child processes that share one scratch cache folder, as a user's runs
share ~/.cache: the first process fills the cache, the next one loads from it and compares with
the NumPy twins. CI starts every run with an empty cache, so without these it could never see a
cache that hands one process the code another compiled.
"""
import json
import os
import subprocess
import sys

import pytest

from tinygpt.model import attention

pytestmark = pytest.mark.kernel

# Runs in a child: kernels of each family at the constants named on the command line, each
# against its twin; prints one JSON line {what: max error}.
CHILD = r'''
import json, sys
import numpy as np
from tinygpt.core.activations import ACTIVATIONS
from tinygpt.device import kernels as K
from tinygpt.device.gpu import GPU
from tinygpt.device.kernels import Kernels
from tinygpt.device.plan import PORTABLE
from tinygpt.device.planner import make_plan
from tinygpt.model import attention
from tinygpt.reference import attention as RA
from tinygpt.reference import kernels as R

force_sg, head_dims, window, tanh = sys.argv[1] == "sg", json.loads(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1"
impls = sys.argv[5].split(",")
gpu = GPU()
plan = PORTABLE if force_sg else make_plan(gpu, tuning={})   # forced: no check compiled at this width
kn = Kernels(gpu, PORTABLE.with_(attention="sg") if force_sg else plan)
errs, r = {}, np.random.default_rng(0)
if not head_dims:                          # the planner's subgroup check alone
    print(json.dumps({"adapter": gpu.name, "subgroups": plan.subgroups, "errors": {}}))
    sys.exit(0)
err = lambda got, want: float(np.nan_to_num(np.abs(np.asarray(got, np.float64) - want), nan=np.inf).max())
for hd in head_dims:                       # attention: HD, HD4, ALIGNED and WINDOW constants
    B, T, H = 1, 21, 2
    q, k, v = (r.standard_normal((B, T, hd * H)).astype(np.float32) for _ in range(3))
    f = [x.astype(np.float64) for x in (q, k, v)]
    for impl in impls:
        got = attention.forward(kn, q, k, v, H, impl, window=window)
        errs[f"{impl} hd={hd} window={window}"] = err(got, RA.attention_forward(*f, H, window=window or None))
N, T, C, H, pos = 2, 12, 4 * head_dims[0], 2, 9     # the decode step's attention: WINDOW
qd, kc, vc = r.standard_normal((N, C)), r.standard_normal((N, T, C)), r.standard_normal((N, T, C))
u = gpu.uniform(K.DECODE_UNIFORM_BYTES)
gpu.write_uniform(u, K.decode_uniform(N=N, T=T, C=C, H=H, pos=pos, step=0, V=256, VP=256))
out, scratch = gpu.tensor((N, C)), gpu.tensor((N, H, T))
gpu.run([kn.decoding.attn_decode(*(gpu.upload(a.astype(np.float32)) for a in (qd, kc, vc)), out, scratch, N, H, u, window)])
errs[f"attn_decode window={window}"] = err(gpu.read(out), R.attn_decode(qd, kc, vc, pos, H, window or None))
x = (r.standard_normal(200) * 3).astype(np.float32)  # GELU's two forms: two sources of one file
y = gpu.tensor((200,))
act = ACTIVATIONS["gelu_tanh" if tanh else "gelu"]
gpu.run([kn.act_forward(act, gpu.upload(x), y, 200)])
errs[f"{act.name}_forward"] = err(gpu.read(y), act.forward(x.astype(np.float64)))
M, Nn, Kd = 24 + 8 * head_dims[0], 40 + 8 * head_dims[0], 12   # matmul: the sg kernel's NC, TM
a, b = r.standard_normal((M, Kd)).astype(np.float32), r.standard_normal((Kd, Nn)).astype(np.float32)
mo = gpu.tensor((M, Nn))
gpu.run([kn.matmul(gpu.upload(a), gpu.upload(b), None, mo, M, Nn, Kd)])
errs[f"matmul {M}x{Nn}x{Kd}"] = err(gpu.read(mo), a.astype(np.float64) @ b)
print(json.dumps({"adapter": gpu.name, "subgroups": plan.subgroups, "errors": errs}))
'''


def child(cache, width, *args, impls="online"):
    env = dict(os.environ, TINYGPT_CACHE_DIR=str(cache), XDG_CACHE_HOME=str(cache / "xdg"))
    env.pop("MESA_SHADER_CACHE_DIR", None)
    env.pop("LP_NATIVE_VECTOR_WIDTH", None)
    if width:
        env["LP_NATIVE_VECTOR_WIDTH"] = str(width)
    p = subprocess.run([sys.executable, "-c", CHILD, *map(str, args), impls], env=env, capture_output=True, text=True,
                       timeout=900)
    assert p.returncode == 0, p.stderr[-2000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def lavapipe(gpu):
    if "llvmpipe" not in gpu.name.lower() or gpu.backend != "Vulkan":
        pytest.skip(f"{gpu.name} ({gpu.backend}) is not lavapipe, Mesa's Vulkan on the CPU, whose cache and "
                    "subgroups this is about")


def agree(run, tol=2e-5):
    bad = {k: v for k, v in run["errors"].items() if not v <= tol}
    for k, v in sorted(run["errors"].items()):
        print(f"  {k:36s} max error {v:.3e}")
    assert not bad, f"disagree with their twins on {run['adapter']}: {bad}"


def test_code_of_one_subgroup_width_is_never_loaded_at_another(gpu, tmp_path):
    """The cause of the NaN (issue 49): Mesa 22.3's cache key misses LP_NATIVE_VECTOR_WIDTH. A
    process at 4 lanes builds online_sg.wgsl (forced: its lanes then broadcast past a subgroup, so
    its own results are wrong, and not checked), at the odd head dims a user trains; then a
    process at 8 lanes, whose plan takes the sg kernels, runs them: each must equal its twin. A
    process at 8 lanes runs the planner's check first, so that a cache shared by all widths would
    pass it (this was the order of the report; without the fix the last process computes NaN)."""
    lavapipe(gpu)
    dims = "[5, 24]"
    assert child(tmp_path, 256, "plan", "[]", 0, 0)["subgroups"] == "ok"
    child(tmp_path, 128, "sg", dims, 0, 0)
    run = child(tmp_path, 256, "plan", dims, 0, 0)
    print(f"8 lanes after 4 ({run['adapter']}; subgroups {run['subgroups']}):")
    assert run["subgroups"] == "ok", run["subgroups"]
    agree(run)
    folders = sorted(p.name for p in (tmp_path / "mesa").iterdir())     # and Mesa's own is not used
    assert folders == ["tinygpt-lp-128", "tinygpt-lp-256"], folders


def test_pipelines_that_differ_in_their_constants_after_a_filled_cache(gpu, tmp_path):
    """One process fills the cache with each family's kernels at one set of override constants
    (head dim, window, GELU's form, the sg matmul's blocks); the next process runs them at
    another set and at the first again (now from the cache): every result equals its twin."""
    first, second, impls = ("[24]", 5, 0), ("[13]", 0, 1), ",".join(attention.IMPLS)
    child(tmp_path, "", "plan", *first, impls=impls)
    for consts in (second, first):
        run = child(tmp_path, "", "plan", *consts, impls=impls)
        print(f"constants {consts} after {first}:")
        agree(run)


def test_a_run_whose_kernel_disagrees_is_refused_in_one_line(gpu, tmp_path, corpus):
    """The start check (model/twincheck.py): a cache poisoned as the report's was (online_sg.wgsl's
    forward at head dim 24 compiled for 4 lanes, then handed to an 8-lane process as its own, by
    copying the folder) makes `tinygpt train --preset tiny --heads 2` stop before its first step
    with one line that names the kernel and says what to do; the same run with the cache deleted
    trains."""
    import shutil
    lavapipe(gpu)
    child(tmp_path, 128, "sg", "[24]", 0, 0)
    shutil.copytree(tmp_path / "mesa" / "tinygpt-lp-128", tmp_path / "mesa" / "tinygpt-lp-native")
    env = dict(os.environ, TINYGPT_CACHE_DIR=str(tmp_path), XDG_CACHE_HOME=str(tmp_path / "xdg"))
    env.pop("MESA_SHADER_CACHE_DIR", None)
    env.pop("LP_NATIVE_VECTOR_WIDTH", None)
    cmd = [sys.executable, "-m", "tinygpt", "train", "--preset", "tiny", "--heads", "2", "--steps", "2",
           "--data", str(corpus), "--out", str(tmp_path / "run.tinygpt"), "--quiet"]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    lines = [ln for ln in p.stderr.splitlines() if ln.startswith("tinygpt: error")]
    print(p.stderr[-1500:])
    assert p.returncode == 1 and len(lines) == 1, (p.returncode, p.stderr[-2000:])
    assert "the kernel attn_online_forward_sg (online_sg.wgsl, ALIGNED, HD=24, HD4=8) disagrees" in lines[0], lines[0]
    assert "MESA_SHADER_CACHE_DISABLE=true" in lines[0] and "tinygpt-lp-native" in lines[0], lines[0]
    assert "Traceback" not in p.stderr and not (tmp_path / "run.tinygpt").exists()
    shutil.rmtree(tmp_path / "mesa" / "tinygpt-lp-native")
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0 and (tmp_path / "run.tinygpt").exists(), p.stderr[-2000:]


def test_a_nan_names_the_kernel_not_the_learning_rate(monkeypatch, tmp_path, corpus, capsys):
    """After a NaN loss the kernels are checked again (model/twincheck.blame): where one now
    disagrees with the reference (forced here: every check after the start one sees the logits
    doubled, as no family switch cures), the error says so and does not suggest --lr; where all
    agree, it does (tests/run/test_hardening.py's test_nan_stops_with_the_step_and_a_hint)."""
    from tinygpt.commands.cli import main
    from tinygpt.model import twincheck
    real, calls = twincheck._errors, []

    def later_wrong(gpu, plan, spec):
        errors, built = real(gpu, plan, spec)
        calls.append(spec)
        return (errors if len(calls) == 1 else {**errors, "logits": 4.0}), built
    monkeypatch.setattr(twincheck, "_errors", later_wrong)
    rc = main(["train", "--preset", "tiny", "--batch", "4", "--ctx", "16", "--quiet", "--sample-tokens", "0",
               "--data", str(corpus), "--steps", "20", "--lr", "1e30", "--log-every", "1", "--eval-every", "0",
               "--out", str(tmp_path / "nan.tinygpt")])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    print(err)
    assert rc == 3 and "the loss became nan at step" in err and "not the learning rate" in err, err
    assert "a kernel of this run disagrees" in err and "--lr" not in err, err
