"""The optimizer's settings: a value made once from the options (or a resumed file) and passed
down, as the precision policy and LoRA are. The device's side of each optimizer (its buffers, its
dispatches, its state) is model.optim's; the reference's float64 step is reference.optim's; both
read these settings and nothing else.

    adamw  TinyGPT's: beta1 0.9, beta2 0.95, eps 1e-8, bias-corrected, decoupled decay
    lion   Chen et al., 2023: w -= lr (sign(beta1 m + (1 - beta1) g) + wd w);
           m = beta2 m + (1 - beta2) g. One moment; its lr is about a tenth of AdamW's
    muon   Jordan et al., 2024: on every weight matrix inside the blocks (q, k, v, o and the MLP's
           two), momentum with Nesterov, then five quintic Newton-Schulz iterations towards the
           nearest orthogonal matrix; embeddings, biases and LayerNorms by AdamW in the same step

Muon's learning rate by shape is torch.optim.Muon's "match_rms_adamw" rule: lr 0.2 sqrt(max(rows,
cols)), which gives the orthogonalised update the RMS of a typical AdamW update, so that one
learning rate (and one weight decay) serves both the matrices and the AdamW part, as in Moonshot's
Muon (Liu et al., 2025). Its "original" rule, max(1, rows / cols)^0.5, needs a second learning
rate, about 0.02, for the matrices: a second knob for every run to sweep.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from .config import ADAMW_BETA1, ADAMW_BETA2, ADAMW_EPS
from .errors import TinyGPTError, UsageError

NAMES = ("adamw", "lion", "muon")
MUON_MATRICES = ("Wq", "Wk", "Wv", "Wo", "fc_in_W", "fc_out_W")   # the blocks' matrices
NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)      # a, b, c of X <- a X + (b A + c A^2) X, A = X X^T
NS_STEPS = 5
NS_EPS = 1e-7                                    # the Frobenius norm's floor before the iterations
# Newton-Schulz runs over a batch of matrices of one shape in each dispatch while the batch holds
# at most this many floats (4 MiB): small matrices' iterations are too short to fill a dispatch
# alone (docs/results.md, "Optimizers": batched against one matrix at a time), while a matrix of
# GPT-2 small's, 768 x 3072, fills one by itself and takes no scratch beyond its own.
NS_BATCH_FLOATS = 1 << 20
WEIGHT_DECAY = 0.1
# tinygpt train's optimizer for a new run: Muon learned more per minute than AdamW at the first
# run's budget (docs/results.md, "Optimizers"). A LoRA run takes adamw (its files and PEFT's
# export carry AdamW moments), and a resumed file its own (adamw where it records none).
DEFAULT = "muon"
# the flat buffers (in the parameter layout) each optimizer's state lives in: the buffer table's
# rows (model.optim) and the keys of the reference's state (reference.optim)
STATE_ROWS = {"adamw": ("adam m", "adam v"), "lion": ("lion m",), "muon": ("muon m", "muon v")}

# each optimizer's defaults (torch.optim.Muon's momentum 0.95 and Nesterov; Lion's paper's betas)
DEFAULTS = {
    "adamw": {"beta1": ADAMW_BETA1, "beta2": ADAMW_BETA2, "eps": ADAMW_EPS},
    "lion": {"beta1": 0.9, "beta2": 0.99},
    "muon": {"beta1": ADAMW_BETA1, "beta2": ADAMW_BETA2, "eps": ADAMW_EPS, "momentum": 0.95, "nesterov": True},
}


@dataclass(frozen=True)
class OptimizerSettings:
    name: str
    weight_decay: float = WEIGHT_DECAY
    beta1: float = ADAMW_BETA1          # adamw's and muon's AdamW part; lion's interpolation
    beta2: float = ADAMW_BETA2          # adamw's and muon's AdamW part; lion's moment
    eps: float = ADAMW_EPS
    momentum: float = 0.0               # muon's matrices
    nesterov: bool = False

    def as_dict(self) -> dict:
        """The file's record of the settings (tinygptPy.optimizer): the ones this optimizer reads."""
        keys = ("weight_decay",) + tuple(DEFAULTS[self.name])
        camel = lambda k: "weightDecay" if k == "weight_decay" else k
        return {"name": self.name, **{camel(k): v for k, v in asdict(self).items() if k in keys}}

    def describe(self) -> str:
        d = self.as_dict()
        return f"{self.name} (" + ", ".join(f"{k} {v:g}" if not isinstance(v, bool) else f"{k} {str(v).lower()}"
                                           for k, v in d.items() if k != "name") + ")"


def _unit(v, what: str, lo: float = 0.0, hi: float = 1.0, open_hi: bool = True) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not lo <= v \
            or (v >= hi if open_hi else v > hi):
        raise UsageError(f"{what} must be a number from {lo:g} to {hi:g}{' (not included)' if open_hi else ''}, "
                         f"got {v!r}")
    return float(v)


def make_settings(name: str, weight_decay: float | None = None, beta1: float | None = None,
                  beta2: float | None = None, momentum: float | None = None) -> OptimizerSettings:
    """The settings from the options (None: the optimizer's default), each value checked."""
    if name not in NAMES:
        raise UsageError(f"{{opt:optimizer}} takes {', '.join(NAMES)}; got {name!r}")
    d = dict(DEFAULTS[name])
    if momentum is not None and "momentum" not in d:
        raise UsageError(f"{{opt:momentum}} is Muon's; {name} has betas: give {{opt:beta1}} and {{opt:beta2}}")
    for key, val in (("beta1", beta1), ("beta2", beta2), ("momentum", momentum)):
        if val is not None:
            d[key] = _unit(val, f"{{opt:{key}}}")
    wd = WEIGHT_DECAY if weight_decay is None else _unit(weight_decay, "{opt:weight_decay}", 0.0, 10.0, False)
    return OptimizerSettings(name, wd, **d)


def settings_from_record(rec, what: str) -> OptimizerSettings:
    """The settings a file's tinygptPy.optimizer records, checked as the options are."""
    if not isinstance(rec, dict) or rec.get("name") not in NAMES:
        name = rec.get("name") if isinstance(rec, dict) else rec
        raise TinyGPTError(f"{what}: its optimizer record names {name!r}, which this tinygpt does not know")
    try:
        s = make_settings(rec["name"], rec.get("weightDecay"), rec.get("beta1"), rec.get("beta2"),
                          rec.get("momentum"))
    except UsageError as e:
        raise TinyGPTError(f"{what}: its optimizer record holds settings this tinygpt refuses ({e})") from e
    return s


def is_muon_matrix(name: str) -> bool:
    """A parameter Muon orthogonalises: one of the blocks' matrices ("hL.Wq", ...)."""
    return name.partition(".")[2] in MUON_MATRICES


def ns_batches(specs) -> list:
    """[((K, N), [names])]: Muon's matrices among specs [(name, shape, ...)] grouped by shape in
    the order they come, each group cut into batches of at most NS_BATCH_FLOATS floats (one matrix
    at least): one Newton-Schulz, dispatch by dispatch, for each batch."""
    groups: dict = {}
    for name, shape, *_ in specs:
        if is_muon_matrix(name):
            groups.setdefault(tuple(shape), []).append(name)
    out = []
    for (K, N), names in groups.items():
        per = max(1, NS_BATCH_FLOATS // (K * N))
        out += [((K, N), names[i:i + per]) for i in range(0, len(names), per)]
    return out


def muon_ratio(shape) -> float:
    """The learning rate's scale for a matrix of this shape: match_rms_adamw's 0.2 sqrt(max)."""
    return 0.2 * math.sqrt(max(shape))
