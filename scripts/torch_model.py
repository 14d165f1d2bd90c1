"""The same GPT in PyTorch, for bench_train.py, bench_learning.py and train_ddp.py beside it.
Imported only where torch is (an optional extra: pip install 'tinygpt[torch]').

Same parameters ([in, out] weights), exact GELU, LayerNorm eps 1e-5, tied head, AdamW with
TinyGPT's decay split and betas, global-norm clipping: from the same weights and batches it
trains as the WebGPU trainer does (bench_train.py shows the losses side by side).
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from tinygpt.core.config import ADAMW_BETA1, ADAMW_BETA2, ADAMW_EPS, Config, param_specs


def key(name: str) -> str:
    return name.replace(".", "/")            # ParameterDict keys may not hold dots


class GPTModule(torch.nn.Module):
    """x [B, T] token ids -> logits [B, T, V]; parameters under the .tinygpt names."""

    def __init__(self, cfg: Config, params: dict, device=None):
        super().__init__()
        self.cfg = cfg
        self.p = torch.nn.ParameterDict({key(n): torch.nn.Parameter(torch.tensor(np.asarray(params[n], np.float32),
                                                                                 device=device))
                                         for n, _, _ in param_specs(cfg)})

    def named(self) -> dict:
        """name -> Parameter, in .tinygpt order."""
        return {n: self.p[key(n)] for n, _, _ in param_specs(self.cfg)}

    def forward(self, x):
        P, cfg = self.named(), self.cfg
        B, T = x.shape
        C, H = cfg.d_model, cfg.heads
        gelu = "tanh" if cfg.activation == "gelu_tanh" else "none"     # the checkpoint's GELU
        h = P["tok_emb"][x] + P["pos_emb"][:T]
        for l in range(cfg.layers):
            p = lambda n: P[f"h{l}.{n}"]
            a = F.layer_norm(h, (C,), p("ln1_g"), p("ln1_b"), 1e-5)
            q, k, v = (a @ p("W" + n) + p("b" + n) for n in "qkv")
            q, k, v = (t.view(B, T, H, C // H).transpose(1, 2) for t in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, C)
            h = h + y @ p("Wo") + p("bo")
            a = F.layer_norm(h, (C,), p("ln2_g"), p("ln2_b"), 1e-5)
            h = h + F.gelu(a @ p("fc_in_W") + p("fc_in_b"), approximate=gelu) @ p("fc_out_W") + p("fc_out_b")
        h = F.layer_norm(h, (C,), P["ln_f_g"], P["ln_f_b"], 1e-5)
        return h @ P["tok_emb"].T


def adamw(module: GPTModule, lr: float) -> torch.optim.AdamW:
    """TinyGPT's AdamW: decay on matrices and embeddings only."""
    P, cfg = module.named(), module.cfg
    decay = [P[n] for n, _, d in param_specs(cfg) if d]
    no_decay = [P[n] for n, _, d in param_specs(cfg) if not d]
    return torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
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
    for g in opt.param_groups:
        g["lr"] = lr
    if module.cfg.grad_clip > 0:
        torch.nn.utils.clip_grad_norm_(list(module.parameters()), module.cfg.grad_clip)
    opt.step()


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
