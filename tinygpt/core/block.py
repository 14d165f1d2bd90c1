"""The block's parts, each a value registered once by name: the norm, the position and the MLP's
activation. A config names its parts (Config.norm, .position, .activation) and `block_of` turns the
names into the one Block value that the parameter table, the device model, the reference, the
file and the memory plan read; nothing else compares a part's name.

    norm      layernorm: y = g (x - mean) rstd + b (GPT-2's, TinyGPT's)
              rmsnorm:   y = g x rstd, rstd = 1 / sqrt(mean(x^2) + eps) (Llama's): no centring and
                         no bias (layernorm.wgsl's kernels with their rms switch)
              rmsnorm_free: the same without the gain (nanochat's: g = 1, no parameter)
    position  learned:   a [ctx, C] table added to the token embedding (GPT-2's)
              rope:      q and k of each head turned by angles pos * theta^(-2i/hd), in the
                         rotate-half layout of transformers and nanochat (rope.wgsl), no table
    mlp       gelu | gelu_tanh: the exact GELU (TinyGPT's), GPT-2's tanh form
              relu2:     relu(x)^2 (nanochat's; Primer's squared ReLU)
              swiglu:    silu(gate) * up, gate a third projection fc_gate_W (Llama's, Qwen's; glu.wgsl)
    bias      all:  every projection has a bias (GPT-2's); qkv: q, k and v alone (Qwen2's);
              none: no projection has one (Llama's, nanochat's)
    head      tied: the logits are the token table's product (GPT-2's); untied: a table of their
              own, lm_head [V, C] (Llama's, nanochat's)
    heads     H query heads and KV key/value heads, KV dividing H: each kv head serves H / KV query
              heads (grouped-query attention; KV = 1 is multi-query, KV = H GPT-2's own); hd channels
              each, d_model / H or set apart (q and the attention H hd wide, Wo [H hd, C]: Qwen3-0.6B's)
    softcap   0 (none), or the logits capped at +-cap: cap tanh(z / cap) (nanochat's, at 15)
    embed_norm the block's norm also right after the token embedding (nanochat's; ln_e)
    qk_norm   none (GPT-2's, Llama's); weighted: an RMSNorm over each head's q and each head's k,
              with a gain [hd] each (Qwen3's q_norm, k_norm); free: the same without gains
              (nanochat's). Applied where q and k are written, before RoPE turns them

A new part is a new value in one of these tables, its kernels and its twins, and its tests.
BLOCKS names sets of parts (the blocks of the models people train), as Config fields.
"""
from __future__ import annotations

from dataclasses import dataclass

from .activations import ACTIVATIONS, Activation


@dataclass(frozen=True)
class Norm:
    name: str
    rms: bool            # RMSNorm's: no centring, no bias
    weights: bool = True     # a gain g [C] (without: g = 1)

    @property
    def bias(self) -> bool:
        return not self.rms


@dataclass(frozen=True)
class Position:
    name: str
    table: bool          # a learned [ctx, C] table, added where the tokens are embedded
    rotary: bool         # q and k turned by their positions before the attention


@dataclass(frozen=True)
class Mlp:
    name: str
    act: Activation | None = None   # its activation's room (core.activations: WGSL, twins); None: gated
    gated: bool = False  # a gate projection beside the input one (fc_gate_W, fc_gate_b)
    forward: str | None = None      # a gated one's launchers and twins (glu.wgsl), which read gate and up
    backward: str | None = None     # as stored whatever the precision
    hf_name: str | None = None     # its name in Hugging Face's configs (GPT-2's activation_function, the Llama
                                   # family's hidden_act: a gated one's gate activation); None: none
    summary: str = ""    # what it is, as the option's help says


NORMS = {n.name: n for n in (Norm("layernorm", rms=False), Norm("rmsnorm", rms=True),
                             Norm("rmsnorm_free", rms=True, weights=False))}
POSITIONS = {p.name: p for p in (Position("learned", table=True, rotary=False),
                                 Position("rope", table=False, rotary=True))}
MLPS = {m.name: m for m in (
    Mlp("gelu", ACTIVATIONS["gelu"], hf_name="gelu", summary="TinyGPT's exact GELU"),
    Mlp("gelu_tanh", ACTIVATIONS["gelu_tanh"], hf_name="gelu_new", summary="GPT-2's tanh form"),
    Mlp("relu2", ACTIVATIONS["relu2"], summary="nanochat's squared ReLU"),
    Mlp("swiglu", gated=True, forward="swiglu_forward", backward="swiglu_backward", hf_name="silu",
        summary="Llama's gated MLP, 8/3 as wide"))}
UPSTREAM_MLP = MLPS["gelu"]     # TinyGPT's exact GELU: what a .tinygpt header without "activation" means


@dataclass(frozen=True)
class Bias:
    name: str
    vectors: tuple       # the block's bias vectors that exist (model.block.VECTORS' names)
    label: str           # what the banner says of it
    toggle: bool | None = None    # the on/off option's value that chooses it (qkv's: none, it comes from a file)


BIASES = {b.name: b for b in (Bias("all", ("bq", "bk", "bv", "bo", "fc_gate_b", "fc_in_b", "fc_out_b"), "biases", True),
                              Bias("qkv", ("bq", "bk", "bv"), "q/k/v biases"), Bias("none", (), "no biases", False))}
BIAS_OF_TOGGLE = {b.toggle: b.name for b in BIASES.values() if b.toggle is not None}
@dataclass(frozen=True)
class QKNorm:
    name: str
    on: bool
    weights: bool        # a gain [hd] for q and one for k, each layer: q_norm_g, k_norm_g


QK_NORMS = {q.name: q for q in (QKNorm("none", False, False), QKNorm("weighted", True, True),
                                QKNorm("free", True, False))}
@dataclass(frozen=True)
class Heads:
    q: int               # query heads
    kv: int              # key/value heads, dividing q
    hd: int              # channels a head
    apart: bool = False  # hd set apart from d_model / heads: q * hd is not the residual width (Qwen3-0.6B's)

    @property
    def grouped(self) -> bool:
        return self.kv < self.q

    @property
    def q_width(self) -> int:
        """Channels of q and of the attention's output: q * hd."""
        return self.q * self.hd

    @property
    def kv_width(self) -> int:
        """Channels of k and v: kv * hd."""
        return self.kv * self.hd


HEAD_TABLES = ("tok_emb", "lm_head")     # the [V, C] tables: the embedding's, and an untied head's
ROPE_THETA = 10000.0       # RoPE's base where a config gives none (GPT-NeoX's, Llama 2's, nanochat's)

# Config fields a block sets (its parts; the shape's other fields stay the preset's): GPT-2's is every
# default; nanochat's (karpathy/nanochat's GPT) is RoPE, QK-norm, ReLU², parameter-free RMSNorm also
# after the embedding, no biases, an untied head and the logits capped at 15; Llama's (Llama 3's) is
# RMSNorm with gains, RoPE at base 500,000, SwiGLU (its width 8/3 of 4 C: config.mlp_width), no
# biases and an untied head. Grouped-query attention is an option of both (the kv_heads option here);
# their initialisations are not parts (the trainer's own is used).
BLOCKS = {"gpt2": {},
          "nanochat": {"norm": "rmsnorm_free", "position": "rope", "activation": "relu2", "bias": "none",
                       "tied": False, "qk_norm": "free", "softcap": 15.0, "embed_norm": True},
          "llama": {"norm": "rmsnorm", "position": "rope", "rope_theta": 500000.0, "activation": "swiglu",
                    "bias": "none", "tied": False}}
NORM_EPS = 1e-5            # TinyGPT's LayerNorm eps, and every norm's where a config gives none


@dataclass(frozen=True)
class Block:
    """A model's parts, resolved from its config once."""
    norm: Norm
    position: Position
    mlp: Mlp
    bias: Bias = BIASES["all"]
    tied: bool = True
    qk_norm: QKNorm = QK_NORMS["none"]
    heads: Heads = Heads(1, 1, 1)
    softcap: float = 0.0
    embed_norm: bool = False
    rope_theta: float = ROPE_THETA
    eps: float = NORM_EPS

    @property
    def head(self) -> str:
        """The table the logits are the product of."""
        return "tok_emb" if self.tied else "lm_head"

    @property
    def gpt2(self) -> bool:
        """Whether this is GPT-2's (TinyGPT's) block, which upstream's readers compute: a LayerNorm,
        a learned table, a GELU of either form, every head its own keys and values, d_model / heads wide."""
        return (not self.norm.rms and self.position.table and not self.mlp.gated and self.mlp.hf_name is not None
                and self.bias is BIASES["all"] and self.tied and not self.qk_norm.on and not self.heads.grouped
                and not self.heads.apart and not self.softcap and not self.embed_norm)

    def describe(self) -> str:
        """One line for the banner, info and plan."""
        pos = f"rope (theta {self.rope_theta:g})" if self.position.rotary else self.position.name
        qk = f", qk-norm {self.qk_norm.name}" if self.qk_norm.on else ""
        qk += f", {self.heads.kv} kv heads" if self.heads.grouped else ""
        qk += f", {self.heads.q} heads of {self.heads.hd}" if self.heads.apart else ""
        qk += f", logits capped at {self.softcap:g}" if self.softcap else ""
        qk += ", normed embedding" if self.embed_norm else ""
        return f"{self.norm.name} (eps {self.eps:g}), {pos}, {self.mlp.name}, {self.bias.label}, " + \
            ("tied head" if self.tied else "untied head") + qk


def block_of(cfg) -> Block:
    """The Block a config names (Config.validate has checked the names)."""
    heads = Heads(cfg.heads, cfg.n_kv, cfg.hd, cfg.hd * cfg.heads != cfg.d_model)
    return Block(NORMS[cfg.norm], POSITIONS[cfg.position], MLPS[cfg.activation], BIASES[cfg.bias], bool(cfg.tied),
                 QK_NORMS[cfg.qk_norm], heads, float(cfg.softcap), bool(cfg.embed_norm), float(cfg.rope_theta),
                 float(cfg.norm_eps))
