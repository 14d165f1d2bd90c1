"""What every optimizer is: the settings value, and the class each room's optimizer subclasses.

An optimizer's room (one module here) holds all of it: its name and one-line help, its
hyperparameters (defaults, ranges, flag help), its schedule where it differs from the preset's,
its state's rows and what the .tinygpt file's two moment slots keep of them, its float64 step
(composed of the twins its caller hands it, so the reference never imports a room and no room
imports the reference), and its device side: its rows in the buffer table, its dispatches and
its uniforms. The registry (__init__) names each once; nothing else compares an optimizer's name.

An elementwise optimizer (ElementwiseOptimizer) is its arithmetic on one element, a WGSL
`update` written in its room that completes shaders/optim.wgsl's frame (whose entry point takes
the optimizer's name), and its NumPy twin of that name in the same module: adding one touches
its module and the registry's two lines.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ...core.config import Config, ADAMW_EPS
from ...core.errors import TinyGPTError, UsageError
from ...device.gpu import GPU
from ...device.kernels import OPTIM_UNIFORM_BYTES, optim_uniform
from ..buffers import Buffer
from ..layout import flat_view

STATE = "optimizer state"      # the memory budget's group of every optimizer's state
WEIGHT_DECAY = 0.1             # every optimizer's decoupled decay of matrices and embeddings


@dataclass(frozen=True)
class Hyper:
    """One hyperparameter: its default, its range, its flag's help (flag None: no flag sets it)."""
    default: float | bool
    help: str = ""
    flag: str | None = None
    lo: float = 0.0
    hi: float = 1.0


@dataclass(frozen=True)
class Settings:
    """The optimizer's settings: a value made once from the options (or a resumed file) and passed
    down. kind: the room's class; values: its hyperparameters, in its order."""
    kind: type = field(repr=False)
    weight_decay: float
    values: tuple

    @property
    def name(self) -> str:
        return self.kind.name

    def __getattr__(self, key):
        if not key.startswith("_") and key not in ("kind", "weight_decay", "values"):
            for k, v in self.values:
                if k == key:
                    return v
        raise AttributeError(key)

    def as_dict(self) -> dict:
        """The file's record of the settings (tinygptPy.optimizer): the ones this optimizer reads."""
        return {"name": self.name, "weightDecay": self.weight_decay, **dict(self.values)}

    def describe(self) -> str:
        show = lambda v: str(v).lower() if isinstance(v, bool) else f"{v:g}"
        return f"{self.name} (" + ", ".join(f"{k} {show(v)}" for k, v in self.as_dict().items() if k != "name") + ")"


def _checked(v, what: str, lo: float, hi: float, open_hi: bool = True) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not lo <= v \
            or (v >= hi if open_hi else v > hi):
        raise UsageError(f"{what} must be a number from {lo:g} to {hi:g}{' (not included)' if open_hi else ''}, "
                         f"got {v!r}")
    return float(v)


def frame(wd, gate: dict, shape) -> tuple:
    """optim.wgsl's `element` for the twins: (the decay per element, which elements this optimizer
    updates: a negative decay marks another optimizer's), or None where the gate skips the step."""
    if gate["skip"]:
        return None
    flat = np.asarray(wd, np.float64).reshape(-1) if np.ndim(wd) else wd
    wd = np.broadcast_to(flat, (int(np.prod(shape)),)).reshape(shape)
    return np.maximum(wd, 0.0), wd >= 0


class Optimizer:
    """One optimizer: the class holds what its kind is (settings, file policy, reference step);
    an instance, made from its settings for one model, is its device side."""
    name = ""
    summary = ""                # the optimizer option's help: what it is, in a line
    hypers: dict = {}           # {key: Hyper}, beside the weight decay every optimizer has
    state_rows: tuple = ()      # its state's flat buffers (in the parameter layout), by row name
    schedules: dict = {}        # {preset: core.config.TrainDefaults} where its sweep beat the preset's
    # True: its state is upstream's AdamW moments exactly, which a LoRA file and PEFT's export carry
    # and an old file's adamSteps count (what AdamW recorded before every optimizer did)
    upstream_moments = False

    # ---- the settings ------------------------------------------------------------------------------
    @classmethod
    def settings(cls, weight_decay: float | None = None, **given) -> Settings:
        """The settings from the options (None: the default), each value checked."""
        for key, val in given.items():
            if val is not None and key not in cls.hypers:
                takes = [f"{{opt:{k}}}" for k, h in cls.hypers.items() if h.flag]
                raise UsageError(f"{{opt:{key}}} is not {cls.name}'s: it takes "
                                 + ", ".join(takes + ["{opt:weight_decay}"]))
        values = []
        for key, h in cls.hypers.items():
            v = given.get(key)
            if v is None:
                v = h.default
            elif isinstance(h.default, bool):
                if not isinstance(v, bool):
                    raise UsageError(f"{{opt:{key}}} must be true or false, got {v!r}")
            else:
                v = _checked(v, f"{{opt:{key}}}", h.lo, h.hi)
            values.append((key, v))
        wd = WEIGHT_DECAY if weight_decay is None else _checked(weight_decay, "{opt:weight_decay}", 0.0, 10.0, False)
        return Settings(cls, wd, tuple(values))

    @classmethod
    def from_record(cls, rec: dict, what: str) -> Settings:
        """The settings a file's tinygptPy.optimizer records, checked as the options are."""
        extra = [k for k in rec if k not in ("name", "weightDecay", "steps", "tensors") and k not in cls.hypers]
        if extra:
            raise TinyGPTError(f"{what}: its {cls.name} record holds {extra[0]!r}, which {cls.name} does not have")
        try:
            return cls.settings(rec.get("weightDecay"), **{k: rec[k] for k in cls.hypers if k in rec})
        except UsageError as e:
            raise TinyGPTError(f"{what}: its optimizer record holds settings this tinygpt refuses ({e})") from e

    # ---- the file's moment slots (tinygpt.files.optim_state) -----------------------------------------
    @classmethod
    def kept(cls, s: Settings, row: str, name: str) -> bool:
        """Whether the file keeps this row of this parameter (False: always zero, not stored)."""
        return True

    @classmethod
    def slots(cls, s: Settings, state: dict) -> tuple[dict, dict]:
        """(m, v): the file's two moment slots of every parameter. m holds the first row, which
        must be a running mean of the gradient (AdamW's m is one); v the second row where the
        optimizer has one and keeps it, else m^2, so that an AdamW continuing from the file
        (upstream's) takes steps of AdamW's size (m / sqrt(v) about 1)."""
        rows = cls.state_rows
        m = state[rows[0]]
        v = {n: state[rows[1]][n] if len(rows) > 1 and cls.kept(s, rows[1], n) else np.square(a)
             for n, a in m.items()}
        return m, v

    @classmethod
    def from_slots(cls, s: Settings, m: dict, v: dict) -> dict:
        """The state {row: {parameter: array}} the slots hold (slots' inverse)."""
        rows = cls.state_rows
        state = {rows[0]: m}
        if len(rows) > 1:
            state[rows[1]] = {n: v[n] if cls.kept(s, rows[1], n) else np.zeros_like(v[n]) for n in v}
        return state

    # ---- the float64 step --------------------------------------------------------------------------
    @classmethod
    def reference_step(cls, K, s: Settings, name: str, g, wd: float, gate: dict, w, state: dict, lr: float):
        """One step of one parameter in float64, in place on w and state; K: reference.kernels
        (the twins of the device's kernels), which the reference hands in."""
        raise NotImplementedError

    # ---- the device --------------------------------------------------------------------------------
    def __init__(self, settings: Settings):
        assert settings.kind is type(self)
        self.s = settings
        self.uniforms = []

    def rows(self) -> tuple:
        return tuple(Buffer(r, ("F",), "f32", "model", STATE, "training", "flat") for r in self.state_rows)

    def sizes(self, cfg: Config) -> dict:
        return {}

    def record(self, f) -> list:
        """Its dispatches over the model's flat buffers (model.optim.Flat)."""
        raise NotImplementedError

    def decay_table(self, f, mine=lambda name: True) -> np.ndarray:
        """The decay of each 256-float block: the weight decay where the parameter is decayed, 0
        where not, -1 where it is not this kernel's (mine(name) false)."""
        wd = np.zeros(f.n // 256, np.float32)
        for name, shape, decayed in f.trainable:
            off = f.offsets[name][0]
            wd[off // 256: -(-(off + int(np.prod(shape))) // 256)] = \
                (self.s.weight_decay if decayed else 0.0) if mine(name) else -1.0
        return wd

    def write_step(self, gpu: GPU, lr: float):
        """Its uniforms for the next step (the learning rate changes every step)."""
        for u, f0, k, consts in self.uniforms:
            gpu.write_uniform(u, optim_uniform(k, lr, *consts, first=f0 // 256))


class ElementwiseOptimizer(Optimizer):
    """One dispatch a chunk of the flat buffers: `wgsl`, its room's `update(i, grad, wd, t)` of
    one element (the frame's `element` finds it), which completes optim.wgsl, whose entry point
    is named `name`; and the entry point's twin of that name and argument order in the room's
    module (`twin`)."""
    wgsl = ""

    @staticmethod
    def constants(s: Settings) -> tuple:
        """The optimizer's (k0, k1, k2) in optim.wgsl's uniform: what its WGSL reads as p.k0 .. p.k2."""
        raise NotImplementedError

    @staticmethod
    def twin(g, wd, gate, w, m, v, lr, k0, k1, k2):
        """The entry point's NumPy twin (the room binds its own function here)."""
        raise NotImplementedError

    @classmethod
    def reference_step(cls, K, s, name, g, wd, gate, w, state, lr):
        rows = [state[r][name] for r in cls.state_rows] + [None] * (2 - len(cls.state_rows))
        cls.twin(g, wd, gate, w, *rows, lr, *cls.constants(s))

    def record(self, f, mine=lambda name: True) -> list:
        """One dispatch a chunk (its own uniform each, rewritten every step), over the parameters
        mine(name) accepts."""
        f.gpu.write(f.buf["weight decay"], self.decay_table(f, mine))
        consts = self.constants(self.s)
        self.uniforms = [(f.gpu.uniform(OPTIM_UNIFORM_BYTES), f0, k, consts) for f0, k in f.chunks]
        state = [f.buf[r] for r in self.state_rows]
        return [f.kn.optim.elementwise_optimizer(self.name, self.wgsl, flat_view(f.grads, f0, k), f.buf["weight decay"],
                                           f.gate, flat_view(f.params, f0, k),
                                           *[flat_view(t, f0, k) for t in state], *[None] * (2 - len(state)), k, u)
                for u, f0, k, _ in self.uniforms]


__all__ = ["ADAMW_EPS", "ElementwiseOptimizer", "Hyper", "Optimizer", "Settings", "WEIGHT_DECAY", "frame"]
