"""The optimizer's state in a .tinygpt file, for any optimizer.

AdamW's m and v are upstream TinyGPT's moments: they live in the file's state, where TinyGPT's
readers look for them (`includesOptimizerState: true`), with the updates they took as
tinygptPy.adamSteps. Another optimizer's state is no AdamW moment, so such a file declares its
optimizer state absent in upstream's way (`includesOptimizerState: false`: the state holds the
weights alone, which upstream reads exactly) and keeps its own under tinygptPy.optimizer, each
tensor as base64 float32 little-endian:

    {"name", the settings (core.optim: "weightDecay", "beta1", ...), "steps": updates taken,
     "tensors": {parameter: {"m": b64, "v": b64}}}       (Muon's matrices have no "v": AdamW's, zero there)

Every file records its optimizer's name and settings under tinygptPy.optimizer (an AdamW file
with no "tensors"), so a resume knows which optimizer the state belongs to.
"""
from __future__ import annotations

import base64
import math

import numpy as np

from .checkpoint import MAX_HEADER, Checkpoint, CheckpointError, show
from .core.optim import STATE_ROWS, OptimizerSettings, is_muon_matrix, settings_from_record
from .core.errors import TinyGPTError, UsageError


def _short(row: str) -> str:
    return row.split()[-1]            # "lion m" -> "m"


def _kept(settings: OptimizerSettings, row: str, name: str) -> bool:
    """Whether the file keeps this row of this tensor (Muon's v of a matrix is always zero)."""
    return not (settings.name == "muon" and _short(row) == "v" and is_muon_matrix(name))


def record_bytes(settings: OptimizerSettings, specs) -> int:
    """The bytes the record's tensors take in the header (base64: 4 characters for 3 bytes)."""
    if settings.name == "adamw":
        return 0
    floats = sum(math.prod(shape) for name, shape, _ in specs for row in STATE_ROWS[settings.name]
                 if _kept(settings, row, name))
    return 4 * -(-4 * floats // 3)


def check_fits(settings: OptimizerSettings, specs, what: str = "the model"):
    """Refuse, before a run starts, an optimizer whose state the file's header could not hold."""
    need = record_bytes(settings, specs)
    if not fits(settings, specs):     # half the header for the state; the rest for history and the rest
        raise UsageError(f"{{opt:optimizer}} {settings.name}: its state for {what} would take {need:,} bytes of "
                         f"the checkpoint's header, over the {MAX_HEADER // 2:,} it may; use {{opt:optimizer}} adamw, "
                         "whose moments the file's state holds")


def fits(settings: OptimizerSettings, specs) -> bool:
    """Whether the file's header can hold this optimizer's state for these parameters."""
    return record_bytes(settings, specs) <= MAX_HEADER // 2


def _b64(a: np.ndarray) -> str:
    return base64.b64encode(np.ascontiguousarray(a, "<f4").tobytes()).decode("ascii")


def record(settings: OptimizerSettings, state: dict | None = None, steps: int = 0) -> dict:
    """tinygptPy.optimizer: the settings, and for an optimizer other than AdamW its state and steps."""
    rec = settings.as_dict()
    if settings.name != "adamw" and state is not None:
        names = next(iter(state.values())).keys()
        rec["steps"] = int(steps)
        rec["tensors"] = {n: {_short(row): _b64(state[row][n]) for row in STATE_ROWS[settings.name]
                              if _kept(settings, row, n)} for n in names}
    return rec


def file_settings(ck: Checkpoint, what: str) -> OptimizerSettings | None:
    """The optimizer a file records (None: a file before optimizers were recorded, AdamW's)."""
    rec = ck.extra.get("optimizer")
    if rec is None:
        return None
    try:
        return settings_from_record(rec, what)
    except TinyGPTError as e:
        raise CheckpointError(str(e)) from e


def _count(extra: dict, key: str, most: int, what: str, default: int = 0) -> int:
    v = extra.get(key, default)
    if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v <= most:
        raise CheckpointError(f"{what}: its {key} {show(v)} is not a count from 0 to {most}")
    return v


def read(ck: Checkpoint, settings: OptimizerSettings, specs, what: str) -> tuple[dict | None, int, int]:
    """(state {row: {parameter: array}} or None for a fresh start, the updates it took, the step
    its state started from) of the optimizer `settings` names, from a file of that optimizer."""
    if settings.name == "adamw":
        if ck.m is None:            # a weights-only file: the moments start at zero, here
            return None, 0, ck.step
        start = _count(ck.extra, "momentsFrom", ck.step, what)
        steps = _count(ck.extra, "adamSteps", ck.step - start, what, default=ck.step - start)
        return {"adam m": ck.m, "adam v": ck.v}, steps, start
    rec = ck.extra["optimizer"]
    bad = lambda why: CheckpointError(f"{what}: its {settings.name} state {why}; the file is damaged or not "
                                      "tinygpt's")
    tensors = rec.get("tensors")
    if not isinstance(tensors, dict):
        raise bad("holds no tensors")
    steps = _count(rec, "steps", ck.step, what)
    start = _count(ck.extra, "momentsFrom", ck.step, what)
    state = {row: {} for row in STATE_ROWS[settings.name]}
    for name, shape, _ in specs:
        t = tensors.get(name)
        if not isinstance(t, dict):
            raise bad(f"lacks {name}")
        n = math.prod(shape)
        for row in STATE_ROWS[settings.name]:
            if not _kept(settings, row, name):
                state[row][name] = np.zeros(shape, np.float32)
                continue
            try:
                raw = base64.b64decode(t.get(_short(row), ""), validate=True)
            except (ValueError, TypeError) as e:
                raise bad(f"holds {name}.{_short(row)} that is not base64") from e
            if len(raw) != 4 * n:
                raise bad(f"holds {len(raw):,} bytes for {name}.{_short(row)}, which needs {4 * n:,}")
            state[row][name] = np.frombuffer(raw, "<f4").reshape(shape).astype(np.float32)
    if len(tensors) != len(specs):
        raise bad(f"holds {len(tensors)} tensors where the model has {len(specs)}")
    return state, steps, start


def fresh_note(file_name: str, settings: OptimizerSettings, step: int) -> str:
    """The one line a resume with another optimizer than the file's says."""
    return (f"optimizer: the file's state is {file_name}'s; {settings.name} starts its own fresh at step {step:,} "
            "(the weights carry over)")

