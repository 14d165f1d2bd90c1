"""Model configuration, TinyGPT's presets and the parameter table in .tinygpt order."""
from __future__ import annotations

from dataclasses import dataclass, field

# name: (layers, d_model, heads, ctx, batch), vocab 256, M = 4C (TINYGPT.md)
PRESETS = {
    "tiny": (2, 48, 3, 32, 16),
    "small": (3, 96, 3, 64, 16),
    "medium": (4, 128, 4, 96, 16),
    "large": (6, 192, 6, 128, 12),
    "xl": (8, 256, 8, 128, 8),
    "huge": (12, 256, 8, 256, 8),
    "massive": (14, 384, 12, 256, 4),
    "mega": (14, 384, 12, 512, 2),
}


class ConfigError(ValueError):
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
    extra: dict = field(default_factory=dict)

    def __post_init__(self):
        if not self.d_mlp:
            self.d_mlp = 4 * self.d_model

    @property
    def head_dim(self) -> int:
        return self.d_model // self.heads

    def validate(self):
        for name in ("layers", "d_model", "heads", "ctx", "batch", "d_mlp", "vocab"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name.replace('_', '-')} must be positive, got {getattr(self, name)}")
        if self.d_model % self.heads:
            raise ConfigError(f"heads ({self.heads}) must divide d-model ({self.d_model}); "
                              f"try --heads {next(h for h in range(min(self.heads, self.d_model), 0, -1) if self.d_model % h == 0)}")
        if self.head_dim > 128:
            raise ConfigError(f"head dim d-model/heads = {self.head_dim} exceeds 128; use more --heads")
        if not self.lr > 0:
            raise ConfigError(f"lr must be positive, got {self.lr}")
        if self.grad_clip < 0:
            raise ConfigError(f"grad-clip must be >= 0 (0 turns clipping off), got {self.grad_clip}")
        return self


def preset(name: str, **overrides) -> Config:
    if name not in PRESETS:
        raise ConfigError(f"unknown preset {name!r}; choose one of {', '.join(PRESETS)}")
    L, C, H, T, B = PRESETS[name]
    cfg = Config(layers=L, d_model=C, heads=H, ctx=T, batch=B)
    for k, v in overrides.items():
        if v is not None:
            setattr(cfg, k, v)
    if overrides.get("d_model") is not None and overrides.get("d_mlp") is None:
        cfg.d_mlp = 4 * cfg.d_model
    return cfg


def param_specs(cfg: Config):
    """[(name, shape, decayed)] in the .tinygpt order; decay on matrices and embeddings."""
    V, C, T, M = cfg.vocab, cfg.d_model, cfg.ctx, cfg.d_mlp
    specs = [("tok_emb", (V, C), True), ("pos_emb", (T, C), True), ("ln_f_g", (C,), False), ("ln_f_b", (C,), False)]
    for l in range(cfg.layers):
        p = f"h{l}."
        specs += [
            (p + "ln1_g", (C,), False), (p + "ln1_b", (C,), False),
            (p + "Wq", (C, C), True), (p + "bq", (C,), False),
            (p + "Wk", (C, C), True), (p + "bk", (C,), False),
            (p + "Wv", (C, C), True), (p + "bv", (C,), False),
            (p + "Wo", (C, C), True), (p + "bo", (C,), False),
            (p + "ln2_g", (C,), False), (p + "ln2_b", (C,), False),
            (p + "fc_in_W", (C, M), True), (p + "fc_in_b", (M,), False),
            (p + "fc_out_W", (M, C), True), (p + "fc_out_b", (C,), False),
        ]
    return specs


def n_params(cfg: Config) -> int:
    n = 0
    for _, shape, _ in param_specs(cfg):
        k = 1
        for s in shape:
            k *= s
        n += k
    return n
