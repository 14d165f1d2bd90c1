"""Every command's settings as flags, made in one place: train's from the recipe's fields
(run/options.py: each one's help, default, check and group), the other commands' from their
tables of Flag values (cli.py, chat.py); add_flags is the one builder of them all. And the same
check for any mapping of train's settings (a --config file, the Python API's keywords), made
from the fields without a command line, so that a setting is checked alike wherever it comes
from. The command line (cli.py) and the Python API (api.py) both take train's settings from
here; neither reads the other.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass, fields

from .argtypes import as_type, flag
from ..core import values
from ..core.errors import TinyGPTError, UsageError, with_names
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


@dataclass(frozen=True)
class Flag:
    """A flag of a command that is not a setting of the recipe: its names (a positional
    argument's one name) and how argparse reads it (help, type, default, choices, action, ...)."""
    names: tuple
    kw: dict


def flag_of(*names: str, **kw) -> Flag:
    return Flag(names, kw)


def add_flags(p, flags) -> None:
    """A command's flags, in the order its help shows them: each a Flag, or the name of a setting
    of the recipe (its flag made from its field: add_setting)."""
    for f in flags:
        if isinstance(f, str):
            add_setting(p, f)
        else:
            p.add_argument(*f.names, **f.kw)


# After train's settings, the two that ask for a profile or a plan's budget instead of a run.
TRAIN_EXTRA = (
    flag_of("--profile", action="store_true",
            help="run a few steps, print the GPU time, GFLOP/s, GB/s and share of the adapter's peak of "
                 "each kernel of one step, and the step's MFU, and exit"),
    flag_of("--json", action="store_true",
            help="JSON: with --profile, JSON Lines, one row per kernel, then the step; for plan, the budget"))


def train_flags(p):
    """Every flag of `tinygpt train`, one a setting of the recipe, in its group's section of the
    help (options.GROUPS): plan takes them all too, so any training command can be planned by
    changing its verb. Then the two that ask for a profile instead of a run."""
    sections = {g: p.add_argument_group(title) for g, (title, _) in GROUPS.items()}
    for name, f in SETTINGS.items():
        add_setting(sections[f.metadata["group"]], name)
    add_flags(p, TRAIN_EXTRA)


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


# a setting's other names (options.setting's aliases): log_file is log
ALIASES = {alias: name for name, f in SETTINGS.items() for alias in f.metadata["aliases"]}
LISTS = ("kernels", "lora_targets")     # the settings whose value is a list or table, as a word of the flag's form


def checked_settings(mapping: dict, source: str) -> dict:
    """Train's settings from a mapping of them by name ("d_model": 96, "recompute": True: a config
    file's table, the API's keywords), each checked by its field's check and choices as its flag
    checks the command line's word, without a command line: {name: (value, word)}, word the
    command line's for it (a toggle's: None)."""
    out = {}
    for key, value in flat_config(mapping, source).items():
        name = ALIASES.get(key, key) if isinstance(key, str) else None
        f = SETTINGS.get(name) if name != "config" else None      # a config names no other config
        if f is None:
            raise UsageError(f"{source}: {key!r} is not a setting of tinygpt train; its settings are the long names "
                             "of its flags with _ for - (d_model, steps, lr, ...)")
        if value is None:
            continue
        m = f.metadata
        if m["toggle"]:
            if not isinstance(value, bool):
                raise UsageError(f"{source}: {key} is true or false, got {value!r}")
            out[name] = (value, None)
            continue
        if isinstance(value, bool) or isinstance(value, (dict, list, tuple)) and name not in LISTS:
            raise UsageError(f"{source}: {key} takes one value, got {value!r}")
        check = m["check"]
        if isinstance(value, str) and check is not None and check.__name__.endswith(NUMBER_TYPES):
            raise UsageError(f"{source}: {key} takes a number, not the text {value!r}")
        word = word_of(value)
        out[name] = (as_value(check, m["choices"], word, f"{source}: {key}"), word)
    return out


def word_of(value) -> str:
    """A value as the command line's word for it: a table as k=v,k=v and a list as a,b (--kernels
    and --lora-targets read them so)."""
    if isinstance(value, dict):
        return ",".join(f"{k}={v}" for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return ",".join(map(str, value))
    return str(value)


def as_value(check, choices, word: str, label: str):
    """A setting's word checked and converted as its flag does (argtypes.as_type), or a one-line
    error naming the setting by label."""
    try:
        value = word if check is None else check(word)
    except values.BadValue as e:
        raise UsageError(f"{label}: {e}") from None
    except TinyGPTError as e:
        raise UsageError(f"{label}: {e.worded()}") from None
    if choices is not None and value not in choices:
        raise UsageError(f"{label}: invalid choice: {value!r} (choose from {', '.join(map(repr, choices))})")
    return value


def settings_argv(mapping: dict, source: str) -> list[str]:
    """A --config file's settings (checked: checked_settings) as the command line that says the
    same, which the command line's own flags, placed after it, override."""
    return [(flag(name) if value else flag("no_" + name)) if word is None else f"{flag(name)}={word}"
            for name, (value, word) in checked_settings(mapping, source).items()]   # one word: --flag=-x


def train_options(mapping: dict, source: str) -> TrainOptions:
    """TrainOptions from a mapping of train's settings, each checked as its flag checks it."""
    return TrainOptions(**{name: value for name, (value, _) in checked_settings(mapping, source).items()})


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
