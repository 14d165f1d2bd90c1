"""What a training run writes as it goes, besides its checkpoint: the JSON Lines log (the log option)
and TensorBoard's event files (the tensorboard option: a folder per run inside it). Both get the same
rows; a failure to write either warns once (safety.SideWriter) and the run goes on without it. A
resumed run appends to both; its first row says where it resumed (resumed_from).

TensorBoard's files are written with tensorboardX: the standalone writer of TensorBoard's format
(no PyTorch or TensorFlow needed), kept up with TensorBoard's releases, and the same SummaryWriter
API as torch.utils.tensorboard, so TensorBoard reads its files like any other.
"""
from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

from ..core.errors import OutputError
from ..files.outputs import save_png

# row key -> TensorBoard tag; the same names a PyTorch run's logs use, grouped as TensorBoard shows them
TAGS = {"train_loss": "loss/train", "val_loss": "loss/val", "lr": "lr", "grad_norm": "grad_norm",
        "tokens_per_s": "tokens_per_s", "loss_scale": "loss_scale", "final_val_loss": "loss/val_final",
        "val_reward_accuracy": "dpo/reward_accuracy", "val_reward_margin": "dpo/reward_margin"}


def now() -> str:
    """The time of a row: UTC, ISO 8601, to the millisecond."""
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def claim_directory(path, data=None, claimed=()) -> Path:
    """The tensorboard option's directory: made if missing; an existing file is refused. TensorBoard's writer
    adds a file of its own name to it and never replaces one, so nothing there is lost. data: the
    run's data option; a directory of text there is read whole, at any depth, so the event files may
    not go inside it (the next run would read them as its text). claimed: the run's other outputs
    ({resolved path: what}), which it may not be (a directory made there would take its name)."""
    p = Path(path)
    if p.resolve() in claimed:
        raise OutputError(f"{{opt:tensorboard}} {p}: the {claimed[p.resolve()]} is written there; give another "
                          "directory for TensorBoard's event files")
    if data is not None and Path(data).is_dir():
        d, q = Path(data).resolve(), p.resolve()
        if q == d or d in q.parents:
            raise OutputError(f"{{opt:tensorboard}} {p} lies inside {{opt:data}} {data}, whose files are read as "
                              "the run's text; choose a directory outside it")
    if p.exists() and not p.is_dir():
        raise OutputError(f"{{opt:tensorboard}} {p} is a file; give a directory for TensorBoard's event files")
    try:
        p.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OutputError(f"{{opt:tensorboard}} {p}: cannot make it ({e.strerror}); choose another directory") from e
    return p


RUN_NAME_MAX = 100


def run_folder(parent: Path, name, stem: str) -> Path:
    """This run's folder of event files inside the tensorboard option's directory, so that two
    runs given one directory show as two runs in TensorBoard: a resumed run's own (name, as its
    checkpoint recorded it: a plain folder name, never a path), else a new one, STEM-YYYYmmdd-HHMMSS,
    made here with an exclusive mkdir (a second run in the same second gets -2, -3, ...)."""
    if isinstance(name, str) and 0 < len(name) <= RUN_NAME_MAX and Path(name).name == name \
            and name not in (".", ".."):
        d = parent / name
        try:
            d.mkdir(exist_ok=True)
            return d
        except OSError as e:
            raise OutputError(f"{{opt:tensorboard}} {d}: cannot make it ({e.strerror}); choose another "
                              "directory") from e
    base = f"{stem[:60]}-{datetime.now().strftime('%Y%m%d-%H%M%S')}"
    for i in range(1, 1000):
        d = parent / (base if i == 1 else f"{base}-{i}")
        try:
            d.mkdir()
            return d
        except FileExistsError:
            continue
        except OSError as e:
            raise OutputError(f"{{opt:tensorboard}} {d}: cannot make it ({e.strerror}); choose another "
                              "directory") from e
    raise OutputError(f"{{opt:tensorboard}} {parent}: 999 runs named {base} already; choose another directory")


class RunLog:
    """One run's log lines and event files. side: safety.SideWriter (a failure warns once)."""

    def __init__(self, side, log_path: Path | None, tensorboard: Path | None, resumed_from: int | None = None):
        self.side = side
        self.resumed_from = resumed_from      # a resumed run's first row says where it resumed
        self.log = side.attempt("log", open, log_path, "a") if log_path else None
        self.tb = side.attempt("TensorBoard log", _writer, tensorboard) if tensorboard else None
        self.guards = _guard(self.tb) if self.tb is not None else []

    def row(self, row: dict):
        """A logged step (or the run's final loss): its keys those of TAGS, and step."""
        row = {"time": now(), **row}
        if self.resumed_from is not None:
            row["resumed_from"], self.resumed_from = self.resumed_from, None
        if self.log is not None:
            line = json.dumps(row) + "\n"
            if self.side.attempt("log", lambda: (self.log.write(line), self.log.flush())) is None:
                self.log = None
        if self.tb is not None:
            def add():
                for key, tag in TAGS.items():
                    if row.get(key) is not None:
                        self.tb.add_scalar(tag, float(row[key]), int(row["step"]))
                self.tb.flush()
                failed = [f.error for f in self.guards if f.error is not None]
                if failed:
                    raise failed[0]
                return True
            if self.side.attempt("TensorBoard log", add) is None:
                self.tb = None          # its writer's file keeps dropping what it is given, quietly

    def close(self):
        if self.log is not None:
            self.side.attempt("log", self.log.close)
        if self.tb is not None:
            self.side.attempt("TensorBoard log", self.tb.close)


def _writer(directory: Path):
    from tensorboardX import SummaryWriter
    return SummaryWriter(logdir=str(directory), flush_secs=30)


class _Guarded:
    """An event file as tensorboardX writes it, from its own thread and at the process's exit: its
    first failure (a full disk) kept for the run's next row to report once, and every write after
    it dropped, so that neither the writer's thread nor its exit hook prints a traceback. No
    fileno: tensorboardX then skips its fsync, which would fail the same way outside this guard."""

    def __init__(self, f):
        self.f, self.error = f, None

    def _do(self, fn, *a):
        if self.error is None:
            try:
                return fn(*a)
            except OSError as e:
                self.error = e
        return None

    def write(self, data):
        return self._do(self.f.write, data)

    def flush(self):
        return self._do(self.f.flush)

    def close(self):
        try:
            self.f.close()
        except OSError as e:
            self.error = self.error or e


def _guard(writer) -> list:
    """Each of the writer's event files behind a _Guarded (tensorboardX's own objects: where they
    are not as expected, nothing is guarded and a failure is still said once)."""
    guards = []
    try:
        writer._get_file_writer()              # made when first asked: its event file is opened here
        for fw in writer.all_writers.values():
            record = fw.event_writer._ev_writer._py_recordio_writer
            record._writer = _Guarded(record._writer)
            guards.append(record._writer)
    except AttributeError:
        pass
    return guards


def plot_losses(history, path: Path):
    pts = [h for h in history if h.get("train") is not None]
    if not pts:
        return None
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot([h["step"] for h in pts], [h["train"] for h in pts], label="train")
    val = [h for h in history if h.get("val") is not None]
    if val:
        ax.plot([h["step"] for h in val], [h["val"] for h in val], "o-", label="validation")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats/token)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    return save_png(fig, path)
