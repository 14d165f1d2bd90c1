"""The optimizer's state in a .tinygpt file, for any optimizer.

Every fp32 file has upstream TinyGPT's layout, whatever the optimizer: per tensor its weights and
two moment slots (`includesOptimizerState: true`, 4 + 12 n state bytes), which upstream's
readers take as AdamW's m and v (python_ref/load_tinygpt.py reads the triplets whatever the
header says; the browser's WebGPU importState refuses any other length, so nothing may follow
them). What each optimizer keeps there (`slots`):

    adamw   m: AdamW's m; v: AdamW's v (the updates they took: tinygptPy.adamSteps)
    muon    m: the momentum of a block matrix, AdamW's m elsewhere; v: AdamW's v where Muon runs
            AdamW (embeddings, biases, norms), m^2 for a matrix, which has none
    lion    m: Lion's momentum; v: m^2
    sgd     m: its momentum (a running mean); v: m^2

Each optimizer's room says it (Optimizer.slots, from_slots, kept): the m slot holds its running
mean of the gradient, which is what AdamW's m is. A v slot of m^2 keeps an AdamW that continues
from the file (upstream's) to steps of AdamW's size (m / sqrt(v) about 1, where a zero v would
make them 30 times larger); our reader drops it, as that optimizer keeps no v there.
tinygptPy.optimizer records the name, the settings and the updates taken ("steps"), so a resume
knows whose state the slots hold. No tensor is kept in the header. A file written before this
(`includesOptimizerState: false`, each tensor's state as base64 under tinygptPy.optimizer.tensors)
still reads.
"""
from __future__ import annotations

import base64
import math

import numpy as np

from .checkpoint import Checkpoint, CheckpointError, show
from ..core.errors import TinyGPTError
from ..model.optimizers import Settings, settings_from_record


def _short(row: str) -> str:
    return row.split()[-1]            # "lion m" -> "m"


def record(settings: Settings, steps: int = 0) -> dict:
    """tinygptPy.optimizer: the name and settings, and for an optimizer other than upstream's
    AdamW the updates its state took (AdamW's are tinygptPy.adamSteps, as before)."""
    rec = settings.as_dict()
    if not settings.kind.upstream_moments:
        rec["steps"] = int(steps)
    return rec


def slots(settings: Settings, state: dict) -> tuple[dict, dict]:
    """(m, v): the file's two moment slots of every tensor the state holds (see above)."""
    return settings.kind.slots(settings, state)


def written(settings: Settings, state: dict, steps: int) -> tuple[dict, dict, dict]:
    """(the header's fields, m, v): what a file holds of this optimizer's state after `steps`
    updates, for tinygpt train and for any trainer that hands a file back (scripts/train_ddp.py)."""
    fields = {"optimizer": record(settings, steps)}
    if settings.kind.upstream_moments:
        fields["adamSteps"] = int(steps)
    return (fields,) + slots(settings, state)


def file_settings(ck: Checkpoint, what: str) -> Settings | None:
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


def read(ck: Checkpoint, settings: Settings, shapes, what: str) -> tuple[dict | None, int, int]:
    """(state {row: {parameter: array}} or None for a fresh start, the updates it took, the step
    its state started from) of the optimizer `settings` names, from a file of that optimizer:
    its moment slots, or an older file's base64 tensors. A value that is not finite, or a tensor
    of the wrong size, is refused by name: a damaged state is never trained on."""
    bad = lambda why: CheckpointError(f"{what}: its {settings.name} state {why}; the file is damaged or not "
                                      "tinygpt's")
    rec = ck.extra.get("optimizer") or {}
    kind = settings.kind
    if kind.upstream_moments:
        if ck.m is None:            # a weights-only file: the moments start at zero, here
            return None, 0, ck.step
        start = _count(ck.extra, "momentsFrom", ck.step, what)
        steps = _count(ck.extra, "adamSteps", ck.step - start, what, default=ck.step - start)
        state = kind.from_slots(settings, ck.m, ck.v)
    elif isinstance(rec.get("tensors"), dict):
        state, steps, start = _read_base64(rec, settings, shapes, ck, what, bad)
    elif ck.m is not None:
        steps = _count(rec, "steps", ck.step, what)
        start = _count(ck.extra, "momentsFrom", ck.step, what)
        state = kind.from_slots(settings, ck.m, ck.v)
    else:
        raise bad("is missing (the file holds the weights alone)")
    for row, tensors in state.items():
        for name, a in tensors.items():
            if not np.all(np.isfinite(a)):
                raise bad(f"holds a value that is not finite in {name}.{_short(row)}")
    return state, steps, start


def _read_base64(rec: dict, settings: Settings, shapes, ck: Checkpoint, what: str, bad):
    """A file written before the state moved to the moment slots: each tensor's rows as base64."""
    tensors = rec["tensors"]
    steps = _count(rec, "steps", ck.step, what)
    start = _count(ck.extra, "momentsFrom", ck.step, what)
    rows = settings.kind.state_rows
    state = {row: {} for row in rows}
    for name, shape, _ in shapes:
        t = tensors.get(name)
        if not isinstance(t, dict):
            raise bad(f"lacks {name}")
        n = math.prod(shape)
        for row in rows:
            if not settings.kind.kept(settings, row, name):
                state[row][name] = np.zeros(shape, np.float32)
                continue
            try:
                raw = base64.b64decode(t.get(_short(row), ""), validate=True)
            except (ValueError, TypeError) as e:
                raise bad(f"holds {name}.{_short(row)} that is not base64") from e
            if len(raw) != 4 * n:
                raise bad(f"holds {len(raw):,} bytes for {name}.{_short(row)}, which needs {4 * n:,}")
            state[row][name] = np.frombuffer(raw, "<f4").reshape(shape).astype(np.float32)
    if len(tensors) != len(shapes):
        raise bad(f"holds {len(tensors)} tensors where the model has {len(shapes)}")
    return state, steps, start


def fresh_note(file_name: str, settings: Settings, step: int) -> str:
    """The one line a resume with another optimizer than the file's says."""
    return (f"optimizer: the file's state is {file_name}'s; {settings.name} starts its own fresh at step {step:,} "
            "(the weights carry over)")

