"""The argument types every command line shares (tinygpt's and the scripts'): each parses one
flag's value or raises argparse's error, which the parser prints as one line."""
from __future__ import annotations

import argparse

from ..core.config import PRESETS
from ..core.lora import TARGETS


def flag(name: str) -> str:
    """An options field as the flag that sets it."""
    return "--" + name.replace("_", "-")


def _number(s, kind, ok, need: str):
    """s as kind (int or float), or argparse's one-line error; then ok(value), or "must be need"."""
    try:
        v = kind(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {'a whole number' if kind is int else 'a number'}, got {s!r}")
    if not ok(v):
        raise argparse.ArgumentTypeError(f"must be {need}, got {v if kind is int else s}")
    return v


def positive_int(s):
    return _number(s, int, lambda v: v > 0, "positive")


def bounded_int(lo: int, hi: int):
    """A whole number from lo to hi: the one bound of a flag, whatever command takes it."""
    def parse(s):
        v = positive_int(s) if lo >= 1 else nonneg_int(s)
        if not lo <= v <= hi:
            raise argparse.ArgumentTypeError(f"must be {lo:,} to {hi:,}, got {v:,}")
        return v
    parse.__name__ = "bounded_int"
    return parse


def positive_ints(s):
    """Comma-separated positive whole numbers (sizes, sequence lengths)."""
    parts = [t.strip() for t in str(s).split(",") if t.strip()]
    if not parts:
        raise argparse.ArgumentTypeError(f"expected comma-separated whole numbers, got {s!r}")
    return [positive_int(t) for t in parts]


def lora_targets(s):
    names = [t.strip() for t in str(s).split(",") if t.strip()]
    bad = [t for t in names if t not in TARGETS]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"expected a comma-separated list of {', '.join(TARGETS)}, got {s!r}")
    return names


def preset_name(s):
    if s not in PRESETS:
        raise argparse.ArgumentTypeError(f"unknown preset {s!r}; choose one of {', '.join(PRESETS)}")
    return s


def nonneg_int(s):
    return _number(s, int, lambda v: v >= 0, ">= 0")


def seed_int(s):
    v = nonneg_int(s)
    if v >= 2 ** 63:
        raise argparse.ArgumentTypeError(f"must be below 2**63, got {v}")
    return v


def positive_float(s):
    return _number(s, float, lambda v: v > 0 and v != float("inf"), "a positive finite number")


def loss_scale_float(s):
    v = positive_float(s)
    if not 2.0 ** -24 <= v <= 2.0 ** 120:
        raise argparse.ArgumentTypeError(f"must be from 2**-24 to 2**120, got {s}")
    return v


def unit_float(s):
    return _number(s, float, lambda v: 0 <= v < 1, "a number from 0 to 1 (not included)")


def nonneg_float(s):
    return _number(s, float, lambda v: v >= 0 and v != float("inf"), "a finite number >= 0")
