"""The learning-rate schedule of `tinygpt train`, and the deadline that sets its length.

Schedule: TinyGPT trained at a constant 3e-4 (the constant schedule); the default is linear
warm-up, then cosine decay to min_lr at the last step, with each preset's lr, warm-up and floor
from config.TRAIN_DEFAULTS. The schedule is saved in the checkpoint, so a resumed run continues it.

Deadline (minutes instead of steps): the step count is not known in advance. It is estimated from the measured
time per step (logging and periodic evaluation included) once the first steps have run, and again
at every logged step, so that the steps, then the final evaluation and samples, end at the
deadline; the cosine decay is stretched to end at the estimated last step.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from ..core.config import TINYGPT_LR, TRAIN_DEFAULTS
from ..core.errors import UsageError
from ..model import optimizers

KINDS = ("cosine", "constant")


@dataclass
class Schedule:
    kind: str            # cosine | constant
    lr: float            # peak (cosine) or the constant lr
    warmup: int          # linear warm-up steps (cosine), at most a tenth of the run
    min_lr: float        # where the cosine ends
    total: int = 0       # the step the decay ends at (the planned end); later steps stay at min_lr
    start: int = 0       # the step the warm-up begins: 0, or where the rewarm option restarted it

    def at(self, step: int) -> float:
        """The lr of step `step` (0-based)."""
        if self.kind == "constant":
            return self.lr
        step, total = step - self.start, self.total - self.start
        warm = min(self.warmup, total // 10)
        if warm and step < warm:
            return self.lr * (step + 1) / warm
        frac = min(1.0, max(0, step - warm) / max(1, total - warm))
        return self.min_lr + 0.5 * (self.lr - self.min_lr) * (1 + math.cos(math.pi * frac))

    def describe(self) -> str:
        if self.kind == "constant":
            return f"constant lr {self.lr:g}"
        again = f"restarted at step {self.start:,}: " if self.start else ""
        return (f"{again}lr {self.lr:g}, {min(self.warmup, (self.total - self.start) // 10)} warm-up steps, "
                f"cosine to {self.min_lr:g} at step {self.total:,}")

    def resume_at(self, start: int, rewarm: bool) -> int | None:
        """A resumed run from step `start`: with `rewarm`, the schedule restarts there (a new
        warm-up to lr, a cosine to min_lr at the new last step); else it goes on as planned.
        Returns the planned end the decay is held to (None where it follows the run's last step:
        a restart, a constant lr, a file that planned none). Past it the run stays at min_lr, so
        extending a finished run never rewrites the past of its schedule."""
        if rewarm:
            self.start = start
            return None
        return self.total if self.kind == "cosine" and self.total > 0 else None

    def end_at(self, end: int, held: int | None):
        """The decay ends at the run's last step `end`, or at `held` where the run goes past it."""
        self.total = end if held is None else min(end, held)

    def extension(self, start: int, end: int | None, held: int | None) -> str | None:
        """The banner's line for a run that goes past its planned end (end None: the deadline's)."""
        if held is None or (end is not None and end <= held):
            return None
        upto = f"to {end:,} " if end is not None else ""
        return (f"steps {max(start, held) + 1:,} {upto}run at the schedule's final lr {self.min_lr:g}: the run "
                f"planned its end at step {held:,} ({{opt:rewarm}} starts a new warm-up and decay instead)")

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d) -> Schedule | None:
        """A schedule saved in a checkpoint, or None if it is missing or malformed (then the
        file's constant lr is used, as for TinyGPT's own files)."""
        try:
            s = cls(str(d["kind"]), float(d["lr"]), int(d["warmup"]), float(d["min_lr"]), int(d.get("total", 0)),
                    int(d.get("start", 0)))
        except (TypeError, KeyError, ValueError):
            return None
        ok = s.kind in KINDS and s.lr > 0 and s.warmup >= 0 and s.min_lr >= 0 and 0 <= s.start <= s.total
        return s if ok and math.isfinite(s.lr) and math.isfinite(s.min_lr) else None


def resolve(o, saved: dict | None = None, file_lr: float | None = None) -> Schedule:
    """The schedule a run uses: the flags over the resumed file's schedule (or, for a file
    without one, its constant lr), over the preset's defaults. `total` is set by the caller."""
    if file_lr is not None:
        base = Schedule.from_dict(saved) if saved else None
        base = base or Schedule("constant", file_lr, 0, 0.0)
    else:
        d = optimizers.schedule(o.preset, o.optimizer or optimizers.DEFAULT)
        base = Schedule("cosine", d.lr, d.warmup, d.min_lr)
    kind = o.schedule or base.kind
    if kind == "constant" and (o.warmup or o.min_lr is not None):
        raise UsageError("{opt:warmup} and {opt:min_lr} shape the cosine schedule; drop them, or drop "
                         "{opt:schedule} constant")
    if kind == "constant" and base.kind != "constant":
        base = Schedule("constant", TINYGPT_LR, 0, 0.0)            # TinyGPT's
    if kind == "cosine" and base.kind == "constant":
        d = TRAIN_DEFAULTS["small"]
        base = Schedule("cosine", base.lr, d.warmup, base.lr / 30)
    s = Schedule(kind, o.lr if o.lr is not None else base.lr,
                 o.warmup if o.warmup is not None else base.warmup,
                 o.min_lr if o.min_lr is not None else base.min_lr, base.total, base.start)
    if kind == "cosine" and s.min_lr > s.lr:
        raise UsageError(f"{{opt:min_lr}} {s.min_lr:g} is above the peak lr {s.lr:g}; give a smaller {{opt:min_lr}}")
    return s


class Deadline:
    """Fits the number of steps to a deadline (the minutes option), from measured step times.

    clock: seconds, monotonic (time.monotonic; tests pass a fake one). t0: when the run began.
    reserve: seconds the end of the run needs after the last step (final evaluation, samples,
    save), measured before the loop."""

    FIRST_STEPS, FIRST_SECONDS = 5, 2.0     # measured before the first estimate

    def __init__(self, seconds: float, clock, t0: float):
        self.deadline, self.clock, self.reserve = t0 + seconds, clock, 0.0
        self.mark = None                    # (time, step) where the measurement starts

    def start(self, step: int):
        self.mark = (self.clock(), step)

    def left(self) -> float:
        return self.deadline - self.clock()

    def last_step(self, done: int) -> int | None:
        """The estimated last step after `done` steps, or None while too few were measured."""
        t, s = self.mark
        now = self.clock()
        if done - s < self.FIRST_STEPS or now - t < self.FIRST_SECONDS:
            return None
        per_step = (now - t) / (done - s)
        return done + max(0, int((self.deadline - now - self.reserve) / per_step))
