#!/usr/bin/env python3
"""One command for a GPU: every measurement this project makes, in one report.

Runs, each as its own process (a section that fails is reported, the rest still run):
  tune               `tinygpt tune`: the kernel variants raced, the winners and peaks cached
  probes             scripts/probe_adapter.py: FMA, load and broadcast rates
  matmul             scripts/bench_matmul.py: every matmul variant, 256^3 up to 4096^3 on a GPU,
                     float32 and (where a bf16 kernel exists) bf16 operands, the
                     backward's mixed ones, and with shader-f16 the f16 kernels and their mix
  attention          scripts/compare_attention.py: the seed's ladder T = 256, 1024, 4096 (and on a
                     GPU 8192, 16384) at B=1 H=1 hd=64, plus a training shape B=4 H=8 hd=64
  kernels            scripts/bench_kernels.py: the other kernels, each variant
  train              scripts/bench_train.py: tokens/s of the WebGPU trainer, preset by preset (fp32 also as a LoRA step)
                     from small up to the largest the memory plan says fits (gpt2 included),
                     in fp32, bf16 and (with shader-f16) f16
  profile            `tinygpt train --profile --json`: per-kernel time and share of the peaks
and writes DIR/report.md (every table, the adapter, the time each section took), the JSON Lines
of each section (DIR/*.jsonl), its log (DIR/logs/), and plots (DIR/*.png).

    python scripts/gpu_report.py --out report/            # a GPU: within 8 minutes on a data-centre one
    python scripts/gpu_report.py --out report/ --quick    # a CPU adapter (lavapipe): within 10 minutes
    python scripts/gpu_report.py --out report/ --quick --smallest   # seconds: every section, tiny sizes

The tuning it writes goes to the usual cache (TINYGPT_CACHE_DIR overrides), so later runs on
this adapter use the winners.
"""
import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from tinygpt.core.config import preset
from tinygpt.core.errors import TinyGPTError
from tinygpt.tokenizers import get_tokenizer
from tinygpt.device.gpu import GPU
from tinygpt.device.planner import make_plan
from tinygpt.model.budget import device_limits, memory_budget
from tinygpt.commands.tables import fmt
from tinygpt.commands.argtypes import positive_int
from tinygpt.commands.cli import run_script
from tinygpt.model.spec import RunSpec

HERE = Path(__file__).resolve().parent
MARK = "tinygpt gpu_report"     # the first line of every report.md this script writes
PRESETS_UP = ["small", "medium", "large", "xl", "huge", "massive", "mega", "gpt2"]


def sizes(gpu_like: bool, quick: bool, smallest: bool) -> dict:
    """What each section measures, by the kind of adapter and the mode."""
    if smallest:
        return {"matmul": "64", "attention_T": "64", "train_shape_T": "64", "presets": ["tiny"], "steps": 2,
                "kernels_preset": "tiny", "probe": ["--invocations", "256", "--iters", "16"], "tune_quick": True,
                "profile": ["tiny"]}
    if quick or not gpu_like:
        return {"matmul": "256,512,1024", "attention_T": "256,1024", "train_shape_T": "256",
                "presets": ["small", "medium"], "steps": 5, "kernels_preset": "small", "probe": [],
                "tune_quick": quick, "profile": ["small"]}
    return {"matmul": "256,512,1024,2048,4096", "attention_T": "256,1024,4096,8192,16384", "train_shape_T": "1024",
            "presets": PRESETS_UP, "steps": 20, "kernels_preset": "medium", "probe": [], "tune_quick": False,
            "profile": ["small", "gpt2"]}


def run_section(out: Path, name: str, argv: list, env: dict, timeout: int) -> dict:
    """Run one measurement; its stdout (JSON Lines) to NAME.jsonl, stderr to logs/NAME.log."""
    t0 = time.perf_counter()
    try:
        r = subprocess.run([sys.executable, *argv], capture_output=True, text=True, env=env, timeout=timeout)
        rc, stdout, stderr = r.returncode, r.stdout, r.stderr
    except subprocess.TimeoutExpired as e:
        # the partial output of a timed-out run arrives as bytes whatever text= asked for
        text = lambda b: b.decode("utf-8", "replace") if isinstance(b, bytes) else (b or "")
        rc, stdout, stderr = "timeout", text(e.stdout), text(e.stderr) + f"\nstopped after {timeout} s"
    secs = time.perf_counter() - t0
    (out / "logs").mkdir(exist_ok=True)
    (out / "logs" / f"{name}.log").write_text(stderr)
    rows = []
    for line in stdout.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                rows.append(json.loads(line))
            except ValueError:
                pass
    (out / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    tail = "\n".join(stderr.strip().splitlines()[-5:])
    print(f"{name}: {'ok' if rc == 0 else f'failed ({rc})'} in {secs:.1f} s", file=sys.stderr)
    shown = " ".join("tinygpt" if a == "-m" else "" if a == "tinygpt" and i and argv[i - 1] == "-m" else
                     (f"scripts/{Path(a).name}" if a.startswith(str(HERE)) else a) for i, a in enumerate(argv))
    return {"name": name, "rc": rc, "seconds": secs, "rows": rows, "tail": tail, "cmd": " ".join(shown.split())}


def merged(name: str, runs: list, rows: list, cmd: str, notes=()) -> dict:
    """One report section from several runs (a preset each): failed if any failed."""
    return {"name": name, "rc": 1 if any(r["rc"] != 0 for r in runs) else 0,
            "seconds": sum(r["seconds"] for r in runs), "rows": rows, "cmd": cmd,
            "tail": "\n".join([r["tail"] for r in runs if r["rc"] != 0] + list(notes))}


def md_table(rows: list, columns: list) -> str:
    cols = [c for c in columns if any(c in r for r in rows)]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        lines.append("| " + " | ".join(fmt(r.get(c)).replace("|", "/") for c in cols) + " |")
    return "\n".join(lines)


COLUMNS = {
    "tune": ["kernel", "variant", "ms", "chosen"],
    "probes": ["probe", "what", "rate", "unit", "ms"],
    "matmul": ["kernel", "dtype", "M", "N", "K", "ms", "gflops", "pct_fma_peak", "numpy_gflops", "max_err", "tile"],
    "attention": ["impl", "T", "B", "H", "hd", "pass", "ms", "scratch_bytes", "max_err", "naive_over_online", "status"],
    "attention_train_shape": ["impl", "T", "B", "H", "hd", "pass", "ms", "scratch_bytes", "max_err",
                              "naive_over_online", "status"],
    "kernels": ["kernel", "variant", "entry", "shape", "ms", "max_err", "speedup"],
    "train": ["trainer", "preset", "precision", "steps", "tokens_per_s", "final_loss", "lora_over_full", "what"],
    "profile": ["preset", "group", "kernel", "calls", "ms", "gflops", "gbps", "pct_peak", "mfu"],
}


def plots(out: Path, results: dict) -> list:
    """GFLOP/s of each matmul variant against size; tokens/s per preset. Returns the files written."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    files = []
    mm = results.get("matmul", {}).get("rows", [])
    if mm:
        fig, ax = plt.subplots(figsize=(7, 4))
        for kernel, dtype in sorted({(r["kernel"], r.get("dtype", "f32")) for r in mm}):   # one line each
            pts = sorted((r["M"], r["gflops"]) for r in mm if r["kernel"] == kernel and r.get("dtype", "f32") == dtype)
            ax.plot(*zip(*pts), "o-" if dtype == "f32" else "s--", label=f"{kernel} {dtype}", lw=1)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("M = N = K")
        ax.set_ylabel("GFLOP/s")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6, ncol=2)
        fig.tight_layout()
        fig.savefig(out / "matmul.png", dpi=100)
        plt.close(fig)
        files.append("matmul.png")
    tr = [r for r in results.get("train", {}).get("rows", []) if r.get("trainer") == "webgpu"]
    if tr:
        fig, ax = plt.subplots(figsize=(7, 3.5))
        presets = list(dict.fromkeys(r["preset"] for r in tr))
        for precision, marker in (("fp32", "o"), ("bf16", "s"), ("f16", "^")):   # markers: a log axis has no bar floor
            rows = {r["preset"]: r["tokens_per_s"] for r in tr if r.get("precision", "fp32") == precision}
            xs = [j for j, p in enumerate(presets) if p in rows]
            ax.plot(xs, [rows[presets[j]] for j in xs], marker, label=precision)
        ax.set_xticks(range(len(presets)), presets)
        ax.legend(fontsize=8)
        ax.set_yscale("log")
        ax.set_ylabel("tokens/s (training)")
        ax.grid(alpha=0.3, axis="y")
        fig.tight_layout()
        fig.savefig(out / "train.png", dpi=100)
        plt.close(fig)
        files.append("train.png")
    return files


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="directory for report.md, the JSON Lines, logs and plots")
    ap.add_argument("--quick", action="store_true", help="the sizes a CPU adapter finishes within 10 minutes")
    ap.add_argument("--smallest", action="store_true", help="the smallest sizes: every section in seconds (tests)")
    ap.add_argument("--data", help="text file for the training sections (default: the built-in corpus)")
    ap.add_argument("--tokenizer-file", help="r50k_base.tiktoken, for the gpt2 preset's profile where tiktoken "
                                             "cannot download it")
    ap.add_argument("--section-timeout", type=positive_int, default=600, help="seconds before a section is stopped")
    args = ap.parse_args(argv)
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise SystemExit(f"error: --out {out} exists and is not a directory; choose another")
    report = out / "report.md"
    ours = report.is_file() and MARK in report.read_bytes()[:200].decode("utf-8", "replace")
    if report.exists() and not ours:
        raise SystemExit(f"gpu_report: error: {report} was not written by this script; choose another --out")
    # the files a report writes, in a directory it did not make: never replaced
    if out.is_dir() and not ours:
        theirs = sorted(p for pat in ("*.jsonl", "*.png", "logs/*.log") for p in out.glob(pat))
        if theirs:
            raise SystemExit(f"gpu_report: error: --out {out} holds {theirs[0].relative_to(out)}, which this script "
                             "did not write and would replace; choose an empty or new --out")
    try:
        out.mkdir(parents=True, exist_ok=True)
        report.write_text(f"# {MARK} (in progress)\n")     # marks the directory as this script's
    except OSError as e:
        raise SystemExit(f"gpu_report: error: --out {out}: {e.strerror}; choose a directory you can write")

    gpu = GPU()
    plan = make_plan(gpu)
    adapter = f"{gpu.name} ({gpu.backend})"
    info = dict(gpu.adapter.info)
    S = sizes(not gpu.is_cpu, args.quick, args.smallest)
    limits = device_limits(gpu)
    fits_here = lambda p: memory_budget(RunSpec(preset(p), "online"), plan, limits).fits
    env = dict(os.environ)
    data = ["--data", args.data] if args.data else []
    t_all = time.perf_counter()
    results = {}

    def section(name, argv):
        results[name] = run_section(out, name, argv, env, args.section_timeout)

    section("tune", ["-m", "tinygpt", "tune", "--json"] + (["--quick"] if S["tune_quick"] else []))
    section("probes", [str(HERE / "probe_adapter.py"), "--json"] + S["probe"])
    f16 = "shader-f16" in gpu.features          # the f16 rows where WGSL's f16 exists on this adapter
    section("matmul", [str(HERE / "bench_matmul.py"), "--json", "--sizes", S["matmul"], "--dtypes",
                       "f32,bf16,mixed" + (",f16,f16mixed" if f16 else "")])
    section("attention", [str(HERE / "compare_attention.py"), "--json", "--T", S["attention_T"],
                          "--plot", str(out / "attention.png")])
    section("attention_train_shape", [str(HERE / "compare_attention.py"), "--json", "--T", S["train_shape_T"],
                                      "--batch", "4", "--heads", "8", "--head-dim", "64"])
    section("kernels", [str(HERE / "bench_kernels.py"), "--json", "--preset", S["kernels_preset"]])
    fits = [p for p in S["presets"] if fits_here(p)]
    train_rows, train_runs = [], []
    for p in fits:
        for precision in ("fp32", "bf16") + (("f16",) if f16 else ()):   # the 16-bit speeds lavapipe cannot give
            name = f"train_{p}" + ("" if precision == "fp32" else f"_{precision}")
            lora = ["--lora", "8"] if precision == "fp32" else []     # a LoRA step beside the full one
            argv = [str(HERE / "bench_train.py"), "--json", "--preset", p, "--steps", str(S["steps"]),
                    "--trainers", "webgpu", "--precision", precision] + lora + data
            r = run_section(out, name, argv, env, args.section_timeout)
            train_runs.append(r)
            train_rows += r["rows"]
    results["train"] = merged("train", train_runs, train_rows,
                              f"scripts/bench_train.py --preset P --steps {S['steps']} --trainers webgpu --precision "
                              f"fp32|bf16{'|f16' if f16 else ''} (fp32 with --lora 8 too), P in {', '.join(fits)} (the "
                              f"presets the memory budget fits)")
    prof_rows, prof_runs, skipped = [], [], []
    for p in S["profile"]:
        if p not in fits and p != "tiny" and not fits_here(p):
            continue
        if p == "gpt2":          # its tokenizer's file: tiktoken's cache, or --tokenizer-file (no download here)
            try:
                get_tokenizer("gpt2", args.tokenizer_file)
            except TinyGPTError as e:
                skipped.append(f"gpt2 profile skipped: {str(e).splitlines()[0][:200]}")
                print(skipped[-1], file=sys.stderr)
                continue
        tok = ["--tokenizer-file", args.tokenizer_file] if p == "gpt2" and args.tokenizer_file else []
        r = run_section(out, f"profile_{p}", ["-m", "tinygpt", "train", "--preset", p, "--profile", "--json"]
                        + tok + data, env, args.section_timeout)
        prof_runs.append(r)
        step = next((x for x in r["rows"] if x.get("kernel") == "step"), {})
        prof_rows += [dict(x, preset=p) for x in r["rows"] if x.get("kernel") != "step"][:12]
        if step:
            prof_rows.append(dict(step, preset=p, group="(step)"))
    results["profile"] = merged("profile", prof_runs, prof_rows,
                                "tinygpt train --preset P --profile --json, P in " + ", ".join(S["profile"]), skipped)
    # the matmul rows against the FMA peak the tune section measured
    peak = next((r for r in results["probes"]["rows"] if r.get("probe") == "probe_fma"), {}).get("rate")
    for r in results["matmul"]["rows"]:
        if peak:
            r["pct_fma_peak"] = 100 * r["gflops"] / peak
    total = time.perf_counter() - t_all
    pngs = plots(out, results) + (["attention.png"] if (out / "attention.png").exists() else [])

    mode = "smallest" if args.smallest else "quick" if args.quick else "full"
    lines = [f"# {MARK}: {adapter}", "",
             f"Adapter: {adapter}; vendor {info.get('vendor', '?')}, architecture {info.get('architecture', '?')}, "
             f"driver {info.get('driver', '?')} {info.get('driver_description', '')}".rstrip(),
             f"Mode: {mode}; {total:.0f} s in all; written {time.strftime('%Y-%m-%d %H:%M:%S')}.",
             f"Limits: binding {limits['max_binding']:,} bytes, buffer {limits['max_buffer']:,} bytes, workgroup "
             f"memory {gpu.limits.get('max-compute-workgroup-storage-size', 0):,} bytes, "
             f"{gpu.limits.get('max-compute-invocations-per-workgroup', 0)} invocations per workgroup.", ""]
    titles = {"tune": "Tuning (the winners are cached)", "probes": "Adapter probes",
              "matmul": "Matmuls (GFLOP/s; pct_fma_peak against the probe's FMA rate)",
              "attention": "Attention ladder, B=1 H=1 hd=64 (the seed's)",
              "attention_train_shape": "Attention at a training shape, B=4 H=8 hd=64",
              "kernels": "Other kernels", "train": "Training throughput per preset (WebGPU trainer)",
              "profile": "One training step per kernel (the 12 slowest, then the step)"}
    for name, title in titles.items():
        r = results[name]
        status = "ok" if r["rc"] == 0 else f"**failed ({r['rc']})**"
        lines += [f"## {title}", "", f"`{r['cmd']}`: {status}, {r['seconds']:.1f} s", ""]
        if r["rows"]:
            lines += [md_table(r["rows"], COLUMNS[name]), ""]
        if r["tail"] and (r["rc"] != 0 or name == "profile"):
            lines += ["```", r["tail"], "```", ""]
    lines += ["## Plots", ""] + [f"![{p}]({p})" for p in pngs] + [""]
    (out / "report.md").write_text("\n".join(lines))
    print(f"{out / 'report.md'}: {len(results)} sections in {total:.0f} s", file=sys.stderr)
    failed = [n for n, r in results.items() if r["rc"] != 0]
    if failed:
        print(f"failed sections: {', '.join(failed)} (see {out / 'logs'})", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    run_script("gpu_report", main)
