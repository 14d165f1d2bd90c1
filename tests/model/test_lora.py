"""LoRA (core.lora): the adapters' gradients against the float64 reference, the base frozen bit
for bit, merging, the scale kernel against its twin; the files are test_lora_files.py's."""
import numpy as np
import pytest

from conftest import check
from tinygpt.core.block import BLOCKS
from tinygpt.core import lora as LR
from tinygpt.core.config import param_shapes, preset
from tinygpt.core.init import init_params
from tinygpt.core.precision import PRECISIONS
from tinygpt.model.gpt import Model
from tinygpt.reference import gpt as RG
from tinygpt.reference import kernels as R
from tinygpt.model.spec import RunSpec

pytestmark = pytest.mark.kernel


def batch(cfg, seed=0):
    x = np.random.default_rng(seed).integers(0, cfg.vocab, (cfg.batch, cfg.ctx + 1))
    return x[:, :-1], x[:, 1:]


def f64(d):
    return {k: np.asarray(v, np.float64) for k, v in d.items()}


def adapted(cfg, lora, seed=3):
    """Base weights and adapters with B drawn too (B = 0, as a run starts, would leave dA zero)."""
    params = init_params(cfg)
    params.update(LR.init_adapters(cfg, lora))
    rng = np.random.default_rng(seed)
    for name, shape, _ in LR.adapter_shapes(cfg, lora):
        if name.endswith("lora_B"):
            params[name] = (0.05 * rng.standard_normal(shape)).astype(np.float32)
    return params


def test_scale_against_its_twin(kn, gpu, rng):
    n = 1001                                            # odd: the last workgroup part-filled
    x = rng.standard_normal(n).astype(np.float32)
    xt, out = gpu.tensor((n,), "f32", "x"), gpu.tensor((n,), "f32", "out")
    gpu.write(xt, x)
    gpu.run([kn.scale(xt, out, n, 0.375)])
    got = gpu.read(out)
    check("scale (0.375)", got, R.scale(x, 0.375), 0.0)


CASES = {   # name: (precision, rank, targets, biases, tolerance of the gradient's scale)
    "fp32 qkvo r8": ("fp32", 8, None, False, 1e-4),
    "fp32 all r3": ("fp32", 3, [t for t in LR.TARGETS if t != "gate"], False, 1e-4),   # odd rank: the scalar matmuls
    # Llama's block: the gate projection, k and v of one key/value head, RMSNorm, RoPE, no biases, untied
    "fp32 llama all r3": ("fp32", 3, list(LR.TARGETS), True, 1e-4),
    "fp32 mlp r5 biases": ("fp32", 5, ["fc_in", "fc_out"], True, 1e-4),
    "bf16 all r8": ("bf16", 8, [t for t in LR.TARGETS if t != "gate"], False, 3e-3),
    "f16 all r8": ("f16", 8, [t for t in LR.TARGETS if t != "gate"], True, 3e-3),
    # the binding limit forced low (600 kB at vocab 2000, width 128): the frozen base, its bf16 copy
    # made chunk by chunk, the head's table in chunks of rows, the logits in 4 chunks
    "bf16 split r8": ("bf16", 8, None, False, 3e-3),
    "fp32 GPT-2 vocab r8": ("fp32", 8, None, False, 1e-4),      # 13 MB: the base and the table split
    # the buffer limit forced low (128 KiB): the frozen base and its bf16 copy each in parts
    "bf16 parts r8": ("bf16", 8, None, False, 3e-3),
}


# The OpenGL pass (kernel and not slow) runs the odd rank's case, the scalar matmuls GL falls back
# to; the rest compose kernels it checks one by one, and run in the Vulkan pass.
@pytest.mark.parametrize("case", [pytest.param(c, marks=() if "all r3" in c else pytest.mark.slow) for c in CASES])
def test_step0_gradients_of_the_adapters(gpu, case, monkeypatch):
    """Logits, loss and the gradient of every trainable parameter (adapters; biases and
    LayerNorms with the flag) against the float64 reference; nothing else has a gradient."""
    from tinygpt.device.planner import make_plan
    name, rank, targets, biases, tol = CASES[case]
    precision = PRECISIONS[name]
    if precision.feature and precision.feature not in gpu.features:
        pytest.skip(f"{gpu.name} has no {precision.feature}")
    cfg = preset("tiny", layers=2)
    if "llama" in case:
        cfg = preset("tiny", layers=2, **BLOCKS["llama"], kv_heads=1)
    if "split" in case or "GPT-2" in case:
        cfg = preset("tiny", layers=2, d_model=128, heads=2, vocab=2000, batch=16, ctx=16) if "split" in case else \
            preset("tiny", layers=1, d_model=128, heads=2, vocab=50257, batch=2, ctx=16)
        monkeypatch.setitem(gpu.limits, "max-storage-buffer-binding-size", 600_000 if "split" in case else 13_000_000)
    if "parts" in case:            # fewer rows, so that every activation fits the limit
        cfg = preset("tiny", layers=2, batch=4, ctx=16)
        monkeypatch.setitem(gpu.limits, "max-buffer-size", 1 << 17)
    plan = make_plan(gpu)
    lora = LR.make_lora(rank, targets=targets, biases=biases)
    params = adapted(cfg, lora)
    x, y = batch(cfg)
    m = Model(gpu, plan, RunSpec(cfg, "online", precision=precision, lora=lora))
    if "split" in case or "GPT-2" in case:
        assert len(m.head.vchunks) > 1 and len(m.layout.flat_chunks) >= 1
        assert len(m.layout.base_chunks) > 1, "the frozen base is bound in one piece"
    if "parts" in case:
        from tinygpt.model.layout import Parts
        assert all(isinstance(m.buf[r], Parts) for r in ("base", "base copy")), "the base is one buffer"
        print(f"the base in {len(m.buf['base'].tensors)} parts of {m.layout.part:,} floats")
    m.set_params(params)
    logits, loss, cache = RG.forward(f64(params), cfg, x, y, precision=precision, lora=lora)
    scale = m.gate_state()["scale"] if m.spec.scaled else 1.0
    grads = RG.backward(f64(params), cfg, cache, loss_scale=scale)
    lt = 1e-4 if name == "fp32" else 5e-3           # 16 bits: a rounding edge flips and carries through the layers
    check(f"{case}: logits", m.logits_of(x), logits, lt * np.abs(logits).max())
    m.grads_only(x, y)
    check(f"{case}: loss", m.loss(), loss, lt * abs(loss))
    G = m.get_grads()
    if m.spec.scaled:
        G = {k: v / scale for k, v in G.items()}
    want_names = {n for n, _, _ in LR.trainable_shapes(cfg, lora)}
    assert set(G) == want_names
    floor = 1e-6 if name == "fp32" else 1e-4          # bk's exact gradient is 0: round-off below this
    for n in sorted(want_names):
        s = max(np.abs(grads[n]).max(), floor)
        check(f"{case}: grad {n} (tol {tol:g} x {s:.2e})", G[n], grads[n], tol * s)


@pytest.mark.slow
@pytest.mark.slow
def test_step0_equals_the_base_model_and_the_base_stays_bit_for_bit(gpu, plan):
    """B starts at zero: the adapted model's first logits are the base model's; after ten AdamW
    steps every base weight is what it was, bit for bit, while the adapters moved; and the
    merged weights compute the adapted model's logits."""
    cfg = preset("tiny", layers=2)
    lora = LR.make_lora(4, targets=["q", "v", "fc_out"])
    base = init_params(cfg)
    params = {**base, **LR.init_adapters(cfg, lora)}
    x, y = batch(cfg)
    plain = Model(gpu, plan, RunSpec(cfg, "online", training=False))
    plain.set_params(base)
    m = Model(gpu, plan, RunSpec(cfg, "online", lora=lora))
    m.set_params(params)
    check("step 0: adapted logits = base logits", m.logits_of(x), plain.logits_of(x), 0.0)
    for i in range(10):
        m.step(*batch(cfg, i + 1), 1e-2)
    after = m.get_params()
    for n, _, _ in param_shapes(cfg):
        assert np.array_equal(after[n].view(np.uint32), base[n].view(np.uint32)), n
    moved = max(np.abs(after[n]).max() for n, _, _ in LR.adapter_shapes(cfg, lora) if n.endswith("lora_B"))
    assert moved > 0
    plain.set_params(LR.merged(after, cfg, lora))
    got, want = plain.logits_of(x), m.logits_of(x)
    check("merged logits = adapted logits", got, want, 2e-5 * np.abs(want).max())
    print(f"base weights unchanged bit for bit over 10 steps; largest |B| after them {moved:.3e}")


@pytest.mark.slow
def test_recompute_with_lora_is_bit_for_bit(gpu, plan):
    # Llama's block with QK-norm (every projection has an adapter, the gate's too): the parts' saved
    # inputs rebuilt by the recomputed forward as the first forward made them
    cfg = preset("tiny", layers=3, batch=4, **BLOCKS["llama"], kv_heads=1, qk_norm="weighted", embed_norm=True)
    lora = LR.make_lora(8, targets=list(LR.TARGETS))
    params = adapted(cfg, lora)
    x, y = batch(cfg, 2)
    got = {}
    for recompute in (False, True):
        m = Model(gpu, plan, RunSpec(cfg, "online", recompute=recompute, lora=lora))
        m.set_params(params)
        m.step(x, y, 1e-3)
        got[recompute] = (m.get_grads(), m.get_params())
    for n in got[False][0]:
        assert np.array_equal(got[False][0][n].view(np.uint32), got[True][0][n].view(np.uint32)), n
        assert np.array_equal(got[False][1][n].view(np.uint32), got[True][1][n].view(np.uint32)), n
