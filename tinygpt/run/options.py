"""What a command asks for, as plain objects: the CLI builds them, the layers below read them.

TrainOptions is the recipe of a training run: each field is a setting, and its metadata says
which of the recipe's groups it belongs to (GROUPS), what checks its value (core.values) and
what it does (its help). tinygpt train's flags, their help and defaults, a config file's keys
and the Python API's keywords are all made from these fields (commands/settings.py), so
each is written once, here. Field names are the option names that errors and help write as
{opt:NAME}; the CLI turns NAME into the flag --NAME (underscores as dashes), the API keeps NAME.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields

from .. import tokenizers
from ..core import values
from ..core.block import BLOCKS, MLPS, NORM_EPS, NORMS, POSITIONS, QK_NORMS, ROPE_THETA
from ..core.config import PRESETS, TINYGPT_LR, TRAIN_DEFAULTS, Config
from ..core.lora import DEFAULT_TARGETS, MAX_RANK, TARGETS
from ..core.precision import PRECISIONS
from ..device.kernels import LOSS_SCALE, SCALE_GROWTH
from ..device.plan import FAMILIES, parse_kernels
from ..model import optimizers
from ..model.attention import DEFAULT as ATTENTION, IMPLS

MAX_GRAD_ACCUM = 4096

# The recipe's groups, in the order train's help shows them (its flags' sections) and a config
# file may hold them (a TOML table each, or bare keys). No group is named as a setting, so a
# table never reads as one.
GROUP_TITLES = {
    "shape": "the model's shape", "input": "data and tokenizer", "batching": "batch and accumulation",
    "training": "length and learning rate", "optimization": "optimizer",
    "numerics": "precision, attention and kernels", "adapters": "LoRA",
    "evaluation": "evaluation, logging and samples", "outputs": "files",
}


def setting(group: str, help: str, default=None, check=None, choices=None, metavar: str | None = None,
            toggle: bool = False, aliases: tuple = ()):
    """A field of the recipe. check: its value's check (core.values, or one that raises a
    TinyGPTError); choices: the names it takes; toggle: on or off (a flag and its no- form);
    aliases: other names its flag answers to."""
    meta = {"group": group, "help": help, "check": check, "choices": choices, "metavar": metavar,
            "toggle": toggle, "aliases": aliases}
    assert group in GROUP_TITLES, group
    if isinstance(default, dict):
        return field(default_factory=dict, metadata=meta)
    return field(default=default, metadata=meta)


_small, _base = TRAIN_DEFAULTS["small"], Config()
_shape = dict(zip(("layers", "d_model", "heads", "ctx", "batch"), PRESETS["small"]))

# How a run logs, evaluates, saves and ends, where no option says: the checkpoint keeps the values
# a run used (tinygptPy.settings), and a resumed run takes them again where no option says.
# (A path, such as the log's, is not kept: tinygpt opens no path read from a file.)
RUN_SETTINGS = {"eval_every": 100, "eval_windows": 64, "log_every": 10, "save_every": 500, "sample_tokens": 200,
                "sample_prompt": "The ",       # a bare newline sends greedy byte models into indentation
                "keep_best": False}


def _kept(name: str) -> str:
    """A run setting's default as its help says it."""
    v = RUN_SETTINGS[name]
    return f"default {repr(v) if isinstance(v, str) else v}, or the resumed run's"


def mlp_choices() -> str:
    """The MLPs as the option's help lists them, each with what it is (core.block's MLPS)."""
    said = [f"{m.name} ({m.summary})" for m in MLPS.values()]
    return ", ".join(said[:-1]) + " or " + said[-1]


def _preset(name: str) -> str:
    return f"default: the preset's, {_shape[name]} for small"


@dataclass
class TrainOptions:
    # -- the model's shape
    preset: str = setting("shape", f"one of {', '.join(PRESETS)} (default small)", "small", values.preset_name,
                          metavar="NAME")
    layers: int | None = setting("shape", f"transformer blocks ({_preset('layers')}; on {{opt:resume}}, the file's)",
                                 check=values.positive_int)
    d_model: int | None = setting("shape", f"the residual stream's width ({_preset('d_model')})",
                                  check=values.positive_int)
    heads: int | None = setting("shape", f"attention heads, dividing {{opt:d_model}} ({_preset('heads')})",
                                check=values.positive_int)
    ctx: int | None = setting("shape", f"context length in tokens ({_preset('ctx')})", check=values.positive_int)
    sliding_window: int | None = setting(
        "shape", "sliding-window attention: each position attends to its last N positions, itself included "
        "(upstream's slidingWindow; N >= ctx is plain causal attention; default: none, or the resumed model's)",
        check=values.positive_int, metavar="N")
    # the block's parts (core.block); a resumed model keeps its own
    block: str | None = setting(
        "shape", "a set of the parts below: gpt2 (TinyGPT's, GPT-2's), nanochat (rmsnorm_free also after the "
        "embedding, rope, relu2, no biases, an untied head, qk-norm free, logits capped at 15), llama (rmsnorm, "
        "rope at theta 500000, swiglu, no biases, an untied head); each part's own option over it (default gpt2, "
        "or the resumed model's)", choices=list(BLOCKS))
    norm: str | None = setting(
        "shape", "the block's norm: layernorm (GPT-2's, with biases) or rmsnorm (Llama's, nanochat's: no centring, "
        "no bias) (default layernorm, or the resumed model's)", choices=list(NORMS))
    norm_eps: float | None = setting("shape", f"the norms' eps (default {NORM_EPS:g}, or the resumed model's)",
                                     check=values.positive_float, metavar="X")
    position: str | None = setting(
        "shape", "learned (a position table added to the embedding, GPT-2's) or rope (q and k turned by their "
        "positions, Llama's and nanochat's: no table) (default learned, or the resumed model's)",
        choices=list(POSITIONS))
    rope_theta: float | None = setting(
        "shape", f"RoPE's base theta, with {{opt:position}} rope (default {ROPE_THETA:g}, or the resumed model's)",
        check=values.positive_float, metavar="X")
    mlp: str | None = setting(
        "shape", f"the MLP's activation: {mlp_choices()} (default gelu, or the resumed model's)", choices=list(MLPS))
    bias: bool | None = setting(
        "shape", "biases on every projection, q, k, v, o and the MLP's (GPT-2's), or on none (Llama's, nanochat's) "
        "(default: on, or the resumed model's)", toggle=True)
    untied_head: bool | None = setting(
        "shape", "the logits from a table of their own, lm_head [V, C] (Llama's, nanochat's), not from the token "
        "embedding (GPT-2's tied head) (default: tied, or the resumed model's)", toggle=True)
    qk_norm: str | None = setting(
        "shape", "an RMSNorm over each head's q and k before RoPE: weighted (a gain each, Qwen3's), free (no gains, "
        "nanochat's) or none (default none, or the resumed model's)", choices=list(QK_NORMS))
    kv_heads: int | None = setting(
        "shape", "key/value heads, dividing {opt:heads}: each serves heads / N query heads (grouped-query "
        "attention; 1: multi-query) (default: one a query head, or the resumed model's)", check=values.positive_int,
        metavar="N")
    head_dim: int | None = setting(
        "shape", "channels a head, where they are not {opt:d_model} / {opt:heads}: q and the attention are then "
        "heads x N wide, Wo maps them back to {opt:d_model} (Qwen3-0.6B's 16 heads of 128 in a width of 1,024) "
        "(default {opt:d_model} / {opt:heads}, or the resumed model's)", check=values.bounded_int(1, 128),
        metavar="N")
    logit_softcap: float | None = setting(
        "shape", "cap the logits at +-X, X tanh(z / X) (nanochat's 15; 0: none) (default none, or the resumed "
        "model's)", check=values.nonneg_float, metavar="X")
    embed_norm: bool | None = setting(
        "shape", "the block's norm also right after the token embedding (nanochat's) (default: off, or the resumed "
        "model's)", toggle=True)
    # -- data and tokenizer
    data: str | None = setting("input", "a UTF-8 text file, a directory of them, or a token file from tinygpt "
                                        "prepare (default: the built-in corpus); a chat file (.jsonl: "
                                        "{\"messages\": [...]} or {\"prompt\", \"completion\"} a line) trains on "
                                        "the assistant's tokens alone")
    val_data: str | None = setting("input", "a chat file to validate on (default: the last 5 per cent of {opt:data}'s "
                                            "records)", metavar="FILE")
    truncate: bool | None = setting("input", "cut a chat record longer than the window to it (default: refuse "
                                             "the record by its line)", toggle=True)
    dpo_beta: float | None = setting("input", "DPO's beta, how far a preference file's run may move from its "
                                              "reference (default 0.1)", check=values.positive_float, metavar="B")
    reference: str | None = setting("input", "a full fine-tune's DPO reference model (default: the weights the run "
                                             "starts from; a LoRA run's is its base)", metavar="FILE")
    tokenizer: str | None = setting(
        "input", f"{tokenizers.flag_help()}; default {tokenizers.DEFAULT}, or the preset's, the token file's or "
        "the resumed run's", choices=list(tokenizers.NAMES))
    tokenizer_file: str | None = setting(
        "input", "r50k_base.tiktoken, for the gpt2 tokenizer when tiktoken's cache lacks it and cannot download "
        "it (default: tiktoken's cache)", metavar="PATH")
    seed: int | None = setting("input", f"init and data sampling seed (default {_base.seed})", check=values.seed_int)
    # -- batch and accumulation
    batch: int | None = setting(
        "batching", f"windows of {{opt:ctx}} tokens a step (a micro-batch with {{opt:grad_accum}}; "
        f"{_preset('batch')}, or the resumed run's)", check=values.positive_int)
    grad_accum: int | None = setting(
        "batching", "N micro-batches of {opt:batch} windows per step, their gradients summed before one update "
        "(the step of a batch N x {opt:batch}; default 1, or the resumed run's)",
        check=values.bounded_int(1, MAX_GRAD_ACCUM), metavar="N")
    recompute: bool = setting(
        "batching", "save only each block's input and recompute its forward in the backward: less memory, one "
        "more forward of the blocks a step, the same gradients bit for bit", False, toggle=True)
    # -- length and learning rate
    steps: int | None = setting(
        "training", f"total steps (default: the preset's, {_small.steps} for small; on {{opt:resume}}, the run's "
        "planned end)", check=values.positive_int)
    minutes: float | None = setting(
        "training", "a time budget instead of {opt:steps}: the step count is fitted so the run ends on time "
        "(default: none, {opt:steps})", check=values.positive_float)
    schedule: str | None = setting(
        "training", f"cosine (default: warm-up, then cosine decay to {{opt:min_lr}}) or constant (TinyGPT's, lr "
        f"{TINYGPT_LR:g})", choices=["cosine", "constant"])
    lr: float | None = setting("training", f"peak learning rate (default: the preset's, {_small.lr:g} for small)",
                               check=values.positive_float)
    warmup: int | None = setting(
        "training", f"linear warm-up steps (default: the preset's, {_small.warmup} for small; at most a tenth of "
        "the run)", check=values.nonneg_int)
    min_lr: float | None = setting(
        "training", f"where the cosine decay ends (default: the preset's, {_small.min_lr:g} for small)",
        check=values.nonneg_float)
    rewarm: bool = setting(
        "training", "with {opt:resume}: restart the schedule at the file's step, a new warm-up to the peak lr and a "
        "cosine to {opt:min_lr} at the new last step (default: steps past the run's planned end continue at its "
        "final lr)", False, toggle=True)
    # -- optimizer
    optimizer: str | None = setting(
        "optimization", f"{optimizers.optimizer_help()}; default {optimizers.DEFAULT} for a new run, "
        f"{optimizers.LORA} for a LoRA run, a resumed run's own ({optimizers.UNRECORDED} where its file records "
        "none); resuming with another starts its state fresh", choices=list(optimizers.NAMES))
    weight_decay: float | None = setting(
        "optimization", f"decoupled weight decay of matrices and embeddings (default "
        f"{optimizers.WEIGHT_DECAY:g}, or the resumed run's)", check=values.nonneg_float, metavar="WD")
    # each optimizer's flagged hyperparameters (optimizers.FLAGS), their help its room's; None: the
    # optimizer's default (its room's Hyper), or the resumed run's
    beta1: float | None = setting("optimization", optimizers.flag_help("beta1"), check=values.unit_float)
    beta2: float | None = setting("optimization", optimizers.flag_help("beta2"), check=values.unit_float)
    momentum: float | None = setting("optimization", optimizers.flag_help("momentum"), check=values.unit_float)
    grad_clip: float | None = setting("optimization", f"global grad-norm clip (default {_base.grad_clip:g}, 0 = off)",
                                      check=values.nonneg_float)
    # -- precision, attention and kernels
    precision: str | None = setting(
        "numerics", "bf16, f16: matmul operands, q/k/v and saved activations stored in 16 bits, sums and weights "
        "float32 (default fp32, or the resumed run's); f16 needs the adapter's shader-f16 and scales the loss "
        "({opt:loss_scale}); checkpoints stay float32", choices=list(PRECISIONS))
    loss_scale: float | None = setting(
        "numerics", f"f16's first loss scale, then halved on overflow and doubled after {SCALE_GROWTH} clean steps "
        f"as PyTorch's GradScaler does (default {LOSS_SCALE:g}, or the resumed run's)",
        check=values.loss_scale_float, metavar="INIT")
    attention: str = setting(
        "numerics", f"the attention path: online (tiled, any length), naive (the score matrix) or fused_sv "
        f"(TinyGPT's kernels); the same numbers within float32 rounding (default {ATTENTION})", ATTENTION,
        choices=IMPLS)
    kernels: dict = setting(
        "numerics", "force kernel variants over the plan: " + "; ".join(f"{f}={'|'.join(v)}" for f, v in
                                                                       FAMILIES.items())
        + " (default: the plan's choice for this adapter, or tinygpt tune's)", {}, parse_kernels,
        metavar="FAMILY=VARIANT,...")
    # -- LoRA
    lora: int | None = setting(
        "adapters", "fine-tune {opt:resume}'s model through LoRA adapters of rank R (the base frozen, only the "
        "adapters trained; give the fine-tune's file with {opt:out}); a LoRA checkpoint resumes its own "
        "(default: no adapters)", check=values.bounded_int(1, MAX_RANK), metavar="R")
    lora_alpha: float | None = setting("adapters", "the adapters' alpha (scale A / R; default 2R)",
                                       check=values.positive_float, metavar="A")
    lora_targets: list | None = setting(
        "adapters", f"the matrices that get adapters, of {', '.join(TARGETS)} (default {','.join(DEFAULT_TARGETS)})",
        check=values.lora_targets, metavar="T,...")
    lora_biases: bool = setting("adapters", "with {opt:lora}, also train every bias and LayerNorm", False,
                                toggle=True)
    # -- evaluation, logging and samples: the run's settings (RUN_SETTINGS); None is the resumed
    # run's, else RUN_SETTINGS'
    eval_every: int | None = setting(
        "evaluation", "evaluate {opt:eval_windows} validation windows every N steps, and the whole split at the "
        f"end (0: never; {_kept('eval_every')})", check=values.nonneg_int)
    eval_windows: int | None = setting(
        "evaluation", f"validation windows per evaluation ({_kept('eval_windows')})", check=values.positive_int)
    log_every: int | None = setting(
        "evaluation", f"read the loss back and show it every N steps ({_kept('log_every')})",
        check=values.positive_int)
    save_every: int | None = setting(
        "evaluation", "save the checkpoint every N steps as well as at the end (0: only at the end; default "
        f"{_kept('save_every')[8:]})", check=values.nonneg_int)
    sample_tokens: int | None = setting(
        "evaluation", "length of the greedy and the sampled text printed at the end (0: none; default "
        f"{_kept('sample_tokens')[8:]})", check=values.nonneg_int)
    sample_prompt: str | None = setting(
        "evaluation", f"what the samples at the end continue ({_kept('sample_prompt')})")
    keep_best: bool | None = setting(
        "evaluation", "also keep the checkpoint of the best validation loss, as OUT.best.tinygpt beside {opt:out} "
        "(default: off, or the resumed run's)", toggle=True)
    # -- files
    out: str | None = setting("outputs", "checkpoint path (default: the {opt:resume} file, else runs/PRESET.tinygpt)")
    resume: str | None = setting(
        "outputs", "continue a .tinygpt checkpoint: weights, optimizer state, step, data sampling and the run's "
        "settings (default: a new run)")
    log: str | None = setting(
        "outputs", "append one JSON line per logged step (time, step, losses, lr, gradient norm, tokens/s) and one "
        "for the final whole-split loss to this JSON Lines file ({opt:log_file}: the same, as "
        "scripts/train_ddp.py spells it; default: none)", aliases=("log_file",))
    tensorboard: str | None = setting(
        "outputs", "write TensorBoard event files into DIR (TensorBoard's log directory): the losses, lr, gradient "
        "norm, tokens/s and f16's loss scale (default: none)", metavar="DIR")
    force: bool = setting("outputs", "replace {opt:out} (and its .loss.png) even if tinygpt did not write them",
                          False, toggle=True)
    quiet: bool = setting("outputs", "no progress bar", False, toggle=True)
    config: str | None = setting(
        "outputs", "take the settings from a TOML file, keyed by these settings' names (d_model = 96, steps = "
        "2000), bare or in a table of their group; the command line wins (default: none)", metavar="FILE.toml")


# The groups as train's help and a config file show them: (title, the settings in it).
GROUPS = {g: (title, tuple(f.name for f in fields(TrainOptions) if f.metadata["group"] == g))
          for g, title in GROUP_TITLES.items()}
GROUP_OF = {f.name: f.metadata["group"] for f in fields(TrainOptions)}


@dataclass
class ExportOptions:
    model: str
    format: str                        # safetensors | hf | gguf | peft | tinygpt | tinygpt-fp16
    out: str
    merge: bool = False                # a LoRA run's adapters folded into the weights
    gguf_type: str = "f16"             # gguf's matrices: f32 | f16 | bf16 | q8_0 (files.gguf_write.TYPES)
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
    ctx: int | None = None             # the windows' tokens (None: the model's context, at most infer.EVAL_CTX)
    truncate: bool = False             # a chat file's record longer than the window: cut, not refused
    dpo_beta: float | None = None      # a preference file's DPO beta (None: core.dpo.DPO_BETA)
    reference: str | None = None       # a preference file's DPO reference model (None: a LoRA file's base)


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
    ignore_eos: bool = False           # run to `tokens` past the model's end-of-turn tokens


@dataclass
class ChatOptions(ModelUse):
    model: str
    system: str | None = None          # the system prompt (None: the template's own default, if any)
    temperature: float = 0.0
    top_k: int | None = None
    top_p: float = 1.0
    max_tokens: int = 512              # a reply's most tokens
    seed: int = 0
    ignore_eos: bool = False


@dataclass
class InspectOptions(ModelUse):
    model: str
    prompt: str
    out: str
    force: bool = False
