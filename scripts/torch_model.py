"""The same GPT in PyTorch, for bench_train.py, bench_learning.py and train_ddp.py beside it.
Imported only where torch is (an optional extra: pip install 'tinygpt[torch]').

Same parameters ([in, out] weights), AdamW with TinyGPT's decay split and betas, global-norm
clipping: from the same weights and batches it trains as the WebGPU trainer does (bench_train.py
shows the losses side by side). Every part of core.block has its PyTorch form here: LayerNorm or
RMSNorm (with gains or without), a learned table or RoPE (rotate-half), GELU (either form), ReLU²
or SwiGLU, the biases a block has, grouped-query attention (heads of a width of their own too),
QK-norm, an untied head, the logit soft-cap and the embedding's norm; a sliding window is a mask.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from tinygpt.core.config import ADAMW_BETA1, ADAMW_BETA2, ADAMW_EPS, Config, param_shapes
from tinygpt.core.errors import UsageError
from tinygpt.model.optimizers import Settings as OptimizerSettings
from tinygpt.model.optimizers.muon import is_muon_matrix


def key(name: str) -> str:
    return name.replace(".", "/")            # ParameterDict keys may not hold dots


# each MLP part's activation of (up, gate): the twins of core.block's MLPS, by the part's name
ACTIVATIONS = {"gelu": lambda u, g: F.gelu(u), "gelu_tanh": lambda u, g: F.gelu(u, approximate="tanh"),
               "relu2": lambda u, g: F.relu(u).square(), "swiglu": lambda u, g: F.silu(g) * u}


def rotary(T: int, hd: int, theta: float, device=None):
    """RoPE's cos and sin [T, 1, hd] (q and k are [B, T, heads, hd]) in the rotate-half layout:
    channel i and i + hd/2 turn together."""
    inv = theta ** (-torch.arange(0, hd, 2, dtype=torch.float64, device=device) / hd)
    ang = torch.arange(T, dtype=torch.float64, device=device)[:, None] * inv[None]
    ang = torch.cat([ang, ang], dim=1)[:, None]
    return ang.cos().float(), ang.sin().float()


def turn(t, cos, sin):
    half = t.shape[-1] // 2
    return t * cos + torch.cat([-t[..., half:], t[..., :half]], dim=-1) * sin


class GPTModule(torch.nn.Module):
    """x [B, T] token ids -> logits [B, T, V]; parameters under the .tinygpt names."""

    def __init__(self, cfg: Config, params: dict, device=None):
        if cfg.block.mlp.name not in ACTIVATIONS:
            raise UsageError(f"the PyTorch mirror has no {cfg.block.mlp.name} MLP; train this model with tinygpt train")
        super().__init__()
        self.cfg = cfg
        self.p = torch.nn.ParameterDict({key(n): torch.nn.Parameter(torch.tensor(np.asarray(params[n], np.float32),
                                                                                 device=device))
                                         for n, _, _ in param_shapes(cfg)})

    def named(self) -> dict:
        """name -> Parameter, in .tinygpt order."""
        return {n: self.p[key(n)] for n, _, _ in param_shapes(self.cfg)}

    def norm(self, x, name: str, width: int | None = None):
        """The block's norm over the last dim (width: QK-norm's per-head RMSNorm)."""
        P, blk = self.named(), self.cfg.block
        if width or blk.norm.rms:
            return F.rms_norm(x, (width or x.shape[-1],), P.get(name + "_g"), blk.eps)
        return F.layer_norm(x, (x.shape[-1],), P[name + "_g"], P[name + "_b"], blk.eps)

    def attention(self, a, l: int, rope):
        P, cfg, blk = self.named(), self.cfg, self.cfg.block
        B, T, _ = a.shape
        H, KV, hd = blk.heads.q, blk.heads.kv, blk.heads.hd
        lin = lambda x, W, b: x @ P[f"h{l}.{W}"] + (P[f"h{l}.{b}"] if b in blk.bias.vectors else 0)
        q = lin(a, "Wq", "bq").view(B, T, H, hd)
        k, v = lin(a, "Wk", "bk").view(B, T, KV, hd), lin(a, "Wv", "bv").view(B, T, KV, hd)
        if blk.qk_norm.on:
            q, k = self.norm(q, f"h{l}.q_norm", hd), self.norm(k, f"h{l}.k_norm", hd)
        if rope is not None:
            q, k = turn(q, *rope), turn(k, *rope)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        if KV < H:           # each kv head serves H / KV consecutive query heads (heads.wgsl's kv_expand)
            k, v = k.repeat_interleave(H // KV, dim=1), v.repeat_interleave(H // KV, dim=1)
        if cfg.attn_window:
            i = torch.arange(T, device=a.device)
            mask = (i[None, :] <= i[:, None]) & (i[:, None] - i[None, :] < cfg.window)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        else:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return lin(y.transpose(1, 2).reshape(B, T, H * hd), "Wo", "bo")     # H hd: C, or the heads' own width

    def forward(self, x):
        P, cfg, blk = self.named(), self.cfg, self.cfg.block
        T = x.shape[1]
        lin = lambda a, l, W, b: a @ P[f"h{l}.{W}"] + (P[f"h{l}.{b}"] if b in blk.bias.vectors else 0)
        rope = rotary(T, cfg.hd, blk.rope_theta, x.device) if blk.position.rotary else None
        h = P["tok_emb"][x] + (P["pos_emb"][:T] if blk.position.table else 0)
        if blk.embed_norm:
            h = self.norm(h, "ln_e")
        act = ACTIVATIONS[blk.mlp.name]
        for l in range(cfg.layers):
            h = h + self.attention(self.norm(h, f"h{l}.ln1"), l, rope)
            a = self.norm(h, f"h{l}.ln2")
            gate = lin(a, l, "fc_gate_W", "fc_gate_b") if blk.mlp.gated else None
            h = h + lin(act(lin(a, l, "fc_in_W", "fc_in_b"), gate), l, "fc_out_W", "fc_out_b")
        logits = self.norm(h, "ln_f") @ P[blk.head].T
        return blk.softcap * torch.tanh(logits / blk.softcap) if blk.softcap else logits


def adamw(module: GPTModule, lr: float, weight_decay: float | None = None) -> torch.optim.AdamW:
    """TinyGPT's AdamW: decay on matrices and embeddings only (the config's, or weight_decay)."""
    P, cfg = module.named(), module.cfg
    decay = [P[n] for n, _, d in param_shapes(cfg) if d]
    no_decay = [P[n] for n, _, d in param_shapes(cfg) if not d]
    wd = cfg.weight_decay if weight_decay is None else weight_decay
    return torch.optim.AdamW([{"params": decay, "weight_decay": wd},
                              {"params": no_decay, "weight_decay": 0.0}],
                             lr=lr, betas=(ADAMW_BETA1, ADAMW_BETA2), eps=ADAMW_EPS)


def load_moments(opt: torch.optim.AdamW, module: GPTModule, m: dict, v: dict, step: int):
    """A .tinygpt file's AdamW state into torch's: the same m, v and step count."""
    for n, p in module.named().items():
        opt.state[p] = {"step": torch.tensor(float(step)),
                        "exp_avg": torch.tensor(np.asarray(m[n], np.float32), device=p.device),
                        "exp_avg_sq": torch.tensor(np.asarray(v[n], np.float32), device=p.device)}


def moments(opt: torch.optim.AdamW, module: GPTModule):
    """(m, v) as .tinygpt-named float32 arrays (zeros for a parameter never stepped)."""
    m, v = {}, {}
    for n, p in module.named().items():
        st = opt.state.get(p, {})
        zero = np.zeros(tuple(p.shape), np.float32)
        m[n] = st["exp_avg"].detach().cpu().numpy().astype(np.float32) if "exp_avg" in st else zero
        v[n] = st["exp_avg_sq"].detach().cpu().numpy().astype(np.float32) if "exp_avg_sq" in st else zero
    return m, v


def loss_of(logits, y):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), torch.as_tensor(np.asarray(y, np.int64),
                                                                                 device=logits.device).reshape(-1))


def clip_and_step(opt, module: GPTModule, lr: float):
    """Clip by the global norm, then step `opt` (one optimizer, or a list of them) at lr."""
    opts = opt if isinstance(opt, list) else [opt]
    for o in opts:
        for g in o.param_groups:
            g["lr"] = lr
    if module.cfg.grad_clip > 0:
        torch.nn.utils.clip_grad_norm_(list(module.parameters()), module.cfg.grad_clip)
    for o in opts:
        o.step()


def muon(module: GPTModule, settings: OptimizerSettings, lr: float) -> list:
    """tinygpt's Muon in PyTorch: torch.optim.Muon on the blocks' matrices (the match_rms_adamw
    scaling, so one lr serves both) and AdamW on the rest. torch runs the Newton-Schulz iterations
    in bfloat16 where tinygpt runs them in float32: a continuation, not the same bits."""
    P, cfg, s = module.named(), module.cfg, settings
    mats = [P[n] for n, _, _ in param_shapes(cfg) if is_muon_matrix(n)]
    decay = [P[n] for n, _, d in param_shapes(cfg) if d and not is_muon_matrix(n)]
    no_decay = [P[n] for n, _, d in param_shapes(cfg) if not d]
    return [torch.optim.Muon(mats, lr=lr, weight_decay=s.weight_decay, momentum=s.momentum, nesterov=s.nesterov,
                             adjust_lr_fn="match_rms_adamw"),
            torch.optim.AdamW([{"params": decay, "weight_decay": s.weight_decay},
                               {"params": no_decay, "weight_decay": 0.0}], lr=lr, betas=(s.beta1, s.beta2), eps=s.eps)]


def load_muon_state(opts: list, module: GPTModule, state: dict, steps: int):
    """A .tinygpt file's Muon state (optim_state's rows: "muon m", "muon v") into torch's: the
    matrices' momentum (GPTModule's weights are [in, out] as tinygpt's: Muon's orthogonalisation and
    its max(rows, cols) scaling do not mind the orientation), the rest's AdamW moments."""
    for n, p in module.named().items():
        m = torch.tensor(np.asarray(state["muon m"][n], np.float32), device=p.device)
        if is_muon_matrix(n):
            opts[0].state[p] = {"momentum_buffer": m}
        else:
            opts[1].state[p] = {"step": torch.tensor(float(steps)), "exp_avg": m,
                                "exp_avg_sq": torch.tensor(np.asarray(state["muon v"][n], np.float32), device=p.device)}


def muon_state(opts: list, module: GPTModule) -> dict:
    """The rows of optim_state's Muon record from torch's state (zeros where never stepped)."""
    m, v = {}, {}
    for n, p in module.named().items():
        zero = np.zeros(tuple(p.shape), np.float32)
        if is_muon_matrix(n):
            st = opts[0].state.get(p, {})
            m[n] = st["momentum_buffer"].detach().cpu().numpy().astype(np.float32) if st else zero
            v[n] = zero
        else:
            st = opts[1].state.get(p, {})
            m[n] = st["exp_avg"].detach().cpu().numpy().astype(np.float32) if "exp_avg" in st else zero
            v[n] = st["exp_avg_sq"].detach().cpu().numpy().astype(np.float32) if "exp_avg_sq" in st else zero
    return {"muon m": m, "muon v": v}


class AdamWMirror:
    """tinygpt's AdamW as torch.optim.AdamW; its state as optim_state's rows ("adam m", "adam v")."""
    make = staticmethod(lambda module, settings, lr: adamw(module, lr, settings.weight_decay))
    load = staticmethod(lambda opt, module, state, steps: load_moments(opt, module, state["adam m"],
                                                                        state["adam v"], steps))
    rows = staticmethod(lambda opt, module: dict(zip(("adam m", "adam v"), moments(opt, module))))


class MuonMirror:
    """tinygpt's Muon as torch.optim.Muon and AdamW (muon above)."""
    make, load, rows = staticmethod(muon), staticmethod(load_muon_state), staticmethod(muon_state)


# the optimizers of tinygpt's registry that PyTorch ships, by their rooms' names: each made from the
# file's settings, its state loaded from and handed back as optim_state's rows (Lion and SGD: none)
MIRRORS = {"adamw": AdamWMirror, "muon": MuonMirror}


class TorchGPT:
    """One process: forward, and a training step that returns the loss before the update."""

    def __init__(self, cfg: Config, params: dict, lr: float):
        self.cfg = cfg
        self.module = GPTModule(cfg, params)
        self.P = self.module.named()
        self.opt = adamw(self.module, lr)

    def forward(self, x):
        return self.module(torch.as_tensor(np.asarray(x, np.int64)))

    def step(self, x, y, lr) -> float:
        loss = loss_of(self.forward(x), y)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        clip_and_step(self.opt, self.module, lr)
        return float(loss.detach())
