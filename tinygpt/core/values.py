"""The checks of one setting's value, as text or as the value: each returns the value parsed, or
raises BadValue with what it must be. The recipe (run/options.py) names a setting's check here;
the command lines wrap the same functions as their flags' types (commands/argtypes.py), so a
value is checked alike from a flag, a config file or the Python API."""
from __future__ import annotations

from .config import PRESETS
from .lora import TARGETS


class BadValue(ValueError):
    """What a value must be, in one line: "must be positive, got -3"."""


def _number(s, kind, ok, need: str):
    """s as kind (int or float), or what it must be; then ok(value), or "must be need"."""
    try:
        v = kind(s)
    except ValueError:
        raise BadValue(f"expected {'a whole number' if kind is int else 'a number'}, got {s!r}") from None
    if not ok(v):
        raise BadValue(f"must be {need}, got {v if kind is int else s}")
    return v


def positive_int(s):
    return _number(s, int, lambda v: v > 0, "positive")


def nonneg_int(s):
    return _number(s, int, lambda v: v >= 0, ">= 0")


def bounded_int(lo: int, hi: int):
    """A whole number from lo to hi: the one bound of a setting, whatever command takes it."""
    def check(s):
        v = positive_int(s) if lo >= 1 else nonneg_int(s)
        if not lo <= v <= hi:
            raise BadValue(f"must be {lo:,} to {hi:,}, got {v:,}")
        return v
    check.__name__ = "bounded_int"
    return check


def positive_ints(s):
    """Comma-separated positive whole numbers (sizes, sequence lengths)."""
    parts = [t.strip() for t in str(s).split(",") if t.strip()]
    if not parts:
        raise BadValue(f"expected comma-separated whole numbers, got {s!r}")
    return [positive_int(t) for t in parts]


def seed_int(s):
    v = nonneg_int(s)
    if v >= 2 ** 63:
        raise BadValue(f"must be below 2**63, got {v}")
    return v


def positive_float(s):
    return _number(s, float, lambda v: v > 0 and v != float("inf"), "a positive finite number")


def nonneg_float(s):
    return _number(s, float, lambda v: v >= 0 and v != float("inf"), "a finite number >= 0")


def unit_float(s):
    return _number(s, float, lambda v: 0 <= v < 1, "a number from 0 to 1 (not included)")


def loss_scale_float(s):
    v = positive_float(s)
    if not 2.0 ** -24 <= v <= 2.0 ** 120:
        raise BadValue(f"must be from 2**-24 to 2**120, got {s}")
    return v


def lora_targets(s):
    names = [t.strip() for t in str(s).split(",") if t.strip()]
    bad = [t for t in names if t not in TARGETS]
    if bad or not names:
        raise BadValue(f"expected a comma-separated list of {', '.join(TARGETS)}, got {s!r}")
    return names


def preset_name(s):
    if s not in PRESETS:
        raise BadValue(f"unknown preset {s!r}; choose one of {', '.join(PRESETS)}")
    return s
