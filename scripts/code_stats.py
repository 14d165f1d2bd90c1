#!/usr/bin/env python3
"""Figures of the code's shape, for a before-and-after: the README's lines, the largest modules,
the longest functions, branches on a precision outside the policy, and imports inside functions.

    python scripts/code_stats.py                 # this checkout
    python scripts/code_stats.py --root DIR --json

A branch counts as a precision branch when its test names a precision (`bf16`, `fp32`, `f16`,
`precision`, or a variable `bf`); "by name" narrows that to tests comparing with a precision's
name or a flag standing for one (`== "bf16"`, `if bf`), which is what the policy replaces. The
policy's own module (tinygpt/core/precision.py, where present) is left out.
"""
import argparse
import ast
import json
import re
import sys
from pathlib import Path

PRECISION = re.compile(r"bf16|\bbf\b|precision|fp32|f16")
BY_NAME = re.compile(r"""==\s*["'](bf16|fp32|f16)["']|!=\s*["'](bf16|fp32|f16)["']"""
                     r"""|^\s*(not\s+)?bf\b|\bbf\s+and\b|\band\s+bf\b""")
POLICY = "tinygpt/core/precision.py"


def stats(root: Path) -> dict:
    pkg = root / "tinygpt"
    if not pkg.is_dir():
        raise SystemExit(f"error: {root} has no tinygpt/ package; give the root of a checkout with --root")
    files = sorted(pkg.rglob("*.py"))
    sizes, funcs, branches, by_name, inner = [], [], 0, 0, 0
    for f in files:
        rel = f.relative_to(root).as_posix()
        src = f.read_text()
        tree = ast.parse(src)
        sizes.append((len(src.splitlines()), rel))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                funcs.append((node.end_lineno - node.lineno + 1, f"{rel}:{node.lineno} {node.name}"))
                inner += sum(isinstance(s, (ast.Import, ast.ImportFrom)) for s in ast.walk(node) if s is not node)
            if isinstance(node, (ast.If, ast.IfExp)) and rel != POLICY:
                test = ast.get_source_segment(src, node.test) or ""
                branches += bool(PRECISION.search(test))
                by_name += bool(BY_NAME.search(test))
    readme = root / "README.md"
    return {"readme_lines": len(readme.read_text().splitlines()) if readme.exists() else None,
            "modules": len(files), "largest_files": sorted(sizes, reverse=True)[:8],
            "longest_functions": sorted(funcs, reverse=True)[:5],
            "precision_branches": branches, "precision_branches_by_name": by_name,
            "imports_inside_functions": inner}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", default=str(Path(__file__).resolve().parents[1]), help="a checkout (default: this one)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    s = stats(Path(args.root))
    if args.json:
        print(json.dumps(s))
        return 0
    print(f"README lines                        {s['readme_lines']}")
    print(f"modules                             {s['modules']}")
    print("largest files                       " + ", ".join(f"{p} {n}" for n, p in s["largest_files"]))
    print("longest functions                   " + ", ".join(f"{p} {n}" for n, p in s["longest_functions"]))
    print(f"precision branches (by name)        {s['precision_branches']} ({s['precision_branches_by_name']})")
    print(f"imports inside functions            {s['imports_inside_functions']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
