"""Model configuration, TinyGPT's presets and the parameter table in .tinygpt order."""
from __future__ import annotations

from dataclasses import dataclass

from .block import BIASES, MLPS, NORM_EPS, NORMS, POSITIONS, QK_NORMS, ROPE_THETA, Block, block_of
from .errors import UsageError

# name: (layers, d_model, heads, ctx, batch), vocab 256, M = 4C: TinyGPT's table, and GPT-2 small's shape
PRESETS = {
    "tiny": (2, 48, 3, 32, 16),
    "small": (3, 96, 3, 64, 16),
    "medium": (4, 128, 4, 96, 16),
    "large": (6, 192, 6, 128, 12),
    "xl": (8, 256, 8, 128, 8),
    "huge": (12, 256, 8, 256, 8),
    "massive": (14, 384, 12, 256, 4),
    "mega": (14, 384, 12, 512, 2),
    "gpt2": (12, 768, 12, 1024, 1),     # GPT-2 small's shape, with its BPE vocabulary (PRESET_TOKENIZER)
}
GPT2_VOCAB = 50257
# Presets that come with a tokenizer other than bytes (the application's tokenizers by name) and its
# vocabulary: the preset names the model, the vocabulary with it.
PRESET_TOKENIZER = {"gpt2": ("gpt2", GPT2_VOCAB)}


# Largest values a config may hold, checked before anything is sized from them (a crafted
# checkpoint header must not make us build a table of 1e9 entries).
MAX_DIMS = {"layers": 4096, "d_model": 65536, "heads": 4096, "ctx": 1 << 20, "batch": 1 << 20,
            "d_mlp": 1 << 20, "vocab": 1 << 24}
MAX_PARAMS = 1 << 31            # 8 GiB of float32 weights, before gradients and moments
# The MLP's activation (core.block's MLPS): the exact erf GELU (TinyGPT's), GPT-2's tanh
# approximation, which GPT-2 was trained with (Hugging Face's "gelu_new"), or nanochat's squared ReLU.
ACTIVATIONS = tuple(MLPS)
ADAMW_BETA1, ADAMW_BETA2, ADAMW_EPS = 0.9, 0.95, 1e-8   # TinyGPT's AdamW: the one place they are set
UNSCORED = 0xFFFFFFFF           # a target that is not scored: no loss, no gradient (a chat file's prompts, padding)
TINYGPT_LR = 3e-4               # TinyGPT's constant learning rate (the constant schedule's default)


@dataclass(frozen=True)
class TrainDefaults:
    """What a training run of a preset runs when no flag says otherwise: linear warm-up, then
    cosine decay from lr to min_lr at the last step. tiny, small and medium: the best of the sweep
    in docs/results.md (Tiny Shakespeare, 2-core CPU, lavapipe); tiny takes 1e-2, not 2e-2, which scored
    0.008 better there but diverged in short runs at batch 4. The larger presets, too slow to sweep
    here, take lr scaled by 1/width from small's (the usual rule for wider models), not measured;
    gpt2 takes nanoGPT's for GPT-2 small (6e-4 to 6e-5)."""
    steps: int
    lr: float
    warmup: int
    min_lr: float


TRAIN_DEFAULTS = {
    "tiny": TrainDefaults(2000, 1e-2, 200, 1e-4),
    "small": TrainDefaults(2000, 1e-2, 200, 1e-4),
    "medium": TrainDefaults(1000, 5e-3, 100, 1e-4),
    "large": TrainDefaults(2000, 5e-3, 200, 1e-4),
    "xl": TrainDefaults(2000, 3.75e-3, 200, 1e-4),
    "huge": TrainDefaults(2000, 3.75e-3, 200, 1e-4),
    "massive": TrainDefaults(2000, 2.5e-3, 200, 1e-4),
    "mega": TrainDefaults(2000, 2.5e-3, 200, 1e-4),
    "gpt2": TrainDefaults(2000, 6e-4, 200, 6e-5),    # nanoGPT's GPT-2 small peak and floor, not swept here
}


class ConfigError(UsageError):
    pass


@dataclass
class Config:
    layers: int = 3
    d_model: int = 96
    heads: int = 3
    ctx: int = 64
    batch: int = 16
    d_mlp: int = 0  # 0 means 4 * d_model
    vocab: int = 256
    lr: float = 3e-4
    grad_clip: float = 1.0
    weight_decay: float = 0.1
    seed: int = 1337
    activation: str = "gelu"    # the MLP's activation: one of ACTIVATIONS
    window: int = 0             # sliding-window attention: each query sees its last `window` positions; 0: all
    norm: str = "layernorm"     # the block's parts (core.block): its norm, its position, RoPE's base, the norms' eps
    position: str = "learned"
    rope_theta: float = ROPE_THETA
    norm_eps: float = NORM_EPS
    bias: str = "all"           # which projections have biases: all, qkv, none
    tied: bool = True           # the head is the token table's product (False: lm_head of its own)
    qk_norm: str = "none"       # an RMSNorm over each head's q and k: none, weighted, free
    kv_heads: int = 0           # key/value heads, dividing heads (grouped-query attention); 0: heads
    softcap: float = 0.0        # the logits capped at +-softcap (cap tanh(z / cap)); 0: not capped
    embed_norm: bool = False    # the block's norm right after the token embedding (nanochat's)
    head_dim: int = 0           # channels a head where they are not d_model / heads (Qwen3-0.6B's 16 x 128 in a
                                # width of 1,024): q's and the attention's width is heads x head_dim; 0: d_model / heads
    rope_scaling: dict | None = None    # a scaled RoPE's frequencies (core.rope.SCALINGS: Llama 3's,
                                        # linear); None: none

    def __post_init__(self):
        if not self.d_mlp:
            self.d_mlp = 4 * self.d_model

    @property
    def hd(self) -> int:
        """Channels a head: head_dim, or d_model / heads."""
        return self.head_dim or self.d_model // self.heads

    @property
    def n_kv(self) -> int:
        """Key/value heads: kv_heads, or one a query head."""
        return self.kv_heads or self.heads

    @property
    def block(self) -> Block:
        return block_of(self)

    @property
    def attn_window(self) -> int:
        """The window the attention computes with: 0 where there is none or it holds the whole
        context (a window of ctx or more is plain causal attention)."""
        return self.window if 0 < self.window < self.ctx else 0

    def validate(self):
        """Every dimension positive and bounded, the parameter count by arithmetic: nothing here
        allocates or lists anything sized by the config."""
        for name, most in MAX_DIMS.items():
            v = getattr(self, name)
            if not isinstance(v, int) or v <= 0:
                raise ConfigError(f"{{opt:{name}}} must be a positive whole number, got {v!r}")
            if v > most:
                raise ConfigError(f"{{opt:{name}}} {v:,} is more than this tinygpt allows ({most:,})")
        hd = self.head_dim
        if isinstance(hd, bool) or not isinstance(hd, int) or not 0 <= hd <= 128:
            raise ConfigError(f"{{opt:head_dim}} must be a whole number from 1 to 128 (0 or absent: "
                              f"{{opt:d_model}} / {{opt:heads}}), got {hd!r}")
        if not hd and self.d_model % self.heads:
            fit = next(h for h in range(min(self.heads, self.d_model), 0, -1) if self.d_model % h == 0)
            raise ConfigError(f"{{opt:heads}} ({self.heads}) must divide {{opt:d_model}} ({self.d_model}); "
                              f"try {{opt:heads}} {fit}, or give {{opt:head_dim}}")
        if self.hd > 128:
            raise ConfigError(f"head dim {{opt:d_model}}/{{opt:heads}} = {self.hd} exceeds 128; "
                              "use more {opt:heads}")
        n = n_params(self)
        if n > MAX_PARAMS:
            raise ConfigError(f"the model would have {n:,} parameters, more than this tinygpt holds "
                              f"({MAX_PARAMS:,}); use fewer {{opt:layers}} or a smaller {{opt:d_model}}")
        if not self.lr > 0:
            raise ConfigError(f"{{opt:lr}} must be positive, got {self.lr}")
        if self.grad_clip < 0:
            raise ConfigError(f"{{opt:grad_clip}} must be >= 0 (0 turns clipping off), got {self.grad_clip}")
        if not isinstance(self.window, int) or isinstance(self.window, bool) or not 0 <= self.window <= MAX_DIMS["ctx"]:
            raise ConfigError(f"{{opt:sliding_window}} must be a whole number from 1 to {MAX_DIMS['ctx']:,} "
                              f"(0 or absent: none), got {self.window!r}")
        for name, opt, table in (("activation", "mlp", MLPS), ("norm", "norm", NORMS),
                                 ("position", "position", POSITIONS), ("bias", "bias", BIASES),
                                 ("qk_norm", "qk_norm", QK_NORMS)):
            if getattr(self, name) not in table:
                raise ConfigError(f"{{opt:{opt}}} {getattr(self, name)!r} is not one this tinygpt computes; "
                                  f"choose one of {', '.join(table)}")
        for name in ("rope_theta", "norm_eps", "softcap"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not (0 < v < float("inf") or
                                                                               (name == "softcap" and v == 0)):
                raise ConfigError(f"{{opt:{name}}} must be a positive finite number, got {v!r}")
        kv = self.kv_heads
        if isinstance(kv, bool) or not isinstance(kv, int) or kv < 0 or (kv and self.heads % kv):
            raise ConfigError(f"{{opt:kv_heads}} must divide {{opt:heads}} ({self.heads}): each key/value head "
                              f"serves heads / kv_heads query heads; got {kv!r}")
        for name in ("tied", "embed_norm"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name} is true or false, got {getattr(self, name)!r}")
        if self.block.position.rotary and self.hd % 4:
            raise ConfigError(f"{{opt:position}} rope turns each head's channels in pairs four at a time: the head "
                              f"dim ({{opt:head_dim}}, or {{opt:d_model}}/{{opt:heads}}) = {self.hd} must be a "
                              "multiple of 4")
        return self


def preset(name: str, **overrides) -> Config:
    if name not in PRESETS:
        raise ConfigError(f"unknown {{opt:preset}} {name!r}; choose one of {', '.join(PRESETS)}")
    L, C, H, T, B = PRESETS[name]
    cfg = Config(layers=L, d_model=C, heads=H, ctx=T, batch=B,
                 vocab=PRESET_TOKENIZER[name][1] if name in PRESET_TOKENIZER else 256)
    for k, v in overrides.items():
        if v is not None:
            setattr(cfg, k, v)
    if overrides.get("d_mlp") is None:
        cfg.d_mlp = mlp_width(cfg.d_model, cfg.activation)
    cfg.head_dim = own_head_dim(cfg.d_model, cfg.heads, cfg.head_dim)
    return cfg


def own_head_dim(d_model: int, heads: int, hd: int) -> int:
    """The head_dim a config holds: hd where the heads are set apart from the width, 0 where hd is
    d_model / heads (the default's value, as a file records it), so one shape has one config."""
    return 0 if hd * heads == d_model else hd


def mlp_width(C: int, activation: str) -> int:
    """The MLP's width where none is given: 4 C, or for a gated MLP (three matrices, not two) 8 C / 3
    rounded up to a multiple of 8, Llama's rule, so that the MLP keeps its parameter count."""
    return -(-8 * C // 24) * 8 if MLPS.get(activation, MLPS["gelu"]).gated else 4 * C


def param_shapes(cfg: Config):
    """[(name, shape, decayed)] in the .tinygpt order; decay on matrices and embeddings. The block's
    parts decide which exist: the position table (learned), the norms' biases (layernorm)."""
    V, C, T, M, blk = cfg.vocab, cfg.d_model, cfg.ctx, cfg.d_mlp, cfg.block
    norm = lambda n: ([(n + "_g", (C,), False)] if blk.norm.weights else []) + \
        ([(n + "_b", (C,), False)] if blk.norm.bias else [])
    lin = lambda p, W, b, shape: [(p + W, shape, True)] + ([(p + b, shape[1:], False)] if b in blk.bias.vectors else [])
    KVC = blk.heads.kv_width                                        # k's and v's width (grouped-query attention)
    QC = blk.heads.q_width                                          # q's and the attention's: heads x head dim
    shapes = [("tok_emb", (V, C), True)] + ([("pos_emb", (T, C), True)] if blk.position.table else [])
    shapes += (norm("ln_e") if blk.embed_norm else []) + norm("ln_f")
    for l in range(cfg.layers):
        p = f"h{l}."
        qk = [(p + "q_norm_g", (cfg.hd,), False), (p + "k_norm_g", (cfg.hd,), False)] \
            if blk.qk_norm.weights else []
        shapes += (norm(p + "ln1") + lin(p, "Wq", "bq", (C, QC)) + lin(p, "Wk", "bk", (C, KVC))
                   + lin(p, "Wv", "bv", (C, KVC)) + qk + lin(p, "Wo", "bo", (QC, C)) + norm(p + "ln2")
                   + (lin(p, "fc_gate_W", "fc_gate_b", (C, M)) if blk.mlp.gated else [])
                   + lin(p, "fc_in_W", "fc_in_b", (C, M)) + lin(p, "fc_out_W", "fc_out_b", (M, C)))
    return shapes + ([] if blk.tied else [("lm_head", (V, C), True)])     # an untied head's table last


def n_params(cfg: Config) -> int:
    """The sum over param_shapes, by arithmetic (no table is built, whatever the sizes)."""
    V, C, T, M, L, blk = cfg.vocab, cfg.d_model, cfg.ctx, cfg.d_mlp, cfg.layers, cfg.block
    norm = (int(blk.norm.bias) + int(blk.norm.weights)) * C
    KVC, QC = blk.heads.kv_width, blk.heads.q_width
    biases = sum({"fc_in_b": M, "fc_gate_b": M * blk.mlp.gated, "bq": QC, "bk": KVC, "bv": KVC}.get(b, C)
                 for b in blk.bias.vectors)
    qk = 2 * cfg.hd if blk.qk_norm.weights else 0
    mlp = (3 if blk.mlp.gated else 2) * C * M
    per_layer = 2 * C * QC + 2 * C * KVC + mlp + 2 * norm + biases + qk   # Wq..Wo, the MLP's; norms; biases; gains
    return (V * C * (1 if blk.tied else 2) + (T * C if blk.position.table else 0) + norm * (2 if blk.embed_norm else 1)
            + L * per_layer)
