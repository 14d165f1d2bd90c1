"""The optimizers, each one in its own module (base.py says what a room holds), registered here
once. Nothing outside this package compares an optimizer's name: it asks the registry for the
class (`kind`) or the settings for theirs.

    adamw  TinyGPT's                                   adamw.py
    lion   the sign of a momentum                      lion.py
    muon   Newton-Schulz on the blocks' matrices       muon.py
    sgd    SGD with momentum                           sgd.py
"""
from __future__ import annotations

from ...core.config import TRAIN_DEFAULTS, TrainDefaults
from ...core.errors import TinyGPTError, UsageError
from .adamw import AdamW
from .base import WEIGHT_DECAY, Optimizer, Settings
from .lion import Lion
from .muon import Muon
from .sgd import SGD

KINDS = {k.name: k for k in (AdamW, Lion, Muon, SGD)}
NAMES = tuple(KINDS)
# the hyperparameters that flags set (beta1, ...), in the registry's order
FLAGS = tuple(dict.fromkeys(h.flag for k in KINDS.values() for h in k.hypers.values() if h.flag))
# tinygpt train's optimizer for a new run: Muon learned more per minute than AdamW at the first
# run's budget (docs/results.md, "Optimizers").
DEFAULT = Muon.name
# a LoRA run's: its files and PEFT's export carry upstream's AdamW moments
LORA = AdamW.name
# the optimizer of a file that records none: every file before optimizers were recorded was AdamW's
UNRECORDED = AdamW.name


def kind(name: str) -> type[Optimizer]:
    if name not in KINDS:
        raise UsageError(f"{{opt:optimizer}} takes {', '.join(NAMES)}; got {name!r}")
    return KINDS[name]


def make_settings(name: str, weight_decay: float | None = None, **given) -> Settings:
    """The settings of optimizer `name` from the options (None: its default), each value checked."""
    return kind(name).settings(weight_decay, **given)


def settings_from_record(rec, what: str) -> Settings:
    """The settings a file's tinygptPy.optimizer records, checked as the options are."""
    if not isinstance(rec, dict) or rec.get("name") not in KINDS:
        name = rec.get("name") if isinstance(rec, dict) else rec
        raise TinyGPTError(f"{what}: its optimizer record names {name!r}, which this tinygpt does not know")
    return KINDS[rec["name"]].from_record(rec, what)


def schedule(preset_name: str, name: str) -> TrainDefaults:
    """The schedule a new run of `preset_name` with optimizer `name` takes where no flag says
    otherwise: the optimizer's own where its sweep found one, else the preset's."""
    return kind(name).schedules.get(preset_name, TRAIN_DEFAULTS[preset_name])


def flag_help(key: str) -> str:
    """A hyperparameter flag's help, from every optimizer that has it: "adamw's ... (default 0.9); ..."."""
    show = lambda v: str(v).lower() if isinstance(v, bool) else f"{v:g}"
    return "; ".join(f"{h.help} (default {show(h.default)})" for k in KINDS.values()
                     for h in k.hypers.values() if h.flag == key) + ", or the resumed run's"


def optimizer_help() -> str:
    return "; ".join(k.summary for k in KINDS.values())


def make_optimizer(settings: Settings) -> Optimizer:
    """The device side of the settings' optimizer, for one model."""
    return settings.kind(settings)


__all__ = ["DEFAULT", "FLAGS", "KINDS", "LORA", "NAMES", "UNRECORDED", "WEIGHT_DECAY", "Optimizer", "Settings",
           "flag_help", "kind", "make_optimizer", "make_settings", "optimizer_help", "schedule",
           "settings_from_record"]
