"""The f16 precision's kernels against their twins (tinygpt.reference.kernels), at ragged shapes:
WGSL's f16 where the adapter has the shader-f16 feature, and the one-line refusal where it has not
(make test runs this file on GL's llvmpipe, which lacks it)."""
import numpy as np
import pytest

from tinygpt.core.activations import ACTIVATIONS
from tinygpt.reference import kernels as R

from conftest import check
from tinygpt.model.spec import RunSpec, decoder_spec

pytestmark = pytest.mark.kernel
f64 = lambda a: np.asarray(a, np.float64)


@pytest.fixture
def f16(gpu):
    if "shader-f16" not in gpu.features:
        pytest.skip(f"{gpu.name} has no shader-f16 (test_refusal_without_shader_f16 covers it)")


def run(gpu, *ds):
    gpu.run(list(ds))


def half(gpu, x):
    """x (float32, any shape) as a flat f16 tensor of its packed words."""
    words = R.cast_f16(x)
    return gpu.tensor((words.size,), "f16", data=words)


@pytest.mark.parametrize("n", [1, 2, 7, 64 * 3 + 5, 4096 + 3])
def test_f16_casts_round_to_nearest_even(gpu, rng, n, kn, f16):
    """cast_f16 against its twin bit for bit (ties to even, signs, subnormals, inf past 65504, NaN),
    and cast_f16_to_f32 gives back exactly the f16 values."""
    x = (rng.standard_normal(n) * 2.0 ** rng.integers(-30, 20, n)).astype(np.float32)
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 65504.0, 65519.0, 65520.0, -1e6, 3e-8,
                        1.0 + 2.0 ** -11,                    # a tie: -> even 1.0
                        1.0 + 3 * 2.0 ** -11], np.float32)   # a tie -> up, to even
    x[:min(n, len(special))] = special[:min(n, len(special))]
    h = gpu.tensor((-(-n // 2),), "f16")
    back = gpu.tensor((n,))
    run(gpu, kn.cast_f16(gpu.upload(x), h, n), kn.cast_f16_to_f32(h, back, n))
    got_h, want_h = gpu.read(h), R.cast_f16(x)
    nan = np.isnan(R.cast_f16_to_f32(want_h, n))
    assert np.array_equal(np.isnan(R.cast_f16_to_f32(got_h, n)), nan)
    assert np.array_equal(got_h.view(np.uint16)[:n][~nan], want_h.view(np.uint16)[:n][~nan]), "cast_f16 differs from its twin"
    got = gpu.read(back)
    ref = R.cast_f16_to_f32(want_h, n)
    assert np.array_equal(got[~nan].view(np.uint32), ref[~nan].view(np.uint32))
    if n >= 12:
        assert list(ref[5:8]) == [65504.0, 65504.0, np.inf] and ref[8] == -np.inf
        assert ref[10] == 1.0 and ref[11] == np.float32(1.0 + 2.0 ** -9)
    fin = np.isfinite(x) & (np.abs(x) > 6.2e-5) & (np.abs(x) < 65504)      # f16's normal range
    rel = np.abs(ref[fin].astype(np.float64) - x[fin]) / np.abs(x[fin])
    print(f"f16 round trip n={n}: max relative error {rel.max() if rel.size else 0:.3e} (bound 2^-11, half an f16 ulp)")
    assert rel.size == 0 or rel.max() <= 2.0 ** -11


@pytest.mark.parametrize("M,N,K_,variant", [(1, 1, 1, "scalar"), (7, 5, 3, "scalar"), (33, 65, 17, "scalar"),
                                            (64, 96, 48, "scalar"), (13, 38, 70, "scalar"), (4, 4, 4, "vec4"),
                                            (1, 8, 12, "vec4"), (36, 52, 20, "vec4"), (100, 96, 48, "vec4"),
                                            (17, 200, 64, "vec4"), (12, 8, 4 * 7, "vec4"),
                                            (4, 4, 4, "sg"), (1, 8, 12, "sg"), (36, 52, 20, "sg"),
                                            (100, 96, 48, "sg"), (17, 200, 64, "sg"), (33, 36, 40, "sg"),
                                            (4, 4, 4, "tiled"), (1, 8, 12, "tiled"), (36, 52, 20, "tiled"),
                                            (17, 200, 64, "tiled"), (65, 132, 36, "tiled"),
                                            (100, 96, 48, "tiled 16x16x4x1x16"), (17, 200, 64, "tiled 8x8x4x2x8")])
def test_matmul_family_f16(gpu, rng, M, N, K_, variant, kn, f16):
    """Products in f16, sums in float32, against the twin that rounds each product to f16 and sums
    in float64: only the summation order differs, so the float32 kernels' tolerance. Every operand
    mix the model uses (float32 gradients rounded to f16 as read), out float32, += and f16. Every
    kernel: the scalar template (any shape); vec4, sg and the tiled template (K, N and, for A^T @ B,
    M multiples of 4; sg where the plan's check passed the subgroups; tiled with a 16 x 16 tile of
    BK 4 unless the case names one, so the shapes cross many tiles, edges and k-slices)."""
    from tinygpt.device.kernels import Kernels
    from tinygpt.device.plan import PORTABLE
    from tinygpt.device.planner import subgroups_ok
    if variant == "sg" and not subgroups_ok(gpu):
        pytest.skip("the sg kernels need subgroups that pass the plan's check")
    if variant.startswith("tiled"):
        tile = tuple(int(t) for t in variant.split()[1].split("x")) if " " in variant else (4, 2, 8, 1, 4)
        kn, variant = Kernels(gpu, PORTABLE.with_(matmul_tile=tile)), "tiled"
    atb = variant if variant == "scalar" or M % 4 == 0 else "scalar"    # A^T @ B: vec4 along M
    a = rng.standard_normal((M, K_)).astype(np.float32)
    b = rng.standard_normal((K_, N)).astype(np.float32)
    bias = rng.standard_normal(N).astype(np.float32)
    prev = rng.standard_normal((M, N)).astype(np.float32)
    out = gpu.tensor((M, N))
    tol = 8e-6 * np.sqrt(K_)
    A, B = half(gpu, a), half(gpu, b)
    run(gpu, kn.matmul(A, B, gpu.upload(bias), out, M, N, K_, variant=variant))
    check(f"{variant} matmul_f16 {M}x{N}x{K_}", gpu.read(out), R.matmul_f16(a, b, f64(bias)), tol)
    gpu.write(out, prev)
    run(gpu, kn.matmul(A, B, None, out, M, N, K_, accumulate=True, variant=variant))
    check(f"{variant} matmul_f16 (+=) {M}x{N}x{K_}", gpu.read(out), prev + R.matmul_f16(a, b), tol)
    run(gpu, kn.matmul(gpu.upload(a), B, None, out, M, N, K_, variant=variant))  # the head's dx: A float32
    check(f"{variant} matmul_f16 A float32 {M}x{N}x{K_}", gpu.read(out), R.matmul_f16(a, b), tol)
    if N % 2 == 0:                                                            # out f16: q, k, v, pre
        oh = gpu.tensor((M * N // 2,), "f16")
        run(gpu, kn.matmul(A, B, gpu.upload(bias), oh, M, N, K_, variant=variant))
        got = R.cast_f16_to_f32(gpu.read(oh), M * N).reshape(M, N)
        want = R.matmul_f16(a, b, f64(bias))
        check(f"{variant} matmul_f16 out f16 {M}x{N}x{K_}", got, want, tol, rtol=2.0 ** -11)
    bt = b.T.copy()
    BT = half(gpu, bt)
    run(gpu, kn.matmul_abt(A, BT, out, M, N, K_, variant=variant))
    check(f"{variant} matmul_abt_f16 {M}x{N}x{K_}", gpu.read(out), R.matmul_abt_f16(a, bt), tol)
    run(gpu, kn.matmul_abt(gpu.upload(a), BT, out, M, N, K_, variant=variant))  # dx = dy @ W^T: A float32
    check(f"{variant} matmul_abt_f16 A float32 {M}x{N}x{K_}", gpu.read(out), R.matmul_abt_f16(a, bt), tol)
    at = a.T.copy()
    AT = half(gpu, at)
    run(gpu, kn.matmul_atb(AT, gpu.upload(b), out, M, N, K_, variant=atb))  # dW = x^T @ dy: B float32
    check(f"{atb} matmul_atb_f16 B float32 {M}x{N}x{K_}", gpu.read(out), R.matmul_atb_f16(at, b), tol)
    gpu.write(out, prev)
    run(gpu, kn.matmul_atb(gpu.upload(at), B, out, M, N, K_, accumulate=True, variant=atb))   # dtok: A float32
    check(f"{atb} matmul_atb_f16 A float32 (+=) {M}x{N}x{K_}", gpu.read(out), prev + R.matmul_atb_f16(at, b), tol)


def test_matmul_f16_products_are_f16(gpu, kn, f16):
    """The twin's rule, seen on the device: a product past 65504 is inf even where the float32 sum
    would have been small, and one under f16's subnormals is 0; a float32 operand past 65504 reads
    as inf."""
    a = np.array([[300.0, 1e-4, 1.0]], np.float32)
    b = np.array([[300.0], [1e-4], [-1.0]], np.float32)
    out = gpu.tensor((1, 1))
    run(gpu, kn.matmul(half(gpu, a), half(gpu, b),
                           None, out, 1, 1, 3))
    assert np.isinf(gpu.read(out)[0, 0]) and np.isinf(R.matmul_f16(a, b)[0, 0])
    a[0, 0] = 1.0
    run(gpu, kn.matmul(half(gpu, a), half(gpu, b),
                           None, out, 1, 1, 3))
    assert gpu.read(out)[0, 0] == np.float32(R.matmul_f16(a, b)[0, 0]) == np.float32(300.0 - 1.0)  # 1e-8 -> 0
    run(gpu, kn.matmul(gpu.upload(np.array([[1e5, 0.0, 0.0]], np.float32)),
                           half(gpu, b), None, out, 1, 1, 3))
    assert np.isposinf(gpu.read(out)[0, 0])


@pytest.mark.parametrize("rows,C,rms", [(1, 4, False), (7, 12, False), (67, 64, False), (7, 12, True)])
def test_layernorm_forward_f16(gpu, rng, rows, C, rms, kn, f16):
    x = (rng.standard_normal((rows, C)) * 3 + 1).astype(np.float32)
    gb = rng.standard_normal((2, C)).astype(np.float32)
    y, stats = gpu.tensor((rows, C // 2), "f16"), gpu.tensor((2, rows))
    run(gpu, kn.layernorm_forward(gpu.upload(x), gpu.upload(gb[:1] if rms else gb), y, stats, rows, C, rms=rms))
    yw, mean, rstd = R.layernorm_forward(f64(x), f64(gb[0]), f64(gb[1]), rms=rms)
    got = R.unpack_f16(gpu.read(y))
    # f16 rounding of the float32 result: half an ulp of |y|, and the float32 arithmetic before it
    check(f"layernorm_forward_f16 {rows}x{C}", got, yw, 1e-5, rtol=2.0 ** -11 + 1e-6)
    check(f"layernorm_forward_f16 stats {rows}x{C}", gpu.read(stats), np.stack([mean, rstd]), 1e-5, rtol=1e-5)


@pytest.mark.parametrize("act", sorted(ACTIVATIONS))
@pytest.mark.parametrize("n", [4, 12, 64 * 16 + 4, 3 * 64 * 16])
def test_activation_f16(gpu, rng, n, kn, f16, act):
    """Every activation reading f16 (the same entry points, the f16 section), computing in float32:
    forward one f16 rounding of the float64 twin of the same f16 values, backward against the twin."""
    act = ACTIVATIONS[act]
    x = (rng.standard_normal(n) * 3).astype(np.float32)
    xh = R.cast_f16(x)
    X = gpu.tensor((n // 2,), "f16", data=xh)
    out, dx = gpu.tensor((n // 2,), "f16"), gpu.tensor((n,))
    dy = rng.standard_normal(n).astype(np.float32)
    run(gpu, kn.act_forward(act, X, out, n), kn.act_backward(act, X, gpu.upload(dy), dx, n))
    check(f"{act.name}_forward f16 n={n}", R.unpack_f16(gpu.read(out)), act.forward(R.unpack_f16(xh)), 2e-6,
          rtol=2.0 ** -11 + 1e-6)
    check(f"{act.name}_backward f16 n={n}", gpu.read(dx), R.stored_backward(act.backward, xh, f64(dy), "f16"), 2e-6,
          rtol=1e-5)


def test_refusal_without_shader_f16(gpu):
    """An adapter without shader-f16 gets one line naming the feature (GL's llvmpipe here)."""
    if "shader-f16" in gpu.features:
        pytest.skip(f"{gpu.name} has shader-f16 (the f16 kernels are tested above)")
    from tinygpt.core.precision import F16
    from tinygpt.model.record import precision_problem
    msg = precision_problem(gpu, F16)
    print(msg)
    assert msg and "shader-f16" in msg and "\n" not in msg


@pytest.mark.parametrize("opt", ["adamw", "lion", "muon"])
def test_an_absurd_loss_scale_halves_down_and_never_writes_a_bad_weight(gpu, f16, opt):
    """Training tiny in f16 from a loss scale of 2^40: the gradients overflow f16, so steps are
    skipped (the weights and moments untouched) and the scale halves each time, down to one that
    works within 40 steps (an overflow after steps taken halves it again); then the steps are
    taken, and no weight is ever inf or NaN."""
    from tinygpt.core.config import preset
    from tinygpt.core.init import init_params
    from tinygpt.core.precision import F16
    from tinygpt.device.planner import make_plan
    from tinygpt.model.gpt import Model
    cfg = preset("tiny", batch=4, ctx=16)
    from tinygpt.model.optimizers import make_settings
    m = Model(gpu, make_plan(gpu), RunSpec(cfg, "online", precision=F16, loss_scale=2.0 ** 40,
                                           optimizer=make_settings(opt)))
    params = init_params(cfg)
    m.set_params(params)
    rng = np.random.default_rng(0)
    x = rng.integers(0, cfg.vocab, (cfg.batch, cfg.ctx)).astype(np.uint32)
    y = np.roll(x, -1, axis=1)
    seen = []
    for step in range(40):
        m.step(x, y, 1e-3)
        s = m.gate_state()
        seen.append((s["scale"], int(s["skipped"]), int(s["taken"])))
        if step == 0:
            assert s["skip"] == 1 and s["scale"] == 2.0 ** 39, s
            assert all(np.array_equal(a, params[n]) for n, a in m.get_params().items()), "a skipped step moved a weight"
            state = m.get_opt_state()      # every optimizer's state as it started: zero
            assert not any(a.any() for row in state.values() for a in row.values()), "a skipped step moved its state"
        if s["taken"] >= 5:
            break
    print("scale, skipped, taken per step:", seen)
    skipped = seen[-1][1]
    assert s["taken"] >= 5, f"still skipping after 40 steps: {seen[-1]}"
    assert 1 <= skipped <= 35 and seen[-1][0] <= 2.0 ** (40 - skipped)
    prev = (2.0 ** 40, 0, 0)
    for now in seen:             # each skip halves the scale; each step taken keeps it (2000 to growth)
        skip = now[1] - prev[1]
        assert skip + now[2] - prev[2] == 1 and now[0] == prev[0] * (0.5 if skip else 1.0), (prev, now)
        prev = now
    assert all(np.all(np.isfinite(a)) for a in m.get_params().values())
    assert m.loss() < np.log(cfg.vocab) + 0.5


def test_the_numerics_check_judges_every_f16_kernel_a_model_uses(gpu, f16, monkeypatch):
    """Building an f16 model (or decoder) runs each f16 kernel it recorded once against its twin
    (passing here); a kernel whose twin disagrees (the twin made wrong, as a broken driver would
    look) is refused in one line naming it, and so is one that fails to run."""
    from tinygpt.core.config import preset
    from tinygpt.core.precision import F16
    from tinygpt.device import numerics
    from tinygpt.device.planner import make_plan
    from tinygpt.model.gpt import Model
    plan = make_plan(gpu)
    cfg = preset("tiny", batch=2, ctx=16)
    monkeypatch.setattr(numerics, "_VERDICTS", type(numerics._VERDICTS)())
    m = Model(gpu, plan, RunSpec(cfg, "online", precision=F16))
    judged = numerics._VERDICTS[gpu]
    print("judged:", sorted(judged, key=str))
    assert judged and not any(judged.values())
    names = {e for e, _ in judged}
    assert {"cast_f16", "layernorm_forward4", "gelu_forward", "gelu_backward"} <= names
    assert any(e.startswith("matmul_abt_f16") for e in names) and any(e.startswith("matmul_atb_f16") for e in names)
    assert ("attention", "sg") in judged or plan.attention != "sg"
    from tinygpt.model.decode import Decoder
    Decoder(gpu, plan.with_(decode="cache"), decoder_spec(cfg, precision=F16), capacity=8)     # its step's kernels too
    assert ("decode", ()) in numerics._VERDICTS[gpu] and not numerics._VERDICTS[gpu][("decode", ())]
    used = numerics.half_kernels(m.graph.fwd + m.graph.bwd + m.graph.opt)
    monkeypatch.setattr(numerics, "_VERDICTS", type(numerics._VERDICTS)())
    monkeypatch.setattr(numerics.R, "matmul_atb_f16", lambda a, b, out_f16=False: np.zeros((a.shape[1], b.shape[1])))
    with pytest.raises(numerics.NumericsError) as e:
        numerics.check(gpu, plan, used)
    print(e.value)
    assert "the kernel matmul_atb_f16" in str(e.value) and "disagrees with its NumPy twin" in str(e.value)
    assert "\n" not in str(e.value) and "bf16 or fp32" in str(e.value)
    monkeypatch.setattr(numerics, "_VERDICTS", type(numerics._VERDICTS)())
    monkeypatch.setattr(numerics, "_elementwise", lambda *a: (_ for _ in ()).throw(numerics.GPUError("no pipeline")))
    with pytest.raises(numerics.NumericsError, match="it does not run here: no pipeline"):
        numerics.check(gpu, plan, used)


def test_a_precision_with_a_feature_finds_its_kernels_and_refuses_one_it_cannot_check(gpu, monkeypatch):
    """Issue 48: the gate finds a precision's kernels by the dtype they bind, not by f16's names,
    so a new precision that needs a device feature is never trusted unjudged: bf16 as if it needed
    one, every bf16 kernel a model recorded is found, and the first the gate has no check for is
    refused in one line (it was a KeyError)."""
    from tinygpt.core.config import preset
    from tinygpt.core.precision import BF16
    from tinygpt.device import numerics
    from tinygpt.device.planner import make_plan
    from tinygpt.model.gpt import Model
    plan = make_plan(gpu)
    m = Model(gpu, plan, RunSpec(preset("tiny", batch=2, ctx=16), "naive", precision=BF16))
    found = numerics.half_kernels(m.graph.fwd + m.graph.bwd + m.graph.opt + m.graph.copy_weights, BF16.stored)
    names = {e for e, _ in found}
    print(sorted(names))
    assert {"layernorm_forward4", "gelu_forward", "gelu_backward"} <= names
    assert any(n.startswith("matmul") for n in names) and any(n.startswith("cast_bf16") for n in names)
    monkeypatch.setattr(numerics, "_VERDICTS", type(numerics._VERDICTS)())
    with pytest.raises(numerics.NumericsError) as e:
        numerics.check(gpu, plan, {("cast_bf16", ())}, "bf16")
    print(e.value)
    assert "the kernel cast_bf16 has no case in the numerics check" in str(e.value)
    # the activations' and the norm's entry points are named as f16's are: never judged by f16's cases
    with pytest.raises(numerics.NumericsError, match="the kernel gelu_forward has no case"):
        numerics.check(gpu, plan, {("gelu_forward", ()), ("layernorm_forward4", ())}, "bf16")
    assert "\n" not in str(e.value)


def test_the_numerics_check_runs_every_f16_matmul_and_mix(gpu, f16):
    """Every matmul entry point the gate may meet (the scalar and tiled templates with f16 products,
    the latter with a tile's constants; vec4 and, with working subgroups, sg; each operand mix and
    out f16), judged directly: each passes on this device."""
    from tinygpt.device import numerics
    from tinygpt.device.planner import make_plan, subgroups_ok
    variants = ("_quad_vec4",) + (("_quad_sg",) if subgroups_ok(gpu) else ())
    ab = (("A_HALF", True), ("B_HALF", True))       # every template names the half operands
    template_mixes = [ab, ab[1:], ab[:1], ab + (("OUT_HALF", True),)]
    kernels = {(f"{e}_f16{v}", m) for e in ("matmul", "matmul_abt", "matmul_atb") for v in variants
               for m in template_mixes}
    tile = (("BK", 4), ("TM", 8), ("TV", 1), ("WX", 4), ("WY", 2))     # 16 x 16: the ragged shape crosses tiles
    kernels |= {(f"{e}_f16{v}", tuple(sorted(m + (tile if v else ())))) for e in ("matmul", "matmul_abt", "matmul_atb")
                for v in ("", "_tiled") for m in template_mixes}
    kernels |= {(e, ()) for e in ("cast_f16", "cast_f16_to_f32", "layernorm_forward4", "kv_append")}
    kernels |= {(f"{a}_{way}", ()) for a in ACTIVATIONS for way in ("forward", "backward")}   # every activation
    kernels |= {("attn_online_forward", (("F16", True),))}           # online.wgsl, the tiles, reading f16
    kernels |= {(e, (("F16", True),)) for e in ("rope_forward", "rope_backward", "qk_norm_rope")}  # q, k stored f16
    kernels |= {("kv_expand", ())} | {(e, (("F16", True),)) for e in ("swiglu_forward", "swiglu_backward")}
    numerics.check(gpu, make_plan(gpu), kernels)
    judged = numerics._VERDICTS[gpu]
    print(f"{len(kernels)} kernels judged: every one agrees with its twin")
    assert all(judged[(e, m)] is None for e, m in kernels if (e, m) in judged) and ("decode", ()) in judged
    assert judged[("attention", "tiles")] is None
