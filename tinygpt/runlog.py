"""What a training run writes as it goes, besides its checkpoint: the JSON Lines log (the log option)
and TensorBoard's event files (the tensorboard option). Both get the same rows; a failure to write either warns
once (safety.SideWriter) and the run goes on without it.

TensorBoard's files are written with tensorboardX: the standalone writer of TensorBoard's format
(no PyTorch or TensorFlow needed), kept up with TensorBoard's releases, and the same SummaryWriter
API as torch.utils.tensorboard, so TensorBoard reads its files like any other.
"""
from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

from .core.errors import OutputError

# row key -> TensorBoard tag; the same names a PyTorch run's logs use, grouped as TensorBoard shows them
TAGS = {"train_loss": "loss/train", "val_loss": "loss/val", "lr": "lr", "grad_norm": "grad_norm",
        "tokens_per_s": "tokens_per_s", "loss_scale": "loss_scale", "final_val_loss": "loss/val_final"}


def now() -> str:
    """The time of a row: UTC, ISO 8601, to the millisecond."""
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def claim_directory(path, data=None) -> Path:
    """The tensorboard option's directory: made if missing; an existing file is refused. TensorBoard's writer
    adds a file of its own name to it and never replaces one, so nothing there is lost. data: the
    run's data option; a directory of text there is read whole, at any depth, so the event files may
    not go inside it (the next run would read them as its text)."""
    p = Path(path)
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


class RunLog:
    """One run's log lines and event files. side: safety.SideWriter (a failure warns once)."""

    def __init__(self, side, log_path: Path | None, tensorboard: Path | None):
        self.side = side
        self.log = side.attempt("log", open, log_path, "a") if log_path else None
        self.tb = side.attempt("TensorBoard log", _writer, tensorboard) if tensorboard else None

    def row(self, row: dict):
        """A logged step (or the run's final loss): its keys those of TAGS, and step."""
        row = {"time": now(), **row}
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
                return True
            if self.side.attempt("TensorBoard log", add) is None:
                self.tb = None

    def close(self):
        if self.log is not None:
            self.side.attempt("log", self.log.close)
        if self.tb is not None:
            self.side.attempt("TensorBoard log", self.tb.close)


def _writer(directory: Path):
    from tensorboardX import SummaryWriter
    return SummaryWriter(logdir=str(directory), flush_secs=30)
