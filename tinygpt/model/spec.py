"""The run spec: what a model is built for, as one value made once.

A command turns its options into a `RunSpec` (recipe.run_spec does it for `train` and `plan`); the
memory budget, `Model` and `Decoder` take it as it is, so that what the budget counted is what
the model allocates and no layer passes a dozen loose values on. The kernel plan is not in it:
that is the device's decision, made once beside it.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from ..core.config import Config
from ..core.lora import LoRA
from ..core.precision import FP32, Precision
from ..device.kernels import LOSS_SCALE
from .attention import DEFAULT, AttentionPath, path
from .optimizers import UNRECORDED, Settings, make_settings


@dataclass(frozen=True)
class RunSpec:
    cfg: Config                      # the model's shape (cfg.batch, cfg.ctx: B and T unless given)
    attention: AttentionPath | str = DEFAULT  # a path or its name; held as the path (attention.path)
    B: int | None = None             # sequences a step (a training run's micro-batch)
    T: int | None = None             # positions a sequence
    training: bool = True            # gradients, the optimizer's state, the loss scaler
    lm_head: bool = True             # the LM head and its logits (the cached decoder has its own)
    accum: int = 1                   # micro-batches a step (gradient accumulation)
    precision: Precision = FP32
    loss_scale: float = LOSS_SCALE   # the scaler's first scale, where the precision scales the loss
    recompute: bool = False          # one set of block activations, rebuilt in the backward
    lora: LoRA | None = None         # adapters trained on a frozen base
    optimizer: Settings | None = None   # None: optimizers.UNRECORDED's defaults (AdamW's)
    dpo: float | None = None         # DPO's beta: each micro-batch's windows are preference pairs (preference.wgsl)
    packed: bool = False             # windows hold several records, each attending within itself, its
                                     # positions restarting at 0 (the batch's docs: each row's position)

    def __post_init__(self):
        assert self.lm_head or not self.training, "training needs the LM head"
        assert self.lora is None or self.training, "an adapted model trains; evaluation and sampling take it merged"
        assert self.accum >= 1 and (self.accum == 1 or self.training), self.accum
        assert self.dpo is None or self.training and (self.B or self.cfg.batch) % 2 == 0, "pairs of windows"
        set_ = lambda name, value: object.__setattr__(self, name, value)
        set_("attention", path(self.attention))
        set_("B", self.B or self.cfg.batch)
        set_("T", self.T or self.cfg.ctx)
        set_("recompute", self.recompute and self.training)
        set_("optimizer", self.optimizer or make_settings(UNRECORDED))

    @property
    def out_in(self) -> bool:
        """Whether the blocks' matrices are held [out, in] (Hugging Face's order) and read by A @ B^T:
        in a model that does not train. A decode step's one-row products then read each weight row
        end to end, which streams from memory; [in, out]'s columns are read a few at a time across
        every row (docs/results.md, "Chat beside transformers"). A trained model keeps [in, out],
        which its backward's products read."""
        return not self.training

    @property
    def scaled(self) -> bool:
        """Whether a loss scaler guards this model's steps: a training run of a precision that has one."""
        return self.training and self.precision.loss_scaling

    def with_(self, **changes) -> RunSpec:
        return replace(self, **changes)


def rows_for(ctx: int, tokens: int, least: int = 64) -> int:
    """The rows a forward or a key/value cache takes for `tokens` live tokens of a model whose
    context is ctx: the power of two that holds them (at least `least`), never over ctx. The work
    and the buffers follow the tokens, and each size is built once (a few sizes, not one a length)."""
    rows = max(least, 1 << max(0, int(tokens) - 1).bit_length())
    return min(int(ctx), rows)


PROMPT_ROOM = 64       # the prompt tokens a sampler is sized for before the prompt is known (the end of a run)


def sampler_rows(ctx: int, tokens: int, prompt: int = 0) -> int:
    """A sampler's window: the prompt (at least PROMPT_ROOM tokens' room) and the tokens asked."""
    return rows_for(ctx, max(prompt, PROMPT_ROOM) + tokens)


def at_rows(cfg: Config, rows: int | None) -> Config:
    """The model's config over `rows` positions (its own ctx where None or not shorter): a window
    of a long-context model, its weights the same (a learned position table is cut to the rows:
    at_rows_params)."""
    return cfg if rows is None or rows >= cfg.ctx else replace(cfg, ctx=int(rows))


def at_rows_params(cfg: Config, params: dict) -> dict:
    """The parameters as a model of cfg (at_rows') binds them: a learned position table's first rows."""
    pos = params.get("pos_emb")
    if pos is None or pos.shape[0] <= cfg.ctx:
        return params
    return {**params, "pos_emb": pos[:cfg.ctx]}


def decoder_spec(cfg: Config, attention: AttentionPath | str = DEFAULT, N: int = 1,
                 precision: Precision = FP32, rows: int | None = None) -> RunSpec:
    """The run a sampler is (model.decode.Decoder): N sequences over a window of `rows` positions
    (rows_for: the prompt and the tokens asked; the model's whole context where None), no training."""
    cfg = at_rows(cfg, rows)
    return RunSpec(cfg, attention, B=N, T=cfg.ctx, training=False, precision=precision)
