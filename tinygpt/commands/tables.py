"""Rows of results as an aligned table or as JSON Lines: `tinygpt tune` and every script print
their measurements this way."""
from __future__ import annotations

import json
import sys


def emit(rows, as_json: bool, columns, file=None):
    """Rows as JSON Lines on stdout, or as an aligned table."""
    file = file or sys.stdout
    if as_json:
        for r in rows:
            print(json.dumps(r), file=file)
        return
    widths = [max(len(c), *(len(fmt(r.get(c))) for r in rows)) for c in columns]
    print("  ".join(c.rjust(w) for c, w in zip(columns, widths)), file=file)
    for r in rows:
        print("  ".join(fmt(r.get(c)).rjust(w) for c, w in zip(columns, widths)), file=file)


def fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        if v == 0:
            return "0"
        if abs(v) >= 1000:
            return f"{v:,.0f}"
        if abs(v) >= 1:
            return f"{v:.3f}"
        return f"{v:.3g}" if abs(v) >= 1e-3 else f"{v:.2e}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)
