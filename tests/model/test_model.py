"""The whole model on the GPU against the float64 reference, llm.c style:
logits, loss and every gradient at step 0, then AdamW steps; an overfit gate;
the shape of a step (one submit, nothing read back, nothing created)."""
import numpy as np
import pytest

from tinygpt.model.attention import IMPLS
from tinygpt.core.block import BLOCKS
from tinygpt.core.config import param_shapes, preset
from tinygpt.core.precision import PRECISIONS
from tinygpt.model.gpt import Model
from tinygpt.reference import gpt as RG
from tinygpt.reference import kernels as R
from tinygpt.core.init import init_params

from conftest import check
from tinygpt.model.spec import RunSpec
from tinygpt.model.optimizers import make_settings

ADAMW = make_settings("adamw")

pytestmark = pytest.mark.kernel


def batch(cfg, seed=0):
    x = np.random.default_rng(seed).integers(0, cfg.vocab, (cfg.batch, cfg.ctx + 1))
    return x[:, :-1], x[:, 1:]


def f64(d):
    return {k: v.astype(np.float64) for k, v in d.items()}


@pytest.fixture(scope="module")
def tiny():
    return preset("tiny")


def check_step0(gpu, plan, cfg, names=None, limit=None, monkeypatch=None, keep=False, attention="online"):
    """Logits, loss and gradients (all, or `names`) of one step against the float64 reference;
    returns the number of logit chunks the model used (and the model, with keep)."""
    if limit:
        monkeypatch.setitem(gpu.limits, "max-storage-buffer-binding-size", limit)
    params = init_params(cfg)
    x, y = batch(cfg)
    m = Model(gpu, plan, RunSpec(cfg, attention))
    m.set_params(params)
    logits, loss, cache = RG.forward(f64(params), cfg, x, y)
    grads = RG.backward(f64(params), cfg, cache)
    assert set(m.get_params()) == set(grads), "the model and the reference have the same parameters"
    # the forward alone for the logits (the backward overwrites them with dlogits), then the step's
    check("logits", m.logits_of(x), logits, 1e-4 * np.abs(logits).max())
    m.grads_only(x, y)
    check("loss", m.loss(), loss, 1e-4 * abs(loss))
    G = m.get_grads()
    for name, want in grads.items():
        if names and name not in names:
            continue
        # The exact gradient of bk is zero (softmax ignores a per-row shift), so its
        # scale is floored: below 1e-6 a gradient is round-off, not signal.
        scale = max(np.abs(want).max(), 1e-6)
        check(f"grad {name} (tol 1e-4 x {scale:.2e})", G[name], want, 1e-4 * scale)
    return (len(m.layout.logit_chunks), m) if keep else len(m.layout.logit_chunks)


@pytest.mark.parametrize("vocab", [256, 301])  # 301: padded to 304 inside, for the vec4 head
def test_step0_logits_loss_and_every_gradient(gpu, plan, vocab):
    check_step0(gpu, plan, preset("tiny", vocab=vocab))


@pytest.mark.parametrize("case", ["online", "naive", "accum 2", "bf16", "f16", "a GPU's", "nanochat bf16"])
def test_recompute_gives_the_same_gradients_bit_for_bit(gpu, monkeypatch, case):
    """--recompute: one set of block activations, each block's forward run again from its saved
    input in the backward, by the same kernels in the same order: every gradient equal to the
    saving path's bit for bit, and so is the AdamW step after it (online and naive attention,
    accumulation, both 16-bit precisions, a GPU's plan)."""
    from tinygpt.device.planner import make_plan
    precision = PRECISIONS[case.split()[-1]] if case.split()[-1] in PRECISIONS else PRECISIONS["fp32"]
    if precision.feature and precision.feature not in gpu.features:
        pytest.skip(f"{gpu.name} has no {precision.feature}")
    if case == "a GPU's":
        monkeypatch.setattr(type(gpu), "is_cpu", property(lambda self: False))
    plan = make_plan(gpu, tuning={} if case == "a GPU's" else None)
    # nanochat's block: QK-norm's and the embedding norm's saved inputs, RoPE, k and v of one head
    parts = {**BLOCKS["nanochat"], "kv_heads": 1, "heads": 6} if "nanochat" in case else {}
    cfg = preset("tiny", layers=3, batch=4, **parts)
    attention, accum = ("naive" if case == "naive" else "online"), (2 if case == "accum 2" else 1)
    params = init_params(cfg)
    x, y = batch(preset("tiny", layers=3, batch=4 * accum, **parts), 2)       # accum micro-batches of 4
    got = {}
    for recompute in (False, True):
        m = Model(gpu, plan, RunSpec(cfg, attention, accum=accum, precision=precision, recompute=recompute))
        m.set_params(params)
        m.step(x, y, 1e-3)
        got[recompute] = (m.get_grads(), m.get_params(), m.loss())
        if recompute:
            assert m.buf["pre"][0] is m.buf["pre"][2] and m.buf["x"][0] is not m.buf["x"][1]
    (g0, p0, l0), (g1, p1, l1) = got[False], got[True]
    assert l0 == l1
    for name in g0:
        assert np.array_equal(g0[name].view(np.uint32), g1[name].view(np.uint32)), name
        assert np.array_equal(p0[name].view(np.uint32), p1[name].view(np.uint32)), name
    print(f"recompute {case}: {len(g0)} gradients and the step after them equal bit for bit")


def test_step0_with_gpt2s_gelu(gpu, plan):
    """activation gelu_tanh: the GELU kernels' TANH form through a whole step, and no other."""
    check_step0(gpu, plan, preset("tiny", activation="gelu_tanh"))


# the block's parts (core.block) other than GPT-2's: each alone, and the three together
MODERN = {"rmsnorm": dict(norm="rmsnorm", norm_eps=1e-6), "rope": dict(position="rope", rope_theta=500.0),
          "relu2": dict(activation="relu2"), "no bias": dict(bias="none"), "qkv bias": dict(bias="qkv"),
          "untied": dict(tied=False), "qk-norm": dict(qk_norm="weighted"),
          "qk-norm free, rope": dict(qk_norm="free", position="rope"),
          "multi-query": dict(kv_heads=1), "rmsnorm free": dict(norm="rmsnorm_free"), "softcap": dict(softcap=0.5),
          "embed norm": dict(embed_norm=True), "swiglu": dict(activation="swiglu"),
          "swiglu, no bias": dict(activation="swiglu", bias="none"), "embed rmsnorm free": dict(embed_norm=True, norm="rmsnorm_free"), "gqa, qk-norm, rope": dict(heads=4, kv_heads=2, qk_norm="weighted",
                                                                      position="rope"),
          "all": dict(norm="rmsnorm", position="rope", activation="relu2", bias="none", tied=False,
                      qk_norm="weighted", heads=6, kv_heads=2, softcap=15.0, embed_norm=True),
          # heads whose dim is set apart from d_model / heads: q and the attention 64 wide in a width of
          # 48 (Qwen3-0.6B's shape, 16 x 128 in 1,024), or 24 wide with every projection's bias
          "heads apart": dict(heads=4, head_dim=16, kv_heads=2, qk_norm="weighted", position="rope", bias="qkv"),
          "heads apart, narrow": dict(head_dim=8)}


@pytest.mark.parametrize("parts, attention, window", [(p, "online", 0) for p in MODERN] + [
    ("all", "naive", 0), ("all", "fused_sv", 0), ("all", "online", 5)])
def test_step0_with_the_blocks_parts(gpu, plan, parts, attention, window):
    """RMSNorm (no biases: the parameters and gradients of g alone), RoPE (no position table; q and
    k turned where they are stored, their gradients turned back), ReLU², projections without
    biases (or q, k, v's alone: Qwen2's) and an untied head (lm_head's gradient the head's alone,
    tok_emb's the embedding's): logits, loss and every gradient against the float64 reference, on
    each attention path and with a sliding window."""
    cfg = preset("tiny", **MODERN[parts], window=window).validate()
    blk = cfg.block
    names = {n for n, _, _ in param_shapes(cfg)}
    assert ("pos_emb" in names) == blk.position.table and ("h0.ln1_b" in names) == blk.norm.bias
    check_step0(gpu, plan, cfg, attention=attention)


def test_step0_with_every_matmul_tiled(gpu, monkeypatch):
    """The plan a GPU gets untuned (tiled matmuls, the other families without subgroups): the whole
    step's logits, loss and gradients against the reference (vocab 301, padded to 304 inside),
    and with Llama's parts (q and k turned where the tiled projections store them);
    a tile the device's workgroup memory cannot hold falls back to vec4."""
    from tinygpt.device.planner import make_plan
    monkeypatch.setattr(type(gpu), "is_cpu", property(lambda self: False))
    plan = make_plan(gpu, tuning={})
    assert (plan.matmul, plan.attention, plan.loss, plan.reduce) == ("tiled", "tiles", "scalar", "scalar")
    check_step0(gpu, plan, preset("tiny", vocab=301))
    m = check_step0(gpu, plan, preset("tiny", vocab=301, position="rope", norm="rmsnorm", activation="swiglu"),
                    keep=True)[1]       # q and k turned where the tiled projections store them
    assert sum(d.kernel.name == "matmul_rope_tiled" for d in m.graph.fwd) == 2 * m.cfg.layers
    monkeypatch.setitem(gpu.limits, "max-compute-workgroup-storage-size", 4096)    # the tile no longer fits
    assert make_plan(gpu, tuning={}).matmul == "vec4"


def test_step0_with_logits_split_by_a_forced_limit(gpu, plan, monkeypatch):
    """The head's matmuls, cross-entropy and the tied embedding's gradient, chunk by chunk."""
    assert check_step0(gpu, plan, preset("tiny", layers=1, d_model=16, heads=2, vocab=2000, batch=16, ctx=16), limit=600_000, monkeypatch=monkeypatch) == 4


def test_step0_with_the_token_embedding_split_by_a_forced_limit(gpu, plan, monkeypatch):
    """tok_emb [2000, 128] over a 600 kB limit: bound in 2 chunks of rows, the head's logits and
    gradients passing through the block scratch (embed.wgsl's copy_block), the logits in 4 chunks of rows."""
    cfg = preset("tiny", layers=1, d_model=128, heads=2, vocab=2000, batch=16, ctx=16)
    assert check_step0(gpu, plan, cfg, limit=600_000, monkeypatch=monkeypatch) == 4
    m = Model(gpu, plan, RunSpec(cfg, "online"))
    print(f"token table chunks {m.head.vchunks}, blocks of {m.head.block} rows")
    assert len(m.head.vchunks) == 2


@pytest.mark.parametrize("case", ["score heads", "GPT-2 vocab", "rotary, GPT-2 vocab"])
def test_step0_with_heads_apart_split_by_a_forced_limit(gpu, plan, monkeypatch, case):
    """Heads set apart from the width, with every split a limit makes: 12 heads of 8 (q 96 wide in
    128) on the naive path, whose score matrices come in head chunks, the token table in 2 chunks
    and the logits in row chunks (600 kB); and 4 heads of 16 (q 64 wide) at GPT-2's vocabulary (13 MB:
    the table in 2 chunks, the flat buffers in chunks); and so with Llama's parts, whose q and k
    the projections turn as they store them and whose dq, dk the online backward turns back, the
    untied head's table in 2 chunks too."""
    if case == "score heads":
        cfg = preset("tiny", layers=1, d_model=128, heads=12, head_dim=8, kv_heads=4, vocab=2000, batch=4, ctx=64)
        limit, attention, names = 600_000, "naive", None
    elif case == "GPT-2 vocab":   # the gradients GPT-2's vocabulary test checks, the projections the heads shape
        cfg = preset("tiny", layers=1, d_model=128, heads=4, head_dim=16, vocab=50257, batch=2, ctx=16)
        limit, attention = 13_000_000, "online"
        names = ("tok_emb", "pos_emb", "h0.Wq", "h0.bq", "h0.Wk", "h0.Wv", "h0.Wo", "h0.fc_out_W", "ln_f_g")
    else:
        cfg = preset("tiny", layers=1, d_model=128, heads=4, head_dim=16, kv_heads=2, vocab=50257, batch=2, ctx=16,
                     norm="rmsnorm", position="rope", activation="swiglu", bias="none", tied=False)
        limit, attention = 13_000_000, "online"
        names = ("tok_emb", "lm_head", "h0.Wq", "h0.Wk", "h0.Wv", "h0.Wo", "h0.fc_gate_W", "h0.fc_in_W", "ln_f_g")
    n, m = check_step0(gpu, plan, cfg, names=names, limit=limit, monkeypatch=monkeypatch, keep=True,
                       attention=attention)
    print(f"{case}: logit chunks {n}, token table chunks {m.head.vchunks}, head chunks {m.layout.size['head_chunks']}")
    assert len(m.head.vchunks) == 2 and cfg.block.heads.apart
    if case == "score heads":
        assert n > 1 and len(m.layout.size["head_chunks"]) > 1
    else:                       # 32 rows of logits fit one binding; the flat buffers are bound in chunks
        assert len(m.layout.flat_chunks) > 1
    if case.startswith("rotary"):
        turned = [d.kernel.name for d in m.graph.fwd + m.graph.bwd if "rope" in d.kernel.name]
        print("turned:", sorted(set(turned)))
        assert sum(n.startswith("matmul_rope") for n in turned) == 2
        assert sum(n.startswith("attn_online_d") for n in turned) == 2 and "rope_backward" not in turned


def test_step0_gpt2_vocabulary_with_the_token_embedding_split_by_a_forced_limit(gpu, plan, monkeypatch):
    """GPT-2's vocabulary at width 128 under a 13 MB limit: tok_emb [50264, 128] (25.7 MB) bound in 2
    chunks, 64-row chunks of logits (12.9 MB each), the flat buffers in chunks too."""
    cfg = preset("tiny", layers=1, d_model=128, heads=2, vocab=50257, batch=2, ctx=16)
    check_step0(gpu, plan, cfg, names=("tok_emb", "pos_emb", "h0.Wq", "h0.fc_out_W", "ln_f_g"), limit=13_000_000,
                monkeypatch=monkeypatch)
    m = Model(gpu, plan, RunSpec(cfg, "online"))
    print(f"token table chunks {m.head.vchunks}, flat chunks {len(m.layout.flat_chunks)}")
    assert len(m.head.vchunks) == 2 and len(m.layout.flat_chunks) > 1


def test_split_token_embedding_trains_as_the_whole_one(gpu, plan, monkeypatch):
    """tok_emb split into 3 chunks against whole: the forward's logits are the same products in the
    same order (bit for bit); the backward's sums are split into blocks, so float32 rounding differs:
    every gradient within 4e-6 of its scale (1e-6 held with little room), and five AdamW steps' losses within 1e-5. (Weights are
    not compared: AdamW's division by sqrt(v) turns a rounding difference in a gradient near zero
    into a full step.)"""
    cfg = preset("tiny", layers=1, d_model=128, heads=2, vocab=2000, batch=4, ctx=16)
    params = init_params(cfg)
    xs = np.random.default_rng(3).integers(0, cfg.vocab, (5, cfg.batch, cfg.ctx + 1)).astype(np.uint32)
    out = []
    for limit in (None, 512_000):
        if limit:
            monkeypatch.setitem(gpu.limits, "max-storage-buffer-binding-size", limit)
        m = Model(gpu, plan, RunSpec(cfg, "online"))
        assert len(m.head.vchunks) == (3 if limit else 1)
        m.set_params(params)
        logits0 = m.logits_of(xs[0][:, :-1])
        m.grads_only(xs[0][:, :-1], xs[0][:, 1:])
        grads = m.get_grads()
        losses = []
        for w in xs:
            m.step(w[:, :-1], w[:, 1:], 3e-3)
            losses.append(m.loss())
        out.append((logits0, grads, losses))
    (l0, g0, s0), (l1, g1, s1) = out
    assert np.array_equal(l0, l1), "the split forward's logits differ"
    for k in g0:
        check(f"grad {k}, split vs whole", g1[k], g0[k], 4e-6 * max(np.abs(g0[k]).max(), 1e-4))  # bk: exactly 0, round-off
    check("losses of 5 steps, split vs whole", s1, s0, 1e-5)


@pytest.mark.parametrize("vocab, limit, width", [(2000, 600_000, 128), (50257, 13_000_000, 128)])
def test_step0_untied_head_split_by_a_forced_limit(gpu, plan, monkeypatch, vocab, limit, width):
    """An untied head's lm_head bound in chunks of rows, as the token table is, where the binding
    limit is forced low (and at GPT-2's vocabulary): the head's gradient its own, the embedding's
    written (not added) chunk by chunk, every gradient against the float64 reference."""
    cfg = preset("tiny", layers=1, d_model=width, heads=2, vocab=vocab, batch=2, ctx=16, tied=False,
                 norm="rmsnorm", position="rope", activation="swiglu", bias="none")
    chunks, m = check_step0(gpu, plan, cfg, limit=limit, monkeypatch=monkeypatch, keep=True)
    assert len(m.head.vchunks) > 1 and chunks >= 1, (m.head.vchunks, chunks)


def test_step0_gpt2_vocabulary_small_preset(gpu, plan):
    """V = 50257 at the small preset: the logits split by themselves on lavapipe (134 MB bindings)."""
    cfg = preset("small", vocab=50257)
    n = check_step0(gpu, plan, cfg, names=("tok_emb", "pos_emb", "h0.Wq", "h2.fc_out_W"))
    logit_bytes = 4 * cfg.batch * cfg.ctx * 50264          # the vocabulary padded for the vec4 head
    print(f"logit chunks: {n} ({logit_bytes:,} bytes of logits, bindings of {gpu.max_binding:,})")
    assert (n > 1) == (logit_bytes > gpu.max_binding)


@pytest.mark.slow
def test_one_step_of_the_gpt2_preset_at_reduced_depth(gpu, plan):
    """GPT-2 small's width and vocabulary with one layer: tok_emb [50264, 768] is 154 MB, over
    lavapipe's 134 MB binding, so it splits by itself; logits, loss and gradients against the
    float64 reference, then one AdamW step. A quarter of its context: the steps at 1,024 took 70
    of the test's 100 s on lavapipe, and attention past 1,024 has its own test (test_attention's
    test_online_beyond_the_old_cap). Its logits (51 MB) stay whole here; the GPT-2 vocabulary's
    logits split by themselves in test_step0_gpt2_vocabulary_small_preset."""
    cfg = preset("gpt2", layers=1, ctx=256)
    assert (cfg.d_model, cfg.heads, cfg.ctx, cfg.vocab, cfg.batch) == (768, 12, 256, 50257, 1)
    m_split = 4 * 50264 * 768 > gpu.max_binding
    # the same model takes the AdamW step: a second model of this size is a long build on a CPU
    n, m = check_step0(gpu, plan, cfg, names=("tok_emb", "pos_emb", "h0.Wq", "h0.fc_out_W", "ln_f_g"), keep=True)
    print(f"logit chunks {n}, token table chunks {m.head.vchunks}")
    assert (len(m.head.vchunks) > 1) == m_split
    x, y = batch(cfg, 1)
    m.step(x, y, 6e-4)
    assert abs(m.loss() - np.log(cfg.vocab)) < 0.5


@pytest.mark.parametrize("which", ["this adapter's", "a GPU's", "split", "GPT-2 split", "gelu_tanh", "modern", "llama",
                                   "llama, a GPU's"])
@pytest.mark.parametrize("half", ["bf16", "f16"])
def test_step0_half_against_its_reference(gpu, monkeypatch, which, half):
    """precision bf16 or f16: logits, loss and every gradient against the float64 reference rounding
    where the model stores 16 bits (and, for f16, rounding each float32 gradient a matmul reads,
    after the loss scale of 65536 multiplied it). A value on a rounding edge may round one way in
    float32 and the other in float64 (one bf16 step, 2^-8), and the reference does not round each
    f16 product as the f16 kernels do, so the tolerance is 3e-3 of scale, not float32's 1e-4.
    Under this adapter's plan (lavapipe: the sg kernels, the attention reading 16-bit q, k, v) and
    under the plan a GPU gets untuned (the tiled template reading 16-bit operands, with f16
    products for f16; the tiles attention, online.wgsl, reading the 16-bit q, k, v as stored; with
    Llama's block). And with the binding limit forced
    low ("split": vocab 2000 at width 128, 600 kB), so that the head multiplies the table's copy in
    2 chunks of rows and the logits come in 4 chunks; and so at GPT-2's vocabulary (13 MB: the table
    in 2 chunks, the flat buffers and the weight copy's casts in chunks too)."""
    from tinygpt.device.kernels import LOSS_SCALE
    from tinygpt.device.planner import make_plan
    precision = PRECISIONS[half]
    if precision.feature and precision.feature not in gpu.features:
        pytest.skip(f"{gpu.name} has no {precision.feature} (tests/device/test_f16.py tests the refusal)")
    plan = make_plan(gpu)
    cfg = preset("tiny")
    if "a GPU's" in which:
        monkeypatch.setattr(type(gpu), "is_cpu", property(lambda self: False))
        plan = make_plan(gpu, tuning={})
        assert (plan.matmul, plan.attention) == ("tiled", "tiles")
    if which == "split":
        cfg = preset("tiny", layers=1, d_model=128, heads=2, vocab=2000, batch=16, ctx=16)
        monkeypatch.setitem(gpu.limits, "max-storage-buffer-binding-size", 600_000)
    if which == "gelu_tanh":       # GPT-2's GELU in the 16-bit kernels
        cfg = preset("tiny", activation="gelu_tanh")
    if which == "modern":          # RMSNorm, RoPE on 16-bit q and k, ReLU² in the 16-bit kernels
        cfg = preset("tiny", **MODERN["all"])
    if which.startswith("llama"):  # SwiGLU reading 16-bit gate and up, grouped-query attention, RMSNorm's gains,
        cfg = preset("tiny", norm="rmsnorm", position="rope", activation="swiglu", bias="none", tied=False,
                     heads=6, kv_heads=3, head_dim=16)     # heads of 16 set apart: q 96 wide in 48 (Qwen3-0.6B's way)
    if which == "GPT-2 split":     # tok_emb [50264, 128] in 2 chunks, logits in 64-row chunks, flat chunks
        cfg = preset("tiny", layers=1, d_model=128, heads=2, vocab=50257, batch=2, ctx=16)
        monkeypatch.setitem(gpu.limits, "max-storage-buffer-binding-size", 13_000_000)
    scale = LOSS_SCALE if precision.loss_scaling else 1.0
    params = init_params(cfg)
    x, y = batch(cfg)
    logits, loss, cache = RG.forward(f64(params), cfg, x, y, precision=precision)
    grads = RG.backward(f64(params), cfg, cache, loss_scale=scale)
    m = Model(gpu, plan, RunSpec(cfg, "online", precision=precision))
    assert m.head.split == ("split" in which) and (which != "split" or len(m.layout.logit_chunks) == 4)
    assert which != "GPT-2 split" or (len(m.head.vchunks) == 2 and len(m.layout.flat_chunks) > 1)
    if which == "a GPU's":   # the GPU shapes in this precision, not float32 copies
        built = {(d.kernel.file, d.kernel.constants, d.kernel.fill) for d in m.graph.fwd + m.graph.bwd}
        assert any(f == "online.wgsl" and (half.upper(), True) in c for f, c, _ in built), built
        products = "f16" if half == "f16" else "f32"
        assert any(f == "matmul_tiled.wgsl" and ("A_HALF", True) in c and p == products for f, c, p in built)
    if which.startswith("llama"):   # 16-bit q and k: stored, then turned (the reference rounds them there)
        assert sum(d.kernel.name == "rope_forward" for d in m.graph.fwd) == 2 * cfg.layers
    m.set_params(params)
    check(f"{half} logits (3e-3 of scale)", m.logits_of(x), logits, 3e-3 * np.abs(logits).max())
    m.grads_only(x, y)
    check(f"{half} loss", m.loss(), loss, 1e-4 * abs(loss))
    G = m.get_grads()                                    # of the scaled loss, where the policy scales it
    for name, want in grads.items():
        top = max(np.abs(want).max(), 1e-4)              # bk: exactly 0, round-off
        check(f"{half} grad {name} (3e-3 x {top:.2e})", G[name] / scale, want, 3e-3 * top)


# Training runs of many steps: slow-marked, so the Vulkan pass runs them and the OpenGL pass,
# whose kernels without subgroups take minutes for them (docs/results.md, Tests), leaves them
# (its step-0 and ten-step tests check the same kernels against the reference).
@pytest.mark.slow
def test_bf16_learns_as_fp32_does(gpu, plan):
    """The parity of learning: the tiny preset on the built-in corpus, same init and batches, 200
    AdamW steps in each precision, the loss read every 10. One batch's loss moves with rounding
    (measured: gaps up to 0.059, mean 0.0135), so the bounds are on the curves: mean gap under
    0.03, none over 0.1, the last 50 steps' means within 0.03; and bf16 learns."""
    from tinygpt.files.data import Dataset, read_corpus
    from tinygpt.tokenizers import ByteTokenizer
    cfg = preset("tiny")
    raw, _ = read_corpus(None)
    data = Dataset(ByteTokenizer().encode(raw), cfg.ctx)
    rng = np.random.default_rng(5)
    batches = [data.sample(rng, cfg.batch) for _ in range(200)]
    params = init_params(cfg)
    curves = {}
    for prec in ("fp32", "bf16"):
        m = Model(gpu, plan, RunSpec(cfg, "online", precision=PRECISIONS[prec]))
        m.set_params(params)
        curve = []
        for i, (x, y) in enumerate(batches):
            m.step(x, y, 3e-3)
            if i % 10 == 9:
                curve.append(m.loss())
        curves[prec] = np.array(curve)
    gap = np.abs(curves["bf16"] - curves["fp32"])
    print("fp32:", " ".join(f"{v:.3f}" for v in curves["fp32"]))
    print("bf16:", " ".join(f"{v:.3f}" for v in curves["bf16"]))
    print(f"largest gap {gap.max():.4f}, mean {gap.mean():.4f}")
    tail = abs(curves["bf16"][-5:].mean() - curves["fp32"][-5:].mean())
    print(f"last 50 steps' mean loss: fp32 {curves['fp32'][-5:].mean():.4f}, bf16 {curves['bf16'][-5:].mean():.4f}")
    assert gap.mean() < 0.03 and gap.max() < 0.1 and tail < 0.03
    assert curves["bf16"][-1] < curves["bf16"][0] - 1.0


def test_ten_adamw_steps_match_reference(gpu, plan, tiny):
    params = init_params(tiny)
    ref = f64(params)
    opt = RG.new_opt_state(ref, ADAMW)
    m = Model(gpu, plan, RunSpec(tiny, "online"))
    m.set_params(params)
    for step in range(10):
        x, y = batch(tiny, step)
        m.step(x, y, 1e-3)
        _, loss, cache = RG.forward(ref, tiny, x, y)
        RG.clip_and_step(ref, RG.backward(ref, tiny, cache), opt, tiny, 1e-3, ADAMW)
        check(f"step {step} loss", m.loss(), loss, 1e-4)
    got = m.get_params()
    for name in ("tok_emb", "h1.Wq", "h1.fc_out_W", "ln_f_g"):
        check(f"params {name} after 10 steps", got[name], ref[name], 1e-5)


@pytest.mark.slow      # as test_bf16_learns_as_fp32_does
def test_overfit_one_batch(gpu, plan, tiny):
    """A tiny model memorises one fixed batch: from about ln 256 to below 0.5 within 150 steps."""
    m = Model(gpu, plan, RunSpec(tiny, "online"))
    m.set_params(init_params(tiny))
    x, y = batch(tiny, 42)
    losses = []
    for step in range(150):
        m.step(x, y, 3e-3)
        if step % 10 == 0 or step == 149:
            losses.append(m.loss())
    print("overfit losses every 10 steps:", " ".join(f"{l:.3f}" for l in losses))
    assert abs(losses[0] - np.log(256)) < 0.1
    assert min(losses) < 0.5


def test_a_step_is_one_submit_and_creates_nothing(gpu, plan, tiny):
    m = Model(gpu, plan, RunSpec(tiny, "online"))
    m.set_params(init_params(tiny))
    x, y = batch(tiny)
    m.step(x, y, 1e-3)
    gpu.sync()
    before = dict(vars(gpu.counters))
    for i in range(5):
        x, y = batch(tiny, i)
        m.step(x, y, 1e-3)
    after = dict(vars(gpu.counters))
    assert after["submits"] - before["submits"] == 5, "one queue submission per step"
    assert after["readbacks"] == before["readbacks"], "no readback on steps that log nothing"
    for what in ("buffers", "bind_groups", "pipelines"):
        assert after[what] == before[what], f"{what} created after the first step"
    m.loss()
    assert gpu.counters.readbacks == before["readbacks"] + 1


def test_every_attention_trains_alike(gpu, plan, tiny):
    """20 steps from one init with each impl give the same losses."""
    runs = {}
    for impl in IMPLS:
        m = Model(gpu, plan, RunSpec(tiny, impl))
        m.set_params(init_params(tiny))
        runs[impl] = []
        for step in range(20):
            x, y = batch(tiny, step)
            m.step(x, y, 1e-3)
            runs[impl].append(m.loss())
    print({k: f"{v[0]:.4f} -> {v[-1]:.4f}" for k, v in runs.items()})
    for impl in IMPLS[:2]:
        check(f"20 losses {impl} vs online", runs[impl], runs["online"], 1e-4)


def test_unscored_targets_leave_the_mean_over_the_scored_ones(gpu, plan):
    """A chat batch: targets UNSCORED where they are not the assistant's (padding, prompts), one
    window all unscored, over 2 micro-batches: the loss and every gradient are the float64 mean over
    the scored targets alone; a batch with another count of scored targets rescales, and a text's
    batch (all scored) is the plain mean again."""
    from tinygpt.core.config import UNSCORED
    cfg = preset("tiny", batch=8, ctx=16)
    params = init_params(cfg)
    r = np.random.default_rng(9)
    m = Model(gpu, plan, RunSpec(cfg, "online", B=4, accum=2))
    m.set_params(params)
    for case in ("half", "one in three", "all"):
        w = r.integers(0, cfg.vocab, (8, cfg.ctx + 1)).astype(np.uint32)
        x, y = w[:, :-1], w[:, 1:].copy()
        if case == "half":
            y[:, :7] = UNSCORED
            y[5] = UNSCORED
        elif case == "one in three":
            y[:, ::3] = UNSCORED
        m.grads_only(x, y)
        _, loss, cache = RG.forward(f64(params), cfg, x, y)
        want = RG.backward(f64(params), cfg, cache)
        G = m.get_grads()
        check(f"{case}: {int((y != UNSCORED).sum())} scored targets, the loss", m.loss(), loss, 1e-5 * abs(loss))
        for name in ("tok_emb", "pos_emb", "h0.Wq", "h1.fc_out_W", "ln_f_b"):
            scale = max(np.abs(want[name]).max(), 1e-6)
            check(f"{case}: grad {name} (tol 1e-4 x {scale:.2e})", G[name], want[name], 1e-4 * scale)
        rows = m.mean_loss(x, y)
        check(f"{case}: mean_loss over the scored targets", rows, loss, 1e-5 * abs(loss))


# windows of 16 rows holding records laid end to end (a record of one row, a window of one record,
# tail padding); 2 micro-batches of 2 windows
PACKED_WINDOWS = [[5, 7, 4], [16], [1, 9, 3], [11, 5]]


def check_packed(gpu, plan, cfg, attention, lengths=PACKED_WINDOWS, names=None, tag="", monkeypatch=None,
                 limit=None, accum=2):
    """Windows of cfg.ctx rows packed with records of `lengths` (4 windows: `accum` micro-batches), each
    record's first target unscored (a prompt's) and the tail after a window's records padding: the
    loss and every gradient (or `names`) against the float64 reference run on each record alone,
    the mean over every scored target of the step. limit: the binding size forced low. -> the model."""
    from tinygpt.core.config import UNSCORED
    if limit:
        monkeypatch.setitem(gpu.limits, "max-storage-buffer-binding-size", limit)
    params = init_params(cfg)
    r = np.random.default_rng(13)
    T = cfg.ctx
    x = r.integers(0, cfg.vocab, (4, T)).astype(np.uint32)
    y = r.integers(0, cfg.vocab, (4, T)).astype(np.uint32)
    docs = np.zeros((4, T), np.uint32)
    records = []                                     # (window, first row, length)
    for b, window in enumerate(lengths):
        t0 = 0
        for n in window:
            docs[b, t0:t0 + n] = np.arange(n)
            y[b, t0] = UNSCORED
            records.append((b, t0, n))
            t0 += n
        docs[b, t0:] = np.arange(T - t0)             # the tail: padding, unscored
        y[b, t0:] = UNSCORED
    m = Model(gpu, plan, RunSpec(cfg, attention, B=4 // accum, accum=accum, packed=True))
    m.set_params(params)
    m.grads_only(x, y, docs=docs)
    N = int(np.count_nonzero(y != UNSCORED))
    loss, want = 0.0, {}
    for b, t0, n in records:
        xs, ys = x[b:b + 1, t0:t0 + n], y[b:b + 1, t0:t0 + n]
        scored = int(np.count_nonzero(ys != UNSCORED))
        if not scored:
            continue
        _, lr, cache = RG.forward(f64(params), cfg, xs, ys)
        loss += lr * scored / N
        for name, g in RG.backward(f64(params), cfg, cache).items():
            if names is None or name in names:
                want[name] = want.get(name, 0) + g * scored / N
    check(f"{tag}: loss of {len(records)} records in 4 windows, {N} scored", m.loss(), loss, 1e-5 * abs(loss))
    G = m.get_grads()
    for name, w in want.items():
        scale = max(np.abs(w).max(), 1e-6)
        check(f"{tag}: grad {name} (tol 1e-4 x {scale:.2e})", G[name], w, 1e-4 * scale)
    check(f"{tag}: mean_loss of the packed windows", m.mean_loss(x, y, docs=docs), loss, 1e-5 * abs(loss))
    return m


@pytest.mark.parametrize("parts, attention, window", [(None, a, 0) for a in IMPLS] + [
    ("all", a, 0) for a in IMPLS] + [("all", "online", 5)])
def test_packed_windows_equal_their_records_one_by_one(gpu, plan, parts, attention, window):
    """Several records to a window, each attending only within itself and its positions (the
    learned table's rows, RoPE's angles) restarting at 0, the padding after the last record
    unscored: the loss and every gradient equal those of the float64 reference run on each record
    alone (the mean over every scored target of the step), for GPT-2's block and the modern one
    (RoPE, RMSNorm, QK-norm, grouped heads), on every attention path and with a sliding window."""
    cfg = preset("tiny", batch=2, ctx=16, window=window, **(MODERN[parts] if parts else {})).validate()
    check_packed(gpu, plan, cfg, attention, tag=f"{'modern' if parts else 'GPT-2'} {attention} window {window}")


@pytest.mark.parametrize("case", ["score heads", "GPT-2 vocab"])
def test_packed_windows_with_every_split_a_forced_limit_makes(gpu, plan, monkeypatch, case):
    """Packed windows through the paths a binding limit splits: the naive path's score matrices in
    head chunks, the token table in 2 chunks of rows and the logits in row chunks (600 kB, 4 windows
    of 64 at once); and GPT-2's vocabulary under 13 MB (the table in 2 chunks, the flat buffers in chunks),
    its learned positions' gradient summed over the records: against each record alone in float64."""
    if case == "score heads":
        cfg = preset("tiny", layers=1, d_model=128, heads=12, head_dim=8, kv_heads=4, vocab=2000, batch=4, ctx=64)
        lengths, limit, attention, names = [[20, 1, 30, 7], [64], [7, 33, 24], [50, 14]], 600_000, "naive", None
        accum = 1                                    # 4 windows at once: 12 heads' scores pass the limit
    else:
        cfg = preset("tiny", layers=1, d_model=128, heads=4, head_dim=16, vocab=50257, batch=2, ctx=16)
        lengths, limit, attention, accum = PACKED_WINDOWS, 13_000_000, "online", 2
        names = ("tok_emb", "pos_emb", "h0.Wq", "h0.Wk", "h0.Wv", "h0.Wo", "h0.fc_out_W", "ln_f_g")
    m = check_packed(gpu, plan, cfg, attention, lengths, names, f"packed, {case} split", monkeypatch, limit, accum)
    print(f"{case}: token table chunks {m.head.vchunks}, head chunks {m.layout.size['head_chunks']}, "
          f"logit chunks {len(m.layout.logit_chunks)}, flat chunks {len(m.layout.flat_chunks)}")
    assert len(m.head.vchunks) == 2
    if case == "score heads":
        assert len(m.layout.logit_chunks) > 1 and len(m.layout.size["head_chunks"]) > 1
    else:
        assert len(m.layout.flat_chunks) > 1


def test_dpo_loss_and_gradients_against_float64(gpu, plan):
    """A DPO model (spec.dpo = beta): windows 2i and 2i+1 a pair's chosen and rejected completions,
    their prompts unscored, 2 micro-batches of 2 pairs: the step's loss is the mean of the pairs'
    -log sigmoid(beta ((lc - rc) - (lr - rr))), and every gradient the float64 reference's, whose
    dlogits are each row's cross-entropy gradient times its window's factor (reference dpo)."""
    from tinygpt.core.config import UNSCORED
    cfg = preset("tiny", batch=4, ctx=16)
    params = init_params(cfg)
    r = np.random.default_rng(11)
    w = r.integers(0, cfg.vocab, (8, cfg.ctx + 1)).astype(np.uint32)
    x, y = w[:, :-1], w[:, 1:].copy()
    y[:, :5] = UNSCORED
    refs = (-r.uniform(20, 40, 8)).astype(np.float32)
    beta, T, BT, V = 0.5, cfg.ctx, 8 * cfg.ctx, cfg.vocab
    m = Model(gpu, plan, RunSpec(cfg, "online", B=4, accum=2, dpo=beta))
    m.set_params(params)
    m.grads_only(x, y, refs)
    logits, _, cache = RG.forward(f64(params), cfg, x, y)
    losses, d = R.cross_entropy(y.reshape(-1), logits.reshape(BT, V), 1.0)
    weights, loss = R.dpo(refs.astype(np.float64), losses, 4, T, beta, 1 / 4, 1 / 4)
    cache["dlogits"] = R.scale_rows(weights, d, BT, V, T)
    want = RG.backward(f64(params), cfg, cache)
    print(f"DPO loss {loss:.6f} (ln 2 = {np.log(2):.6f} where the model is its reference)")
    check("DPO loss (the mean of 2 micro-batches' slots)", m.loss(), loss, 1e-5 * abs(loss))
    G = m.get_grads()
    for name in ("tok_emb", "pos_emb", "h0.Wq", "h1.fc_out_W", "ln_f_b"):
        scale = max(np.abs(want[name]).max(), 1e-6)
        check(f"DPO grad {name} (tol 1e-4 x {scale:.2e})", G[name], want[name], 1e-4 * scale)


def test_grad_accum_matches_the_whole_batch(gpu, plan):
    """4 micro-batches of 4 windows against one batch of 16: gradients against the float64
    reference of the 16, then 5 AdamW steps whose losses match the batch-16 model's."""
    cfg = preset("tiny", batch=16, ctx=16)
    params = init_params(cfg)
    r = np.random.default_rng(5)
    xs = r.integers(0, cfg.vocab, (6, 16, cfg.ctx + 1)).astype(np.uint32)
    whole, acc = Model(gpu, plan, RunSpec(cfg, "online")), Model(gpu, plan, RunSpec(cfg, "online", B=4, accum=4))
    for m in (whole, acc):
        m.set_params(params)
    x, y = xs[0, :, :-1], xs[0, :, 1:]
    acc.grads_only(x, y)
    _, loss, cache = RG.forward(f64(params), cfg, x, y)
    want = RG.backward(f64(params), cfg, cache)
    G = acc.get_grads()
    check("accumulated loss (mean of 4 micro-batches)", acc.loss(), loss, 1e-5)
    for name in ("tok_emb", "pos_emb", "h0.Wq", "h0.bk", "h1.fc_out_W", "h1.ln2_g", "ln_f_b"):
        scale = max(np.abs(want[name]).max(), 1e-6)
        check(f"accumulated grad {name} (tol 1e-4 x {scale:.2e})", G[name], want[name], 1e-4 * scale)
    la, lw = [], []
    for w in xs[1:]:
        for m, out in ((whole, lw), (acc, la)):
            m.step(w[:, :-1], w[:, 1:], 3e-3)
            out.append(m.loss())
    check("5 steps: losses, accum 4 x 4 against batch 16", la, lw, 1e-5)
    pa, pw = acc.get_params(), whole.get_params()
    # AdamW divides each gradient by its own running size, so an entry whose gradient is at
    # round-off level (the key biases' true gradient is 0) moves by up to lr a step whichever way
    # the summation order rounds it: bounded by 2 x lr x steps. The rest agree to summation error.
    d = np.concatenate([np.abs(pa[k] - pw[k]).ravel() for k in pa])
    print(f"parameters after 5 steps: {np.mean(d <= 2e-6):.4%} within 2e-6, max {d.max():.2e}")
    assert np.mean(d <= 2e-6) > 0.999 and d.max() <= 2 * 3e-3 * 5


def steps_and_state(m, params, xs, opt: str):
    """(losses, weights, the optimizer's last state row) after a step on each [B, ctx + 1] batch of xs."""
    from tinygpt.model.optimizers import kind
    m.set_params(params)
    losses = []
    for w in xs:
        m.step(w[:, :-1], w[:, 1:], 3e-3)
        losses.append(m.loss())
    return losses, m.get_params(), m.get_opt_state()[kind(opt).state_rows[-1]]


@pytest.mark.parametrize("vocab, width, limit", [(256, 48, 131_072),
                                                  # GPT-2's vocabulary: its 12.9 MB embedding still fits
                                                  # one binding, the 13.3 MB flat buffers do not
                                                  (50257, 64, 13_000_000)])
@pytest.mark.parametrize("opt", ["adamw", "muon", "sgd"])     # sgd: one state row, its v binding a dummy
def test_flat_buffers_split_by_a_forced_limit_train_bit_for_bit(gpu, plan, monkeypatch, vocab, width, limit, opt):
    """The optimizer (and the accumulation) bound a chunk at a time: the same losses, weights and
    optimizer state as one dispatch over the whole flat buffers, bit for bit; Muon's matrices bound
    one at a time wherever they lie among the chunks."""
    from tinygpt.model.layout import flat_chunks
    cfg = preset("tiny", batch=2, ctx=16, vocab=vocab, d_model=width, heads=2)
    params = init_params(cfg)
    xs = np.random.default_rng(9).integers(0, cfg.vocab, (4, 4, cfg.ctx + 1)).astype(np.uint32)
    out = {}
    for limit in (None, limit):
        if limit:
            monkeypatch.setitem(gpu.limits, "max-storage-buffer-binding-size", limit)
        m = Model(gpu, plan, RunSpec(cfg, "online", accum=2, optimizer=make_settings(opt)))
        if limit:
            assert len(m.layout.flat_chunks) > 1 and m.layout.flat_chunks == flat_chunks(
                m.layout.n_flat, gpu.max_binding, gpu.limits["min-storage-buffer-offset-alignment"])
            print(f"flat buffers of {m.layout.n_flat:,} floats in {len(m.layout.flat_chunks)} chunks")
        out[limit] = steps_and_state(m, params, xs, opt)
    (l0, p0, v0), (l1, p1, v1) = out.values()
    assert l0 == l1
    assert all(np.array_equal(p0[k], p1[k]) and np.array_equal(v0[k], v1[k]) for k in p0)


@pytest.mark.parametrize("opt, precision", [("adamw", "fp32"), ("muon", "bf16")])
def test_flat_arrays_over_a_forced_buffer_limit_lie_in_parts(gpu, plan, monkeypatch, opt, precision):
    """The buffer limit forced low (128 KiB: 32,768 floats a part): parameters, gradients, the
    optimizer's state and bf16's weight copy are each several buffers, and no parameter lies across
    two. Step 0's logits, loss and every gradient against float64 (fp32); then four steps of two
    micro-batches give the losses, weights and state of the same model in one buffer, bit for bit
    (clipping off: the global norm's partial sums follow the layout, which the parts move)."""
    from tinygpt.model.layout import Parts, flat_chunks
    from tinygpt.model.optimizers import kind
    cfg = preset("tiny", batch=2, ctx=16, vocab=301, d_model=48, heads=2, grad_clip=0.0)
    params = init_params(cfg)
    xs = np.random.default_rng(4).integers(0, cfg.vocab, (4, 4, cfg.ctx + 1)).astype(np.uint32)
    spec = RunSpec(cfg, "online", accum=2, optimizer=make_settings(opt), precision=PRECISIONS[precision])
    if spec.precision.feature and spec.precision.feature not in gpu.features:
        pytest.skip(f"{gpu.name} has no {spec.precision.feature}")
    out = {}
    for limit in (None, 1 << 17):
        if limit:
            monkeypatch.setitem(gpu.limits, "max-buffer-size", limit)
            if precision == "fp32":
                check_step0(gpu, plan, cfg)
        m = Model(gpu, plan, spec)
        if limit:
            rows = ["params", "grads", "grads micro", *kind(opt).state_rows] + (["params copy"] if precision != "fp32"
                                                                                else [])
            parts = {r: len(m.buf[r].tensors) for r in rows if isinstance(m.buf[r], Parts)}
            assert set(parts) == set(rows) and min(parts.values()) > 1, parts
            assert all(off // m.layout.part == (off + np.prod(s) - 1) // m.layout.part for off, s in m.layout.offsets.values())
            assert m.layout.flat_chunks == flat_chunks(m.layout.n_flat, gpu.max_binding, 256, m.layout.part)
            print(f"{m.layout.n_flat:,} floats in parts of {m.layout.part:,}: {parts}; {len(m.layout.flat_chunks)} chunks")
        out[limit] = steps_and_state(m, params, xs, opt)
    (l0, p0, v0), (l1, p1, v1) = out.values()
    print("losses, one buffer:", l0, "in parts:", l1)
    assert l0 == l1
    assert all(np.array_equal(p0[k], p1[k]) and np.array_equal(v0[k], v1[k]) for k in p0)


def test_every_precision_names_a_launcher_for_every_role():
    """A policy's roles are the block's (core.precision.ROLES), each played by a Kernels method
    (or by none where the policy stores float32 and converts nothing), whose dtypes agree."""
    from tinygpt.core.precision import PRECISIONS, ROLES
    from tinygpt.device.kernels import Kernels
    for p in PRECISIONS.values():
        assert set(p.kernels) == set(ROLES), p.name
        for role, name in p.kernels.items():
            assert name is None if role in ("to_f32", "from_f32") and not p.converts else hasattr(Kernels, name), \
                (p.name, role, name)
        assert p.converts == (p.stored != "f32") and p.problem(8 * 12, 8 * 48) is None
    assert "multiples of 8" in PRECISIONS["bf16"].problem(36, 144)
