"""What a command asks for, as plain objects: the CLI builds them, the layers below read them.

Field names are the option names that errors write as {opt:NAME}; the CLI turns
NAME into the flag --NAME (underscores as dashes).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..model.attention import DEFAULT as ATTENTION


@dataclass
class TrainOptions:
    preset: str = "small"
    layers: int | None = None
    d_model: int | None = None
    heads: int | None = None
    ctx: int | None = None
    sliding_window: int | None = None  # each query attends to its last N positions; None: all (or the resumed model's)
    batch: int | None = None
    grad_accum: int | None = None      # micro-batches per step; None: 1, or the resumed run's
    data: str | None = None            # None: the built-in corpus
    tokenizer: str | None = None       # None: byte, or the resumed file's
    tokenizer_file: str | None = None
    steps: int | None = None           # None: the preset's default (config.TRAIN_DEFAULTS), or the resumed run's
    minutes: float | None = None       # a time budget instead of steps
    schedule: str | None = None        # cosine | constant; None: the preset's (or the resumed file's)
    lr: float | None = None
    warmup: int | None = None
    min_lr: float | None = None
    rewarm: bool = False               # a resumed run past its planned end: a new warm-up and decay from its step
    grad_clip: float | None = None
    seed: int | None = None
    attention: str = ATTENTION
    kernels: dict = field(default_factory=dict)   # family -> variant, over the kernel plan
    precision: str | None = None       # fp32 | bf16 | f16; None: fp32, or the resumed run's
    loss_scale: float | None = None    # f16's first loss scale; None: 65536, or the resumed run's
    optimizer: str | None = None       # model.optimizers.NAMES; None: its DEFAULT (LORA for a LoRA run),
                                       # or the resumed run's
    weight_decay: float | None = None  # None: 0.1, or the resumed run's (its optimizer's)
    # the optimizers' flagged hyperparameters (model.optimizers.FLAGS); None: the optimizer's
    # default (its room's Hyper), or the resumed run's
    beta1: float | None = None
    beta2: float | None = None
    momentum: float | None = None
    recompute: bool = False            # keep each block's input only, recompute its forward in the backward
    lora: int | None = None            # LoRA's rank: adapters on a frozen base (None: every weight trains,
                                       # or the resumed run's adapters)
    lora_alpha: float | None = None    # None: 2 x rank
    lora_targets: list | None = None   # of core.lora.TARGETS; None: q, k, v, o
    lora_biases: bool = False          # also train every bias and LayerNorm
    # the run's settings (RUN_SETTINGS): None is the resumed run's, else RUN_SETTINGS'
    eval_every: int | None = None
    eval_windows: int | None = None
    log_every: int | None = None
    save_every: int | None = None
    sample_tokens: int | None = None   # the greedy and the sampled text at the end; 0: none
    sample_prompt: str | None = None
    keep_best: bool | None = None      # also keep the checkpoint of the best validation loss
    log: str | None = None
    tensorboard: str | None = None     # a directory for TensorBoard's event files
    out: str | None = None             # None: the resumed file, else runs/PRESET.tinygpt
    force: bool = False
    resume: str | None = None
    quiet: bool = False
    config: str | None = None          # the TOML file the settings came from (an input no output may be)


# The recipe's groups: every field of TrainOptions in one, in the order train's help shows
# them (its flags' sections) and a config file may hold them (a TOML table each, or bare keys).
# No group is named as a field, so a table never reads as a setting.
GROUPS = {
    "shape": ("the model's shape", ("preset", "layers", "d_model", "heads", "ctx", "sliding_window")),
    "input": ("data and tokenizer", ("data", "tokenizer", "tokenizer_file", "seed")),
    "batching": ("batch and accumulation", ("batch", "grad_accum", "recompute")),
    "training": ("length and learning rate", ("steps", "minutes", "schedule", "lr", "warmup", "min_lr", "rewarm")),
    "optimization": ("optimizer", ("optimizer", "weight_decay", "beta1", "beta2", "momentum", "grad_clip")),
    "numerics": ("precision, attention and kernels", ("precision", "loss_scale", "attention", "kernels")),
    "adapters": ("LoRA", ("lora", "lora_alpha", "lora_targets", "lora_biases")),
    "evaluation": ("evaluation, logging and samples", ("eval_every", "eval_windows", "log_every", "save_every",
                                                        "sample_tokens", "sample_prompt", "keep_best")),
    "outputs": ("files", ("out", "resume", "log", "tensorboard", "force", "quiet", "config")),
}
GROUP_OF = {name: group for group, (_, names) in GROUPS.items() for name in names}


# How a run logs, evaluates, saves and ends, where no option says: the checkpoint keeps the values
# a run used (tinygptPy.settings), and a resumed run takes them again where no option says.
# (A path, such as the log's, is not kept: tinygpt opens no path read from a file.)
RUN_SETTINGS = {"eval_every": 100, "eval_windows": 64, "log_every": 10, "save_every": 500, "sample_tokens": 200,
                "sample_prompt": "The ",       # a bare newline sends greedy byte models into indentation
                "keep_best": False}


@dataclass
class ExportOptions:
    model: str
    format: str                        # safetensors | hf | peft | tinygpt | tinygpt-fp16
    out: str
    merge: bool = False                # a LoRA run's adapters folded into the weights
    force: bool = False
    tokenizer_file: str | None = None  # r50k_base.tiktoken, for a gpt2 model's hf export


@dataclass(kw_only=True)
class ModelUse:
    """What every command that runs a saved model shares."""
    attention: str = ATTENTION
    kernels: dict = field(default_factory=dict)
    tokenizer_file: str | None = None
    adapters: str | None = None        # a PEFT directory (the export's peft format) folded into the model
    precision: str = "fp32"            # bf16, f16: the forward stores its activations and weights in it


@dataclass
class EvalOptions(ModelUse):
    model: str
    data: str | None = None
    max_windows: int | None = None
    quiet: bool = False                # no progress bar


@dataclass
class SampleOptions(ModelUse):
    model: str
    prompt: str = "\n"
    tokens: int = 200
    temperature: float = 0.8
    top_k: int | None = None
    top_p: float = 1.0
    num_samples: int = 1
    no_cache: bool = False             # the whole window's forward per token (the plan's decode=full)
    seed: int = 0


@dataclass
class InspectOptions(ModelUse):
    model: str
    prompt: str
    out: str
    force: bool = False
