"""The argument types every command line shares (tinygpt's and the scripts'): core.values' checks
as argparse types, so a bad value is the parser's one-line error; and a setting's flag name."""
from __future__ import annotations

import argparse

from ..core import values
from ..core.errors import TinyGPTError


def flag(name: str) -> str:
    """An options field as the flag that sets it."""
    return "--" + name.replace("_", "-")


def as_type(check):
    """A value check (core.values, or any that raises a TinyGPTError naming options) as an argparse
    type: its error becomes argparse's, which the parser prints as one line naming the flag."""
    def parse(s):
        try:
            return check(s)
        except values.BadValue as e:
            raise argparse.ArgumentTypeError(str(e)) from None
        except TinyGPTError as e:
            raise argparse.ArgumentTypeError(e.worded(flag)) from None
    parse.__name__ = check.__name__       # argparse's error and settings_argv's number test read it
    return parse


positive_int = as_type(values.positive_int)
nonneg_int = as_type(values.nonneg_int)
positive_ints = as_type(values.positive_ints)
seed_int = as_type(values.seed_int)
positive_float = as_type(values.positive_float)
nonneg_float = as_type(values.nonneg_float)
unit_float = as_type(values.unit_float)
loss_scale_float = as_type(values.loss_scale_float)
lora_targets = as_type(values.lora_targets)
preset_name = as_type(values.preset_name)


def bounded_int(lo: int, hi: int):
    return as_type(values.bounded_int(lo, hi))
