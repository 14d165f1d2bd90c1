"""The NumPy reference against central finite differences in float64 (no GPU needed)."""
import sys

import numpy as np
import pytest

from support import ROOT
from tinygpt.core.activations import ACTIVATIONS
from tinygpt.reference import kernels as R
from tinygpt.reference import attention as RA
from tinygpt.core.config import Config, param_shapes
from tinygpt.core.rope import rope_table
from tinygpt.reference import gpt as RG
from tinygpt.core.init import init_params
from tinygpt.core.init import token_buckets

from tinygpt.model.optimizers import KINDS as OPTIMIZERS
from tinygpt.model.optimizers.adamw import adamw
from tinygpt.model.optimizers.lion import lion
from tinygpt.model.optimizers.muon import newton_schulz_twin
from tinygpt.model.optimizers.sgd import sgd
from conftest import check


def numgrad(f, x, eps=1e-6):
    """d sum(f(x) * w) / dx for a fixed random w, by central differences."""
    g = np.zeros_like(x)
    it = np.nditer(x, flags=["multi_index"])
    for _ in it:
        i = it.multi_index
        old = x[i]
        x[i] = old + eps
        fp = f()
        x[i] = old - eps
        fm = f()
        x[i] = old
        g[i] = (fp - fm) / (2 * eps)
    return g


@pytest.fixture
def r():
    return np.random.default_rng(7)


def test_matmul_family(r):
    a, b, w = r.standard_normal((5, 4)), r.standard_normal((4, 3)), r.standard_normal((5, 3))
    bias = r.standard_normal(3)
    f = lambda: np.sum(R.matmul(a, b, bias) * w)
    check("d matmul / da = w @ b^T (abt)", numgrad(f, a), R.matmul_abt(w, b), 1e-8)
    check("d matmul / db = a^T @ w (atb)", numgrad(f, b), R.matmul_atb(a, w), 1e-8)
    check("d matmul / dbias", numgrad(f, bias), R.bias_grad(w), 1e-8)


def test_gelu(r):
    x, w = r.standard_normal(20) * 3, r.standard_normal(20)
    check("gelu_backward", R.gelu_backward(x, w), numgrad(lambda: np.sum(R.gelu_forward(x) * w), x), 1e-8)
    check("gelu exact values", R.gelu_forward(np.array([-1.0, 0.0, 1.0])),
          [-0.15865525393145707, 0.0, 0.8413447460685429], 1e-15)


def test_gelu_tanh_is_gpt2s(r):
    """The tanh form, computed as x sigmoid(2u), is GPT-2's gelu_new as transformers writes it,
    0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), and its backward that function's derivative."""
    x, w = r.standard_normal(40) * 3, r.standard_normal(40)
    gelu_new = 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * np.power(x, 3.0))))
    check("gelu_forward tanh = gelu_new", R.gelu_forward(x, tanh=True), gelu_new, 1e-14)
    check("gelu_backward tanh", R.gelu_backward(x, w, tanh=True),
          numgrad(lambda: np.sum(R.gelu_forward(x, tanh=True) * w), x), 1e-8)
    gap = np.abs(R.gelu_forward(x, tanh=True) - R.gelu_forward(x)).max()
    print(f"tanh form against the exact GELU: {gap:.1e} apart at most")
    assert 1e-5 < gap < 1e-3                     # two different functions, close


def test_relu2(r):
    """nanochat's squared ReLU and its gradient (away from the kink at 0)."""
    x, w = r.standard_normal(40) * 3, r.standard_normal(40)
    x[np.abs(x) < 1e-3] = 0.5
    check("relu2_forward", R.relu2_forward(x), np.where(x > 0, x * x, 0.0), 0)
    check("relu2_backward", R.relu2_backward(x, w), numgrad(lambda: np.sum(R.relu2_forward(x) * w), x), 1e-7)


def test_layernorm(r):
    x, g, b, w = r.standard_normal((6, 7)), r.standard_normal(7), r.standard_normal(7), r.standard_normal((6, 7))
    f = lambda: np.sum(R.layernorm_forward(x, g, b)[0] * w)
    _, mean, rstd = R.layernorm_forward(x, g, b)
    check("layernorm_dx", R.layernorm_dx(w, x, g, mean, rstd), numgrad(f, x), 1e-7)
    dg, db = R.layernorm_dgb(w, x, mean, rstd)
    check("layernorm_dgb dg", dg, numgrad(f, g), 1e-7)
    check("layernorm_dgb db", db, numgrad(f, b), 1e-7)


def test_rmsnorm(r):
    """layernorm_*'s rms form is RMSNorm as Llama and nanochat define it, x / sqrt(mean(x^2) + eps)
    * g, with no centring and no bias; its gradients are that function's."""
    x, g, w = r.standard_normal((6, 7)) * 2 + 1, r.standard_normal(7), r.standard_normal((6, 7))
    y, mean, rstd = R.layernorm_forward(x, g, None, 1e-6, rms=True)
    check("rmsnorm y", y, x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6) * g, 1e-14)
    assert not mean.any()
    f = lambda: np.sum(R.layernorm_forward(x, g, None, 1e-6, rms=True)[0] * w)
    check("rmsnorm dx", R.layernorm_dx(w, x, g, mean, rstd, rms=True), numgrad(f, x), 1e-7)
    dg, db = R.layernorm_dgb(w, x, mean, rstd, rms=True)
    check("rmsnorm dg", dg, numgrad(f, g), 1e-7)
    assert db is None


def test_swiglu(r):
    """swiglu_* is silu(gate) * up and its gradients."""
    g, u, w = r.standard_normal(9) * 3, r.standard_normal(9), r.standard_normal(9)
    check("swiglu", R.swiglu_forward(g, u), g / (1 + np.exp(-g)) * u, 1e-15)
    dg, du = R.swiglu_backward(g, u, w)
    check("swiglu dgate", dg, numgrad(lambda: np.sum(R.swiglu_forward(g, u) * w), g), 1e-7)
    check("swiglu dup", du, numgrad(lambda: np.sum(R.swiglu_forward(g, u) * w), u), 1e-7)


def test_the_capped_cross_entropys_gradient_is_the_uncapped_logits(r):
    """cross_entropy(softcap) of capped logits gives the gradient of the loss of softcap(z) in z."""
    z, tgt, cap = r.standard_normal((3, 7)) * 4, np.array([1, 6, 0]), 2.5
    f = lambda: R.cross_entropy(tgt, R.softcap(z, cap), 1.0)[0].sum()
    check("softcap cross_entropy dz", R.cross_entropy(tgt, R.softcap(z, cap), 1.0, cap)[1], numgrad(f, z), 1e-7)


def test_kv_reduce_is_kv_expands_transpose(r):
    """kv_expand is transformers' repeat_kv (kv head i serves query heads i*G .. i*G+G-1) and
    kv_reduce its transpose: <expand(x), y> = <x, reduce(y)>."""
    rows, H, KV, hd = 5, 6, 2, 3
    x, y = r.standard_normal((rows, KV * hd)), r.standard_normal((rows, H * hd))
    rep = np.repeat(x.reshape(rows, KV, 1, hd), H // KV, axis=2).reshape(rows, H * hd)   # repeat_kv's layout
    check("kv_expand", R.kv_expand(x, H, KV), rep, 0)
    check("<expand x, y> = <x, reduce y>", np.sum(R.kv_expand(x, H, KV) * y), np.sum(x * R.kv_reduce(y, H, KV)), 1e-12)


def test_rope(r):
    """rope_* is the rotary embedding as transformers writes it for Llama and Qwen, x cos +
    rotate_half(x) sin with the angles pos / theta^(2i/hd) repeated over both halves; its backward is
    the forward's transpose; the float32 table is the float64 one within float32 rounding."""
    rows, T, hd, H, offset = 10, 5, 8, 3, 2
    x, y = r.standard_normal((rows, H * hd)), r.standard_normal((rows, H * hd))
    cs = rope_table(T + offset, hd, 500.0, np.float64)
    pos = np.arange(rows) % T + offset
    ang = pos[:, None] / 500.0 ** (np.arange(0, hd, 2) / hd)[None, :]
    cos, sin = np.concatenate([np.cos(ang)] * 2, -1)[:, None], np.concatenate([np.sin(ang)] * 2, -1)[:, None]
    h = x.reshape(rows, H, hd)
    rotate_half = np.concatenate([-h[..., hd // 2:], h[..., :hd // 2]], -1)
    check("rope_forward = x cos + rotate_half(x) sin", R.rope_forward(cs, x, T, hd, offset),
          (h * cos + rotate_half * sin).reshape(rows, -1), 1e-14)
    check("rope_backward is the transpose", np.sum(R.rope_forward(cs, x, T, hd, offset) * y),
          np.sum(x * R.rope_backward(cs, y, T, hd, offset)), 1e-12)
    check("rope_table float32", rope_table(T + offset, hd, 500.0), cs, 1e-6)
    g = r.standard_normal(hd)
    fused, stats = R.qk_norm_rope(cs, x, g, T, hd, offset, eps=1e-6)
    normed, _, rstd = R.layernorm_forward(x.reshape(-1, hd), g, None, 1e-6, rms=True)
    check("qk_norm_rope = rope_forward of the per-head RMSNorm", fused,
          R.rope_forward(cs, normed.reshape(rows, -1), T, hd, offset), 1e-14)
    check("qk_norm_rope's stats: 0 | rstd", stats, np.stack([np.zeros_like(rstd), rstd]), 0)
    dy, v, eps = r.standard_normal(x.shape), r.standard_normal(x.shape), 1e-6
    along = lambda t: np.sum(R.qk_norm_rope(cs, x + t * v, g, T, hd, offset, eps=1e-6)[0] * dy)
    check("qk_norm_rope_dx is its gradient (central difference along v)",
          np.sum(R.qk_norm_rope_dx(cs, dy, x, g, stats, T, hd, offset) * v),
          (along(eps) - along(-eps)) / (2 * eps), 1e-6)


def test_embedding(r):
    B, T, C, V = 2, 5, 3, 7
    tokens = r.integers(0, V, (B, T))
    tok, pos, w = r.standard_normal((V, C)), r.standard_normal((T, C)), r.standard_normal((B, T, C))
    f = lambda: np.sum(R.embed_forward(tokens, tok, pos) * w)
    off, positions = token_buckets(tokens, V)
    check("embed_tok_grad", R.embed_tok_grad(off, positions, w.reshape(B * T, C)), numgrad(f, tok), 1e-8)
    check("embed_pos_grad", R.embed_pos_grad(w), numgrad(f, pos), 1e-8)


def test_cross_entropy(r):
    logits, tgt = r.standard_normal((4, 9)), r.integers(0, 9, 4)
    f = lambda: R.loss_reduce(R.cross_entropy(tgt, logits, 1.0)[0], 0.25)
    check("cross_entropy dlogits", R.cross_entropy(tgt, logits, 0.25)[1], numgrad(f, logits), 1e-8)


@pytest.mark.parametrize("T", [1, 5])
def test_attention_plain_and_family(r, T):
    B, C, H = 2, 6, 2
    q, k, v, w = (r.standard_normal((B, T, C)) for _ in range(4))
    f = lambda: np.sum(RA.attention_forward(q, k, v, H) * w)
    dq, dk, dv = RA.attention_backward(q, k, v, w, H)
    check("attention dq", dq, numgrad(f, q), 1e-7)
    check("attention dk", dk, numgrad(f, k), 1e-7)
    check("attention dv", dv, numgrad(f, v), 1e-7)
    # the kernel-shaped references agree with the plain one
    out, P = RA.attn_fused_sv(q, k, v, H)
    check("fused_sv out", out, RA.attention_forward(q, k, v, H), 1e-12)
    check("naive out", RA.attn_value(RA.attn_softmax(RA.attn_scores(q, k, H)), v, H), out, 1e-12)
    dS = RA.attn_dscores(w, v, P, H)
    check("naive dq", RA.attn_dq(dS, k, H), dq, 1e-12)
    check("naive dk", RA.attn_dk(dS, q, H), dk, 1e-12)
    check("naive dv", RA.attn_dvalue(P, w, H), dv, 1e-12)
    o, L = RA.attn_online_forward(q, k, v, H, BQ=2, BK=3)
    check("online out", o, out, 1e-12)
    D = RA.attn_online_d(w, o, H)
    check("online dq", RA.attn_online_dq(q, k, v, w, L, D, H, BQ=2, BK=3), dq, 1e-12)
    dk2, dv2 = RA.attn_online_dkv(q, k, v, w, L, D, H, BQ=2, BK=2)
    check("online dk", dk2, dk, 1e-12)
    check("online dv", dv2, dv, 1e-12)
    o8, L8 = RA.attn_online_forward_sg(q, k, v, H)                     # 8-row tiles, as online_sg.wgsl
    check("online sg out", o8, out, 1e-12)
    check("online sg dq", RA.attn_online_dq_sg(q, k, v, w, L8, D, H), dq, 1e-12)
    for name, got, want in zip(("dk", "dv"), RA.attn_online_dkv_sg(q, k, v, w, L8, D, H), (dk, dv)):
        check(f"online sg {name}", got, want, 1e-12)


def test_whole_model_finite_differences():
    cfg = Config(layers=2, d_model=8, heads=2, ctx=5, batch=2, vocab=11, seed=3)
    params = {k: v.astype(np.float64) for k, v in init_params(cfg).items()}
    rr = np.random.default_rng(0)
    for k in params:  # larger weights than init so every path carries signal
        params[k] += rr.standard_normal(params[k].shape) * 0.3
    x = rr.integers(0, cfg.vocab, (cfg.batch, cfg.ctx + 1))
    loss = lambda: RG.forward(params, cfg, x[:, :-1], x[:, 1:])[1]
    _, _, cache = RG.forward(params, cfg, x[:, :-1], x[:, 1:])
    grads = RG.backward(params, cfg, cache)
    assert list(grads) == [n for n, _, _ in param_shapes(cfg)]
    for name in grads:
        check(f"model d loss / d {name}", grads[name], numgrad(loss, params[name]), 1e-7)


def test_adamw_matches_formula():
    w, g = np.array([1.0, -2.0]), np.array([0.5, 0.1])
    m, v = np.zeros(2), np.zeros(2)
    adamw(g, 0.1, {"factor": 1.0, "skip": 0, "taken": 1}, w, m, v, 0.01, 0.9, 0.95, 1e-8)
    # step 1: mhat = g, vhat = g^2, so the update is g / (|g| + eps) + wd * w
    w0 = np.array([1.0, -2.0])
    check("adamw step 1", w, w0 - 0.01 * (g / (np.abs(g) + 1e-8) + 0.1 * w0), 1e-15)
    norm, scale = R.grad_clip(R.grad_sumsq(np.array([3.0, 4.0])), 1.0)
    assert abs(norm - 5.0) < 1e-12 and abs(scale - 1.0 / (5.0 + 1e-6)) < 1e-12


def test_sgd_matches_its_definition():
    """SGD's momentum is the running mean of the gradient times the gate's factor, and the step is
    lr times it plus the decay; a skipped step and another optimizer's elements (a negative decay)
    change nothing."""
    gate = {"factor": 2.0, "skip": 0, "taken": 1}
    w, g, m = np.array([1.0, -2.0, 0.5]), np.array([0.5, -0.1, 0.0]), np.array([0.1, 0.3, -0.2])
    w0, m0 = w.copy(), m.copy()
    sgd(g, np.array([0.1, 0.0, -1.0]), gate, w, m, None, 0.5, 0.9)
    m1 = 0.9 * m0 + 0.1 * 2.0 * g
    check("sgd m", m[:2], m1[:2], 1e-15)
    check("sgd w", w[:2], w0[:2] - 0.5 * (m1[:2] + np.array([0.1, 0.0]) * w0[:2]), 1e-15)
    assert w[2] == w0[2] and m[2] == m0[2]
    sgd(g, 0.1, dict(gate, skip=1), w, m, None, 0.5, 0.9)
    check("sgd w after a skipped step", w[:2], w0[:2] - 0.5 * (m1[:2] + np.array([0.1, 0.0]) * w0[:2]), 1e-15)


def test_lion_and_muon_match_their_definitions():
    """Lion's step is lr times a sign (and the moment's decay after it); Muon's Newton-Schulz gives
    a matrix whose singular values lie near 1 (the quintic's fixed band, 0.5 to 1.5 at most) and
    whose singular vectors are the input's, for a wide and a tall matrix alike, and the tall one is
    the transpose's orthogonalisation transposed."""
    newton_schulz = lambda x: newton_schulz_twin(R, x)
    gate = {"factor": 2.0, "skip": 0, "taken": 1}
    w, g, m = np.array([1.0, -2.0, 0.5]), np.array([0.5, -0.1, 0.0]), np.array([0.1, 0.3, -0.2])
    w0, m0 = w.copy(), m.copy()
    lion(g, 0.1, gate, w, m, None, 0.01, 0.9, 0.99)
    c = 0.9 * m0 + 0.1 * 2.0 * g
    check("lion w", w, w0 - 0.01 * (np.sign(c) + 0.1 * w0), 1e-15)
    check("lion m", m, 0.99 * m0 + 0.01 * 2.0 * g, 1e-15)
    rng = np.random.default_rng(0)
    for shape in ((7, 13), (13, 7)):
        x = rng.standard_normal(shape)
        o = newton_schulz(x)
        u, s, vt = np.linalg.svd(x, full_matrices=False)
        so = np.linalg.svd(o, compute_uv=False)
        print(f"newton_schulz {shape}: singular values {so.min():.3f} to {so.max():.3f}")
        assert 0.5 < so.min() and so.max() < 1.5
        check(f"newton_schulz {shape} keeps the singular vectors", u.T @ o @ vt.T, np.diag(np.diag(u.T @ o @ vt.T)), 1e-9)
    check("newton_schulz of a transpose", newton_schulz(x.T), newton_schulz(x).T, 1e-12)


def test_every_wgsl_entry_point_has_a_numpy_twin():
    """The rule of the house: each kernel has a reference function of the same name."""
    import re
    shaders = ROOT / "shaders"
    entries = lambda text: re.findall(r"@compute[^\n]*\n\s*fn (\w+)", text)
    # a file written once for both widths names its entry points {{VEC}}: "" and "4" (kernels.width)
    widths = lambda text: {text.replace("{{VEC}}", w) for w in ("", "4")}
    names = sorted({n for f in shaders.glob("*.wgsl") for t in widths(f.read_text()) for n in entries(t)})
    assert len(names) > 30
    missing = [n for n in names if not (hasattr(R, n) or hasattr(RA, n))]
    # optim.wgsl's entry point takes each elementwise optimizer's name (its room writes the
    # update it calls): the twin of that name is in the room's module, and is the room's twin
    assert "fn {{NAME}}(" in (shaders / "optim.wgsl").read_text()
    rooms = [k for k, room in OPTIMIZERS.items() if getattr(room, "wgsl", "")]
    print("the elementwise optimizers' entry points:", rooms)
    missing += [k for k in rooms if "fn update(" not in OPTIMIZERS[k].wgsl
                or OPTIMIZERS[k].twin is not getattr(sys.modules[OPTIMIZERS[k].__module__], k, 0)]
    # elementwise.wgsl's activation entry points take each activation's name (its room writes
    # act4 and act_grad4): the twins of those names are the room's
    assert "fn {{ACT}}_forward(" in (shaders / "elementwise.wgsl").read_text()
    missing += [f"{a.name}_{way}" for a in ACTIVATIONS.values() for way, twin in (("forward", a.forward),
                                                                                 ("backward", a.backward))
                if twin.__name__ != f"{a.name}_{way}" or "fn act4(" not in a.wgsl or "fn act_grad4(" not in a.wgsl]
    print("the activations' entry points:", sorted(ACTIVATIONS))
    assert not missing, f"no NumPy twin for {missing}"


def test_no_entry_point_is_named_for_a_storage_type():
    """A stored type is a fill or a section of the file (its loads and stores), not another copy of
    an entry point: only the casts between types name them."""
    import re
    shaders = ROOT / "shaders"
    names = {n for f in shaders.glob("*.wgsl") for w in ("", "4")
             for n in re.findall(r"@compute[^\n]*\n\s*fn (\w+)", f.read_text().replace("{{VEC}}", w))}
    typed = sorted(n for n in names if re.search(r"bf16|f16|half", n) and not n.startswith("cast_"))
    print(f"{len(names)} entry points; named for a stored type, casts left out: {typed}")
    assert not typed


def test_preset_parameter_counts_match_tinygpt():
    from tinygpt.core.config import n_params, preset
    assert n_params(preset("tiny")) == 70_464
    assert n_params(preset("small")) == 366_432
    assert n_params(preset("medium")) == 838_400


def test_kernel_flops_count_the_products():
    """cost.kernel_flops: 2 per multiply-add of the matmuls and of attention's causal products."""
    from tinygpt.device.cost import base_entry, kernel_flops, model_flops_per_token
    assert kernel_flops("matmul_atb_sg", (64, 96, 1024, 0, 1)) == 2 * 64 * 96 * 1024
    assert kernel_flops("matmul_tiled", (3, 5, 7, 1, 0)) == 2 * 3 * 5 * 7
    B, T, C, H = 2, 10, 24, 3
    pairs = B * H * T * (T + 1) // 2
    assert kernel_flops("attn_online_forward_sg", (B, T, C, H, 0.35)) == 2 * 8 * 2 * pairs   # S and P.V, hd 8
    assert kernel_flops("attn_online_dkv", (B, T, C, H, 0.35)) == 2 * 8 * 4 * pairs
    assert kernel_flops("attn_fused_sv", (B, T, C, 8, 0, H, 0.35)) == 2 * 8 * 2 * pairs
    assert kernel_flops("adamw4", (1, 2)) is None and kernel_flops("matmul", b"\0" * 16) is None
    assert base_entry("layernorm_forward4") == "layernorm_forward" and base_entry("matmul_abt_vec4") == "matmul_abt"
    assert model_flops_per_token(100, 2, 8, 16) == 600 + 12 * 2 * 8 * 16
