"""The same GPT in PyTorch (CPU), for scripts/bench_train.py and the export test.

Same parameters ([in, out] weights), exact GELU, LayerNorm eps 1e-5, tied head,
AdamW with TinyGPT's decay split, global-norm clipping. Imported only where torch is.
"""
from __future__ import annotations


import numpy as np
import torch
import torch.nn.functional as F

from .config import ADAMW_BETA1, ADAMW_BETA2, ADAMW_EPS, Config, param_specs


class TorchGPT:
    def __init__(self, cfg: Config, params: dict, lr: float):
        self.cfg = cfg
        self.P = {k: torch.tensor(np.asarray(v, np.float32), requires_grad=True) for k, v in params.items()}
        decay = [self.P[n] for n, _, d in param_specs(cfg) if d]
        no_decay = [self.P[n] for n, _, d in param_specs(cfg) if not d]
        self.opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                                      {"params": no_decay, "weight_decay": 0.0}],
                                     lr=lr, betas=(ADAMW_BETA1, ADAMW_BETA2), eps=ADAMW_EPS)

    def forward(self, x):
        P, cfg = self.P, self.cfg
        B, T = x.shape
        C, H = cfg.d_model, cfg.heads
        h = P["tok_emb"][x] + P["pos_emb"][:T]
        for l in range(cfg.layers):
            p = lambda n: P[f"h{l}.{n}"]
            a = F.layer_norm(h, (C,), p("ln1_g"), p("ln1_b"), 1e-5)
            q, k, v = (a @ p("W" + n) + p("b" + n) for n in "qkv")
            q, k, v = (t.view(B, T, H, C // H).transpose(1, 2) for t in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, C)
            h = h + y @ p("Wo") + p("bo")
            a = F.layer_norm(h, (C,), p("ln2_g"), p("ln2_b"), 1e-5)
            h = h + F.gelu(a @ p("fc_in_W") + p("fc_in_b")) @ p("fc_out_W") + p("fc_out_b")
        h = F.layer_norm(h, (C,), P["ln_f_g"], P["ln_f_b"], 1e-5)
        return h @ P["tok_emb"].T

    def step(self, x, y, lr) -> float:
        for g in self.opt.param_groups:
            g["lr"] = lr
        logits = self.forward(torch.as_tensor(np.asarray(x, np.int64)))
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), torch.as_tensor(np.asarray(y, np.int64)).reshape(-1))
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        if self.cfg.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(list(self.P.values()), self.cfg.grad_clip)
        self.opt.step()
        return float(loss.detach())
