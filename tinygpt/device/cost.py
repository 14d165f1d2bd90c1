"""What a dispatch does, for the profile's utilisation: the FLOPs of its matrix products.

FLOPs count the multiply-adds of matrix products, 2 each: the matmuls, and the products inside
the attention kernels over the T(T+1)/2 causal (query, key) pairs of each head, as each kernel
computes them (the online backward recomputes the scores, so its dq kernel does 3 products per
pair and its dkv kernel 4). Everything else (LayerNorm, GELU, softmax, the loss, the optimizer)
is bound by memory, not arithmetic: those kernels are judged by their bytes (gpu.Dispatch.nbytes:
every binding read or written once, the least traffic the kernel could have).
"""
from __future__ import annotations

import re

# entry (without its variant suffix) -> products of hd per causal pair
_ATTN_PER_PAIR = {"attn_scores": 1, "attn_value": 1, "attn_fused_sv": 2, "attn_dscores": 1, "attn_dq": 1,
                  "attn_dk": 1, "attn_dvalue": 1,
                  "attn_online_forward": 2, "attn_online_dq": 3, "attn_online_dkv": 4}


def base_entry(entry: str) -> str:
    """matmul_abt_sg -> matmul_abt; adamw4 -> adamw; layernorm_forward4 -> layernorm_forward."""
    return re.sub(r"(_sg|_tiled|_vec4|_bf16|_f16|4)+$", "", entry)


def kernel_flops(entry: str, uniform) -> float | None:
    """FLOPs of one dispatch of `entry` with the uniform values `uniform`; None for kernels judged by bytes."""
    if not isinstance(uniform, (tuple, list)):
        return None
    e = base_entry(entry)
    if e in ("matmul", "matmul_abt", "matmul_atb"):
        M, N, K = uniform[:3]
        return 2.0 * M * N * K * (uniform[5] if len(uniform) > 5 else 1)    # [5]: the products batched
    if e in _ATTN_PER_PAIR:
        if e.startswith("attn_online"):          # online.wgsl: (B, T, C, H, scale)
            B, T, C, H = uniform[:4]
            hd, heads = C // H, H
        else:                                    # attention.wgsl: (B, T, C, hd, h0, nh, scale)
            B, T, _, hd, _, heads = uniform[:6]
        return 2.0 * hd * _ATTN_PER_PAIR[e] * B * heads * T * (T + 1) / 2
    if e == "attn_online_d":                     # D = rowsum(dO * O)
        B, T, C, H = uniform[:4]
        return 2.0 * B * T * C
    return None


def model_flops_per_token(n_params: int, layers: int, width: int, ctx: int) -> float:
    """Training FLOPs per token as PaLM (appendix B) and nanoGPT count them for MFU: 6N for the
    weights' forward and backward, plus 12 L C T for attention's two products (not halved for the
    causal mask, to compare with their figures); C the attention's width, heads x head dim."""
    return 6.0 * n_params + 12.0 * layers * width * ctx
