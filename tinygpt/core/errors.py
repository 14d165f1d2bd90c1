"""The errors a user can act on, and how options are named in them.

Below the CLI, no module knows flag names. An error names an option as
{opt:NAME} (NAME is the options dataclass field, e.g. {opt:batch}); str(e)
words it plainly ("batch"), and the CLI words it as its flag.
Each error class carries the exit code the CLI returns for it.
"""
from __future__ import annotations

import re
import sys

_OPT = re.compile(r"\{opt:(\w+)\}")


def plain(name: str) -> str:
    return name.replace("_", "-")


class TinyGPTError(Exception):
    """One line of text for the user; exit_code for the CLI. `wording` names its options in str():
    plain by default; the Python API sets its own (its keywords) on what it raises."""
    exit_code = 1
    wording = None

    def __init__(self, text: str, exit_code: int | None = None):
        super().__init__(text)
        self.text = text
        if exit_code is not None:
            self.exit_code = exit_code

    def worded(self, name_option=plain) -> str:
        return _OPT.sub(lambda m: name_option(m.group(1)), self.text)

    def __str__(self) -> str:
        return self.worded(self.wording or plain)


class UsageError(TinyGPTError, ValueError):
    """An option's value (or a combination of them) that cannot work: exit 2."""
    exit_code = 2


class OutputError(UsageError):
    """An output that is not ours to write, or cannot be written: refused before any work."""


_wording = [plain]


def set_wording(name_option):
    """The CLI names options as flags in warnings too."""
    _wording[0] = name_option


def with_names(text: str, name_option=plain) -> str:
    """Text written with {opt:NAME}, each option named by name_option (a flag, a keyword)."""
    return _OPT.sub(lambda m: name_option(m.group(1)), text)


def word(text: str) -> str:
    """Text for the user with its options named as the CLI names them."""
    return _OPT.sub(lambda m: _wording[0](m.group(1)), text)


def warn(text: str, file=None):
    """One warning line on stderr; options named as in errors."""
    print("tinygpt: warning: " + _OPT.sub(lambda m: _wording[0](m.group(1)), text), file=file or sys.stderr)
