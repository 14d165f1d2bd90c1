"""Shared fixtures: one GPU for the session, the compare helper every op test uses, and the inputs
several rooms' tests train and write on."""
import os
import subprocess
import tempfile

import numpy as np
import pytest

# Tests use the default kernel variants, whatever `tinygpt tune` cached on this machine
# (subprocesses inherit this too).
os.environ["TINYGPT_CACHE_DIR"] = tempfile.mkdtemp(prefix="tinygpt-test-cache-")
# Mesa's compiled shaders, though, are kept between test runs, as a user's are (without it every
# pytest process compiled every pipeline again): in a folder of the tests' own, where
# device/driver_cache.py keeps one folder per SIMD width, as it does for every run.
os.environ.setdefault("MESA_SHADER_CACHE_DIR", os.path.join(
    os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "tinygpt-tests-mesa"))


@pytest.fixture(scope="session")
def gpu():
    from tinygpt.device.gpu import GPU
    g = GPU()
    print(f"\nadapter: {g.name} ({g.backend})")
    return g


@pytest.fixture
def plan(gpu):
    """This device's kernel plan, as the application makes it (no tuning cache: see above); made
    per test, after any limit the test forces, as the application makes it after reading them."""
    from tinygpt.device.planner import make_plan
    return make_plan(gpu)


@pytest.fixture
def kn(gpu):
    """The launchers under the portable plan: the kernel tests force each variant themselves."""
    from tinygpt.device.kernels import Kernels
    from tinygpt.device.plan import PORTABLE
    return Kernels(gpu, PORTABLE)


def check(name, got, want, atol, rtol=0.0):
    """Assert |got - want| <= atol + rtol*|want| and print the max error seen (llm.c style)."""
    got = np.asarray(got, np.float64)
    want = np.asarray(want, np.float64)
    assert got.shape == want.shape, f"{name}: shape {got.shape} != {want.shape}"
    err = np.abs(got - want)
    ok = bool(np.all(err <= atol + rtol * np.abs(want)))
    print(f"{name:40s} {'OK ' if ok else 'BAD'} maxdiff={err.max() if err.size else 0:.3e} (atol {atol:g}, rtol {rtol:g})")
    assert ok, f"{name}: max error {err.max():.3e} over atol {atol} + rtol {rtol}"
    return float(err.max()) if err.size else 0.0


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


from support import SHARED  # noqa: E402  (the tests' folder is on sys.path: conftest's own)


@pytest.fixture
def corpus(tmp_path):
    """60 kB of Tiny Shakespeare where a copy lies beside the checkout (../shared), else a line
    repeated: the tests pass without it."""
    p = tmp_path / "corpus.txt"
    text = (SHARED / "tinyshakespeare.txt").read_text()[:60_000] if (SHARED / "tinyshakespeare.txt").exists() \
        else ("To be, or not to be, that is the question. " * 1500)
    p.write_text(text)
    return p


@pytest.fixture
def sentences(tmp_path):
    """A sentence repeated: a corpus that trains in a few steps, whatever lies beside the checkout (the
    runs', the files' and the failures' tests; the model's and the CLI's take `corpus`)."""
    p = tmp_path / "c.txt"
    p.write_text("It was the best of times, it was the worst of times. " * 300)
    return p


@pytest.fixture
def tmpfs(tmp_path):
    """A 256 KiB file system: too small for a tiny checkpoint (~850 KB)."""
    d = tmp_path / "small"
    d.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(d)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (not root, or no mount namespace)")
    yield d
    subprocess.run(["umount", str(d)], capture_output=True)
