#!/usr/bin/env python3
"""A training step in a real browser: headless Chromium's WebGPU replays what this host's
WebGPU dispatched for one AdamW step, and the loss and updated weights must agree.

  1. every shader module and pipeline the plans build (each WGSL file with the prelude, each
     override set of PLANS in tinygpt/web/step.py) is compiled in the browser, and its
     compiler must report no error and no warning;
  2. one step of the model (tiny by default, the portable plan) is recorded here as a trace
     (tinygpt/device/trace.py), replayed by tinygpt/web/replay.js, and its loss and every
     parameter compared with this host's (tolerances in tinygpt/web/step.py).

Everything is sized to the browser's limits. Needs Debian's `chromium` and the playwright
package (pip install 'tinygpt[browser]'); no browser is downloaded.

    python scripts/browser_step.py [--preset tiny] [--attention online] [--json]
"""
import argparse
import json
import sys
import time

from tinygpt.commands.argtypes import positive_float
from tinygpt.commands.cli import run_script
from tinygpt.core.config import PRESETS
from tinygpt.core.errors import TinyGPTError
from tinygpt.device.gpu import GPU
from tinygpt.model.attention import IMPLS
from tinygpt.web.browser import open_page
from tinygpt.web.step import compare, compiler_problems, decode, every_pipeline, traced_step


class Disagrees(TinyGPTError):
    pass


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    ap.add_argument("--attention", choices=IMPLS, default="online")
    ap.add_argument("--lr", type=positive_float, default=1e-3)
    ap.add_argument("--skip-compile", action="store_true", help="only the step, not every pipeline")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    gpu = GPU()
    report = {"host": f"{gpu.name} ({gpu.backend}, {gpu.engine_label})"}
    with open_page() as page:
        about = page.describe()
        report["browser"] = {"userAgent": about["userAgent"], "adapter": about["info"], "features": about["features"]}
        print(f"browser: {about['userAgent'].split(') ')[-1]} on {about['info'].get('vendor')} / "
              f"{about['info'].get('architecture')}", file=sys.stderr)
        if not args.skip_compile:
            t0 = time.perf_counter()
            built = page.compile(every_pipeline(gpu, about["limits"], args.preset, about["features"]))
            problems = compiler_problems(built)
            report["compile"] = {"modules": built["modules"], "pipelines": built["pipelines"],
                                 "problems": problems, "s": round(time.perf_counter() - t0, 1)}
            print(f"compile: {built['modules']} modules, {built['pipelines']} pipelines, "
                  f"{len(problems)} errors or warnings", file=sys.stderr)
            for line in problems:
                print(f"  {line}", file=sys.stderr)
        trace, expected = traced_step(gpu, about["limits"], args.preset, args.attention, lr=args.lr)
        t0 = time.perf_counter()
        out = page.replay(trace)
        problems = compiler_problems(out)
        if "outputs" not in out:
            raise Disagrees(f"the browser could not replay the step: {problems[0] if problems else 'no outputs'}")
        res = compare(decode(out["outputs"]), expected, args.lr)
        res.update(dispatches=len(trace["dispatches"]), problems=problems, s=round(time.perf_counter() - t0, 1))
        report["step"] = res
    print(f"step: {res['dispatches']} dispatches; loss {res['loss']:.7f} in the browser, {res['loss_expected']:.7f} "
          f"here (|diff| {res['loss_err']:.2e}); {res['params']:,} parameters, max |diff| {res['params_max_err']:.2e}",
          file=sys.stderr)
    if args.json:
        print(json.dumps(report, indent=2))
    if not res["ok"] or report.get("compile", {}).get("problems") or problems:
        raise Disagrees("the browser disagrees with this host (see above)")
    print("browser_step: ok", file=sys.stderr)
    return 0


if __name__ == "__main__":
    run_script("browser_step", main)
