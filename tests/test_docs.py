"""The front door runs as written: every `sh` and `python` block of README.md, docs/usage.md and
docs/api.md, run in order in a directory laid out as the checkout is after `make train` (its
`.venv`, `configs/`, `runs/small.tinygpt`), with the texts the examples name made here. Only the
sizes change: fewer steps and tokens, so that the whole takes a minute or two. `make` lines are
skipped (make test runs this), and so are downloads (their file is made here instead)."""
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = ["README.md", "docs/usage.md", "docs/api.md"]
BLOCK = re.compile(r"^```(sh|python)\n(.*?)^```", re.M | re.S)
SKIPPED = ("make ", "curl ", "wget ", "pip ")


def blocks(page: str) -> list[tuple[str, str]]:
    return BLOCK.findall((ROOT / page).read_text())


def smaller(line: str) -> str:
    """A command line with fewer steps and tokens: --steps N as 2 + N // 100, at most 10 (resumed
    runs still go further than the run before them), --minutes as 3 steps, sampling 20 tokens; a training
    run without a length gets 3 steps (a config's or LoRA's default would take minutes), and no
    evaluation or samples at its end."""
    code, sep, comment = line.partition(" #")
    code = re.sub(r"--steps (\d+)", lambda m: f"--steps {min(10, 2 + int(m[1]) // 100)}", code)
    code = re.sub(r"--minutes \S+", "--steps 3", code)
    code = re.sub(r"--tokens \d+", "--tokens 20", code)
    if re.search(r"\btinygpt train\b", code):
        if "--steps" not in code:
            code += " --steps 3"
        code += " --eval-every 0 --sample-tokens 0"      # no evaluation or samples at the end: seconds each
    return code + sep + comment


def script(lang: str, body: str) -> tuple[list[str], str]:
    if lang == "python":
        body = re.sub(r"\.train\((\d+)", lambda m: f".train({min(int(m[1]), 10)}", body)
        return [".venv/bin/python", "-"], body
    lines = [smaller(l) for l in body.splitlines() if not l.lstrip().startswith(SKIPPED)]
    return ["bash", "-e", "-"], "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def checkout(tmp_path_factory):
    venv = ROOT / ".venv"
    if not (venv / "bin" / "tinygpt").exists():
        pytest.skip("no .venv in the checkout (make test makes it)")
    d = tmp_path_factory.mktemp("checkout")
    (d / ".venv").symlink_to(venv)
    (d / "configs").symlink_to(ROOT / "configs")
    rng = np.random.default_rng(0)
    words = "thou art the king of all that lies between the sea and the hills my lord and lady".split()
    for name, n in (("tinyshakespeare.txt", 3000), ("my.txt", 800)):
        (d / name).write_text("\n".join(" ".join(rng.choice(words, 10)) for _ in range(n)) + "\n")
    r = subprocess.run([".venv/bin/tinygpt", "train", "--steps", "5", "--quiet", "--sample-tokens", "0",
                        "--eval-every", "0"], cwd=d, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and (d / "runs" / "small.tinygpt").exists(), r.stderr
    return d


@pytest.mark.parametrize("page", PAGES)
def test_every_command_block_runs(checkout, page):
    found = blocks(page)
    assert found, f"{page} has no sh or python block"
    for i, (lang, body) in enumerate(found):
        argv, text = script(lang, body)
        r = subprocess.run(argv, input=text, cwd=checkout, capture_output=True, text=True, timeout=900)
        err = "\n".join(l for l in r.stderr.splitlines() if "XDG_RUNTIME_DIR" not in l)
        print(f"\n{page}, block {i + 1} ({lang}): exit {r.returncode}")
        assert r.returncode == 0, f"{page}, block {i + 1}:\n{text}\n{err[-3000:]}"
        assert "Traceback" not in err, err[-3000:]


def test_smaller_keeps_the_meaning():
    assert smaller("tinygpt train --resume runs/small.tinygpt --steps 4000      # on to step 4000") == \
        "tinygpt train --resume runs/small.tinygpt --steps 10      --eval-every 0 --sample-tokens 0 # on to step 4000"
    assert smaller("tinygpt train --config configs/shakespeare.toml") == \
        "tinygpt train --config configs/shakespeare.toml --steps 3 --eval-every 0 --sample-tokens 0"
    assert smaller("tinygpt sample --model m --tokens 200") == "tinygpt sample --model m --tokens 20"
    assert script("sh", "make train\ncurl -Lo x y\ntinygpt eval --model m\n")[1] == "tinygpt eval --model m\n"
