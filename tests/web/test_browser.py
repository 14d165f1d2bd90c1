"""A real browser's WebGPU (headless Chromium, through playwright) against this host's: every
module and pipeline the plans build compiles there without an error or a warning, and one
training step replayed there from a trace gives this host's loss and weights (tolerances in
tinygpt/web/step.py). Skipped, with what to install, where no Chromium or playwright is here."""
import base64

import numpy as np
import pytest

from support import ROOT
from tinygpt.web.browser import BrowserUnavailable, open_page
from tinygpt.web.step import LOSS_RTOL, compare, compiler_problems, decode, every_pipeline, traced_step

LR = 1e-3


@pytest.fixture(scope="module")
def page():
    try:
        with open_page() as p:
            yield p
    except BrowserUnavailable as e:
        pytest.skip(f"no browser here: {e}")


def test_every_pipeline_the_plans_build_compiles_in_the_browser(gpu, page):
    about = page.describe()
    print(f"\nbrowser: {about['userAgent']}\nadapter: {about['info']}, features {about['features']}")
    trace = every_pipeline(gpu, about["limits"], browser_features=about["features"])
    files = {m["name"] for m in trace["modules"]}
    assert {"matmul_vec4.wgsl", "matmul_tiled.wgsl", "online.wgsl", "attention.wgsl", "decode.wgsl",
            "matmul.wgsl"} <= files, files
    built = page.compile(trace)
    problems = compiler_problems(built)
    print(f"{built['modules']} modules, {built['pipelines']} pipelines: {len(problems)} errors or warnings")
    assert built["pipelines"] == len(trace["pipelines"]) and not problems, problems[:5]


# with 131,072-byte bindings (batch 2, ctx 16, so that the activations fit one) the flat buffers
# bind in three chunks at the browser's 256-byte alignment: each chunk's place in the partial sums
# and the decay table is then an index, not an offset (optim.wgsl)
@pytest.mark.parametrize("limit", [None, 131072])
def test_a_training_step_in_the_browser_equals_this_hosts(gpu, page, limit):
    about = page.describe()
    small = {"batch": 2, "ctx": 16} if limit else {}
    trace, expected = traced_step(gpu, about["limits"], lr=LR, max_binding=limit, **small)
    if limit:
        assert max(size for d in trace["dispatches"] for _, _, size in d["storage"]) <= limit
        assert sum(d["pipeline"] == next(i for i, p in enumerate(trace["pipelines"]) if p["entry"].startswith("adamw"))
                   for d in trace["dispatches"]) == 3
    # the trace is under the browser's alignment: every bound offset a multiple of it
    align = about["limits"]["minStorageBufferOffsetAlignment"]
    assert all(off % align == 0 for d in trace["dispatches"] for _, off, _ in d["storage"])
    out = page.replay(trace)
    assert not compiler_problems(out), compiler_problems(out)[:5]
    got = decode(out["outputs"])
    res = compare(got, expected, LR)
    print(f"\n{len(trace['dispatches'])} dispatches: loss {res['loss']:.7f} vs {res['loss_expected']:.7f} "
          f"(|diff| {res['loss_err']:.2e}, rtol {LOSS_RTOL:g}); {res['params']:,} parameters, max |diff| "
          f"{res['params_max_err']:.2e} (tolerance 1e-2 x lr = {1e-2 * LR:g})")
    assert res["ok"], res
    # the comparison is not blind: the weights before the step, or a loss off by 1e-4, fail it
    bi, off, size = trace["outputs"]["params"]
    before = np.frombuffer(base64.b64decode(trace["buffers"][bi]["data"])[off:off + size], np.float32)
    assert not compare({"loss": got["loss"], "params": before}, expected, LR)["ok"]
    assert not compare({"loss": got["loss"] * np.float32(1 + 1e-4), "params": got["params"]}, expected, LR)["ok"]


def test_browser_step_without_a_browser_is_one_line(tmp_path):
    """The script where the browser it is pointed at is missing: one line naming the fix, exit 1."""
    import os
    import subprocess
    import sys
    script = ROOT / "scripts" / "browser_step.py"
    r = subprocess.run([sys.executable, str(script), "--skip-compile"], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, TINYGPT_CHROMIUM=str(tmp_path / "no-chromium")))
    lines = [l for l in r.stderr.splitlines() if l.strip() and "XDG_RUNTIME_DIR" not in l]
    assert r.returncode == 1 and len(lines) == 1 and "TINYGPT_CHROMIUM" in lines[0] and "Traceback" not in r.stderr, r.stderr
