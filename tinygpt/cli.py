"""The command line: tinygpt train | eval | sample | info | export."""
from __future__ import annotations

import argparse
import json
import sys


def cmd_info(args) -> int:
    from .gpu import GPU
    gpu = GPU()
    if args.brief:
        print(f"{gpu.name} ({gpu.backend})")
        return 0
    info = {"adapter": gpu.name, "backend": gpu.backend,
            "adapter_type": gpu.adapter.info.get("adapter_type", ""),
            "features": sorted(gpu.features),
            "limits": {k: gpu.limits[k] for k in sorted(gpu.limits)
                       if any(w in k for w in ("storage", "buffer-size", "workgroup", "invocations"))}}
    if args.json:
        print(json.dumps(info, indent=2))
    else:
        print(f"adapter   {info['adapter']}\nbackend   {info['backend']} ({info['adapter_type']})")
        print(f"features  {', '.join(info['features']) or '-'}")
        for k, v in info["limits"].items():
            print(f"  {k:45s} {v:,}")
    return 0


def build_parser():
    ap = argparse.ArgumentParser(prog="tinygpt", description=__doc__)
    ap.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("info", help="adapter, backend, features and limits")
    p.add_argument("--json", action="store_true")
    p.add_argument("--brief", action="store_true", help="one line: adapter (backend)")
    p.set_defaults(fn=cmd_info)
    return ap


def main(argv=None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    try:
        return args.fn(args)
    except KeyboardInterrupt:
        return 130
    except Exception as e:
        if args.debug:
            raise
        print(f"tinygpt: error: {e}", file=sys.stderr)
        return 1
