"""tinygpt train's settings as flags, made from the recipe's fields (run/options.py: each one's
help, default, check and group), and the same check for any mapping of them (a --config file,
the Python API's keywords), so that a setting is checked alike wherever it comes from. The
command line (cli.py) and the Python API (api.py) both take train's settings from here; neither
reads the other.
"""
from __future__ import annotations

import argparse
import re
from dataclasses import fields

from .argtypes import as_type, flag
from ..core.errors import UsageError, with_names
from ..core.fs import read_user_file
from ..run.options import GROUP_OF, GROUPS, TrainOptions

EXIT_USAGE = 2
SETTINGS = {f.name: f for f in fields(TrainOptions)}


def options(cls, args):
    """The options dataclass of a command, from its parsed flags (same names)."""
    return cls(**{f.name: getattr(args, f.name) for f in fields(cls) if hasattr(args, f.name)})


def default(cls, name: str):
    """The default an options class gives a field: the flags take theirs from there, so each
    default is written once (options.py)."""
    return next(f.default for f in fields(cls) if f.name == name)


# ---- parser -------------------------------------------------------------------------------------
class Parser(argparse.ArgumentParser):
    """Usage errors as one line on stderr (exit 2), not argparse's usage block."""

    def error(self, message):
        self.exit(EXIT_USAGE, f"tinygpt: error: {message}; see '{self.prog} --help'\n")


def cli_words(text: str) -> str:
    """Help written with {opt:NAME} as the command line shows it: each option as its flag."""
    return with_names(text, flag)


def add_setting(p, name: str, dest: str | None = None):
    """The flag of a setting of the recipe (options.TrainOptions), made from its field: its help,
    default, check, choices and aliases; eval, sample and the rest take the ones they share this way."""
    f = SETTINGS[name]
    m = f.metadata
    kw = {"help": cli_words(m["help"]), "default": f.default_factory() if callable(f.default_factory) else f.default}
    if m["toggle"]:
        kw["action"] = argparse.BooleanOptionalAction
    else:
        kw.update(type=as_type(m["check"]) if m["check"] else None, choices=m["choices"], metavar=m["metavar"])
    names = [flag(name)] + [flag(a) for a in m["aliases"]]
    return p.add_argument(*names, dest=dest or name, **kw)


def train_flags(p):
    """Every flag of `tinygpt train`, one a setting of the recipe, in its group's section of the
    help (options.GROUPS): plan takes them all too, so any training command can be planned by
    changing its verb. Then the two that ask for a profile instead of a run."""
    sections = {g: p.add_argument_group(title) for g, (title, _) in GROUPS.items()}
    for name, f in SETTINGS.items():
        add_setting(sections[f.metadata["group"]], name)
    p.add_argument("--profile", action="store_true",
                   help="run a few steps, print the GPU time, GFLOP/s, GB/s and share of the adapter's peak of "
                        "each kernel of one step, and the step's MFU, and exit")
    p.add_argument("--json", action="store_true",
                   help="JSON: with --profile, JSON Lines, one row per kernel, then the step; for plan, the budget")


class RaisingParser(Parser):
    """A parser whose errors are UsageErrors: settings given as a mapping (a TOML file, the
    Python API's keywords) are checked by the very flags that check the command line."""

    def error(self, message):
        raise UsageError(message)


NUMBER_TYPES = ("_int", "_float")      # the argument types of train's numeric flags (argtypes)
# settings of which one alone is given: the command line's drops a config file's other (it wins)
ONE_OF = (("steps", "minutes"),)


def flat_config(table: dict, label: str) -> dict:
    """Train's settings by name, from a config file's tables or the API's keywords: bare keys as
    they are, a table named as a group of the recipe ([training], [optimization], ...:
    options.GROUPS) opened, each key in the table of its group."""
    flat = {k: v for k, v in table.items() if not (k in GROUPS and isinstance(v, dict))}
    for group in (k for k, v in table.items() if k in GROUPS and isinstance(v, dict)):
        for key, value in table[group].items():
            if GROUP_OF.get(key) != group:
                where = f"it belongs in [{GROUP_OF[key]}] or outside any table" if key in GROUP_OF else \
                    "it is not a setting of tinygpt train"
                raise UsageError(f"{label}: [{group}] holds {key!r}, but {where}")
            if key in flat:
                raise UsageError(f"{label}: {key} is given twice, in [{group}] and outside it")
            flat[key] = value
    return flat


def settings_argv(mapping: dict, source: str, exclude=("profile", "json", "config")) -> list[str]:
    """A mapping of train's flags by long name ("d_model": 96, "recompute": True) as the command
    line that says the same: parsed by train's own flags, so each value is checked as the flag
    would check it, and a command line placed after it overrides it."""
    p = RaisingParser(prog="tinygpt train", add_help=False)
    train_flags(p)
    known = p._option_string_actions
    argv = []
    for key, value in flat_config(mapping, source).items():
        name = flag(str(key))
        action = known.get(name) if key not in exclude else None
        if action is None or not str(key).isidentifier():
            raise UsageError(f"{source}: {key!r} is not a setting of tinygpt train; its settings are the long names "
                             "of its flags with _ for - (d_model, steps, lr, ...)")
        if value is None:
            continue
        if isinstance(action, (argparse._StoreTrueAction, argparse.BooleanOptionalAction)):
            if not isinstance(value, bool):
                raise UsageError(f"{source}: {key} is true or false, got {value!r}")
            argv += [name] if value else [] if isinstance(action, argparse._StoreTrueAction) else \
                [flag("no_" + str(key))]
            continue
        if isinstance(value, bool) or isinstance(value, (dict, list, tuple)) and key not in ("kernels", "lora_targets"):
            raise UsageError(f"{source}: {key} takes one value, got {value!r}")
        if isinstance(value, str) and getattr(action.type, "__name__", "").endswith(NUMBER_TYPES):
            raise UsageError(f"{source}: {key} takes a number, not the text {value!r}")
        if isinstance(value, dict):
            value = ",".join(f"{k}={v}" for k, v in value.items())
        elif isinstance(value, (list, tuple)):
            value = ",".join(map(str, value))
        argv.append(f"{name}={value}")      # one word: a value that begins with - is the value, as --flag=-x says
    try:
        p.parse_args(argv)                  # checked here, so the error names the mapping's source
    except UsageError as e:
        raise UsageError(f"{source}: {by_key(e.text)}") from None
    return argv


def by_key(message: str) -> str:
    """argparse's "argument --d-model: must be positive" as a mapping names it: "d_model: must be
    positive" (a TOML file's key, the API's keyword), not as the command line's flag."""
    m = re.match(r"argument --([a-z0-9-]+)(?:/-\w+)?: ", message)
    return f"{m.group(1).replace('-', '_')}: {message[m.end():]}" if m else message


def train_options(mapping: dict, source: str) -> TrainOptions:
    """TrainOptions from a mapping of train's settings, checked as the flags check them."""
    p = RaisingParser(prog="tinygpt train", add_help=False)
    train_flags(p)
    return options(TrainOptions, p.parse_args(settings_argv(mapping, source)))


MAX_CONFIG_BYTES = 1 << 20


def read_config(path: str) -> dict:
    """A --config file: a TOML table of train's settings, read whole once its size is checked."""
    try:
        import tomllib
    except ImportError:                 # Python 3.10: the same parser, before the standard library took it
        import tomli as tomllib
    label = f"--config {path}"
    raw = read_user_file(path, UsageError, label, "a TOML file of train's settings", MAX_CONFIG_BYTES, "1 MiB")
    try:
        table = tomllib.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise UsageError(f"{label}: not TOML ({e}); write one setting a line, such as d_model = 96") from None
    if "config" in table:
        raise UsageError(f"{label}: a config does not name another config; copy its settings in")
    return table
