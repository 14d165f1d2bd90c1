"""What keeps a run's files whole: a signal ends a run after the current step, never mid-step;
a checkpoint is saved only after the weights it holds pass a health check; a failed final save
puts the model where it can go; a plot or log that cannot be written never stops a run.
"""
from __future__ import annotations

import math
import signal
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from ..files import checkpoint as ckpt
from ..core.errors import TinyGPTError
from ..model.twincheck import blame
from ..files.outputs import advice, rescue_paths


class TrainingStopped(TinyGPTError):
    """A run ended early for a reason the user should see; exit_code says which."""


class Interrupted(TrainingStopped):
    """Stopped by a signal after saving (the lines before it said so); exit 130 or 143."""


class Stop:
    """SIGINT or SIGTERM as KeyboardInterrupt: what stops a command that has no step to finish
    first (prepare), so that its cleanup runs (a SIGTERM left prepare's temporary file behind)."""

    def __init__(self):
        self.signum = None

    def handler(self, signum, _frame):
        self.signum = signum
        raise KeyboardInterrupt

    @property
    def exit_code(self) -> int:
        return 128 + int(self.signum or signal.SIGINT)

    @property
    def name(self) -> str:
        return "SIGTERM" if self.signum == signal.SIGTERM else "Ctrl-C"


@contextmanager
def stops_on_signals():
    stop, old = Stop(), {}
    try:
        for s in (signal.SIGINT, signal.SIGTERM):
            old[s] = signal.signal(s, stop.handler)
    except ValueError:          # not the main thread: leave signals alone
        pass
    try:
        yield stop
    finally:
        for s, h in old.items():
            signal.signal(s, h)


class StopFlag:
    """Ctrl-C (SIGINT) or SIGTERM (systemd, Slurm, `timeout`, containers) asks to stop after the
    current step, never mid-step, so the saved sampling state and weights agree. A third signal
    stops at once without saving, except while a checkpoint is written: then it waits."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self):
        self.requested, self.signum, self._saving, self.old = 0, None, False, {}
        try:
            for s in self.SIGNALS:
                self.old[s] = signal.signal(s, self._handler)
        except ValueError:  # not the main thread: leave signals alone
            self.old = {}

    def _handler(self, signum, _frame):
        self.requested += 1
        self.signum = self.signum or signum
        if self.requested >= 3 and not self._saving:
            raise KeyboardInterrupt

    @property
    def exit_code(self) -> int:
        return 128 + int(self.signum or signal.SIGINT)   # 130 for Ctrl-C, 143 for SIGTERM

    @property
    def name(self) -> str:
        return "SIGTERM" if self.signum == signal.SIGTERM else "Ctrl-C"

    @contextmanager
    def saving(self):
        """While a checkpoint is written, signals only count."""
        was, self._saving = self._saving, True
        try:
            yield
        finally:
            self._saving = was

    def restore(self):
        """Put the old handlers back; after a signal, ignore further ones while the process exits
        (a late one would otherwise kill it after the save, with no exit code of ours)."""
        for s, old in self.old.items():
            signal.signal(s, signal.SIG_IGN if self.requested else old)
        self.old = {}


def unhealthy(loss: float, norm: float | None, best: float | None, vocab: int) -> str | None:
    """Why the model has diverged, or None. Exploding: worse than 3 x ln V (uniform guessing
    scores ln V), or worse than guessing and more than twice the best loss of this run."""
    if not math.isfinite(loss):
        return f"the loss became {loss}"
    if norm is not None and not math.isfinite(norm):
        return f"the gradient norm became {norm}"
    guess = math.log(vocab)
    if loss > 3 * guess:
        return f"the loss exploded to {loss:.4g} (uniform guessing scores {guess:.3g})"
    if best is not None and loss > guess and loss > 2 * best:
        return f"the loss jumped to {loss:.4g}, over twice this run's best ({best:.4g})"
    return None


def run_file(run, params: dict) -> ckpt.Checkpoint:
    """The checkpoint of a run (start.Run) as it stands: `params` (read once by the caller), the
    optimizer's state, the step, and what resuming needs to continue bit for bit."""
    model = run.model
    gate = model.gate_state()
    extra = dict(run.extra)
    extra["dataRngState"] = run.rng.bit_generator.state
    extra["schedule"] = run.schedule.as_dict()
    extra["momentsFrom"] = model.moments_from
    if model.spec.scaled:           # the loss scaler's state, so that a resumed run continues bit for bit
        extra.update(lossScale=gate["scale"], lossScaleClean=int(gate["clean"]), skippedSteps=int(gate["skipped"]))
    return run.checkpoint(params, model.get_opt_state(), int(gate["taken"]), model.step_count, extra)


class Saver:
    """Writes the run's checkpoint to one path, only after the weights pass the health check,
    and remembers which step the file on disk holds (for messages after a refusal). run: the
    start.Run being trained (its config, model, history, data-sampling state and schedule)."""

    def __init__(self, run, path: Path, stop: StopFlag):
        self.run, self.path, self.stop = run, path, stop
        self.kept = ckpt.peek_step(path) if ckpt.is_tinygpt(path) else None
        self.best = None                       # the best train loss seen in this run

    def kept_text(self) -> str:
        if self.kept is None:
            return f"no checkpoint was saved at {self.path}"
        return f"{self.path} keeps the checkpoint of step {self.kept}"

    def checked_params(self, x, y, lr: float, refs=None, docs=None, done: int = 0) -> dict:
        """The current (updated) weights, read once, after checking them and their loss on the
        last batch (a DPO batch's with its refs, a chat batch's with its docs): a step that diverged
        is never saved over a good checkpoint."""
        model = self.run.model
        loss = model.mean_loss(np.asarray(x), np.asarray(y), refs, docs)
        params = model.get_params()
        why = unhealthy(loss, None, self.best, self.run.cfg.vocab)
        if why is None:
            bad = [n for n, a in params.items() if not np.all(np.isfinite(a))]
            why = f"parameter {bad[0]} holds nan/inf" if bad else None
        if why:
            raise TrainingStopped(f"{why} after step {done}; not saved: {self.kept_text()}; {blame(model, lr, (x, y))}",
                                  3)
        return params

    def save(self, params: dict, path: Path | None = None):
        run, path = self.run, path or self.path
        ck = run_file(run, params)
        step = ck.step
        with self.stop.saving():
            ckpt.save(path, ck)
        if path == self.path:
            self.kept = step

    def save_final(self, params: dict):
        """Save, or put the model where it can go and say where (exit 1 either way on failure)."""
        try:
            self.save(params)
            return
        except OSError as e:
            reason = f"could not save {self.path} ({e.strerror or e}; {advice(e)})"
            tried = []
            for alt in rescue_paths(self.path):
                try:
                    self.save(params, alt)
                except OSError:
                    tried.append(str(alt))
                    continue
                raise TrainingStopped(f"{reason}; the model was saved to {alt} instead: move it, or continue with "
                                      f"{{opt:resume}} {alt}", 1) from e
            raise TrainingStopped(f"{reason}, nor at {', '.join(tried)}; {self.kept_text()}", 1) from e


class SideWriter:
    """The log and the plot: a failure warns once and the run goes on."""

    def __init__(self, err):
        self.err, self.warned = err, set()

    def attempt(self, what: str, fn, *a):
        if what in self.warned:
            return None
        try:
            return fn(*a)
        except Exception as e:  # a plot or a log line never kills a run
            self.warned.add(what)
            print(f"\nwarning: could not write the {what} ({getattr(e, 'strerror', None) or e}); "
                  "training goes on without it", file=self.err)
            return None
