"""Every training kernel against the float64 reference on random inputs, at
awkward shapes (one row, 7 rows, sizes not multiples of the workgroup or tile)."""
import re

import numpy as np
import pytest

from tinygpt.device import kernels as K
from tinygpt.device.gpu import Tensor
from tinygpt.device.kernels import Kernels
from tinygpt.device.plan import tile_problem
from tinygpt.device.planner import subgroups_ok
from tinygpt.reference import kernels as R
from tinygpt.core.config import ADAMW_BETA1, ADAMW_BETA2, ADAMW_EPS
from tinygpt.core.activations import ACTIVATIONS
from tinygpt.core.init import token_buckets
from tinygpt.core.rope import rope_table
from tinygpt.model.optimizers import KINDS as OPTIMIZERS
from tinygpt.model.optimizers.base import ElementwiseOptimizer
from tinygpt.model.optimizers.muon import muon_ratio, newton_schulz, newton_schulz_twin

from conftest import check

ELEMENTWISE = [k for k, room in OPTIMIZERS.items() if issubclass(room, ElementwiseOptimizer)]
ns_twin = lambda x: newton_schulz_twin(R, x)

pytestmark = pytest.mark.kernel
f64 = lambda a: np.asarray(a, np.float64)


def run(gpu, *dispatches):
    gpu.run(list(dispatches))


def mm_inputs(gpu, rng, M, N, K_):
    """a [M,K], b [K,N], bias [N], prev [M,N] (what += adds to), out, and the tolerance 8e-6 sqrt(K)."""
    a = rng.standard_normal((M, K_)).astype(np.float32)
    b = rng.standard_normal((K_, N)).astype(np.float32)
    bias = rng.standard_normal(N).astype(np.float32)
    prev = rng.standard_normal((M, N)).astype(np.float32)
    return a, b, bias, prev, gpu.tensor((M, N)), 2e-6 * np.sqrt(K_) * 4


@pytest.mark.parametrize("M,N,K_,variant", [(1, 1, 1, "scalar"), (7, 5, 3, "scalar"), (33, 65, 17, "scalar"),
                                            (64, 96, 48, "scalar"), (130, 37, 200, "scalar"),
                                            (4, 4, 4, "vec4"), (1, 8, 12, "vec4"), (36, 52, 20, "vec4"),
                                            (100, 96, 48, "vec4"), (17, 200, 64, "vec4")])
def test_matmul_family(gpu, rng, M, N, K_, variant, kn):
    a, b, bias, prev, out, tol = mm_inputs(gpu, rng, M, N, K_)
    atb = variant if variant == "scalar" or M % 4 == 0 else "scalar"  # vec4 A^T @ B also needs M % 4 == 0
    run(gpu, kn.matmul(gpu.upload(a), gpu.upload(b), gpu.upload(bias), out, M, N, K_, variant=variant))
    check(f"matmul {variant} {M}x{N}x{K_}", gpu.read(out), R.matmul(f64(a), f64(b), f64(bias)), tol)
    run(gpu, kn.matmul_abt(gpu.upload(a), gpu.upload(b.T.copy()), out, M, N, K_, variant=variant))
    check(f"matmul_abt {variant} {M}x{N}x{K_}", gpu.read(out), R.matmul_abt(f64(a), f64(b.T)), tol)
    gpu.write(out, prev)
    run(gpu, kn.matmul_atb(gpu.upload(a.T.copy()), gpu.upload(b), out, M, N, K_, accumulate=True, variant=atb))
    check(f"matmul_atb {atb} (+=) {M}x{N}x{K_}", gpu.read(out), prev + R.matmul_atb(f64(a.T), f64(b)), tol)


TILES = [(16, 16, 4, 1, 16),    # the default: 64 x 64, 256 invocations
         (8, 8, 4, 2, 8),       # 32 x 64, two vec4 columns per invocation, BK 8
         (4, 2, 8, 1, 4)]       # 16 x 16: small enough that the test shapes cover many tiles and edges


@pytest.mark.parametrize("tile", TILES)
@pytest.mark.parametrize("M,N,K_", [(4, 4, 4), (1, 8, 12), (36, 52, 20), (100, 96, 48), (17, 200, 64),
                                    (65, 132, 36), (128, 64, 4)])
def test_matmul_family_tiled(gpu, rng, M, N, K_, tile):
    """matmul_tiled.wgsl at ragged shapes: M, N, K not multiples of the tile (N and K of 4)."""
    from tinygpt.device.plan import PORTABLE
    why = tile_problem(gpu.limits, tile)
    if why:
        pytest.skip(why)
    kn = Kernels(gpu, PORTABLE.with_(matmul_tile=tile))
    a, b, bias, prev, out, tol = mm_inputs(gpu, rng, M, N, K_)
    run(gpu, kn.matmul(gpu.upload(a), gpu.upload(b), gpu.upload(bias), out, M, N, K_, variant="tiled"))
    check(f"matmul tiled {tile} {M}x{N}x{K_}", gpu.read(out), R.matmul_tiled(f64(a), f64(b), f64(bias)), tol)
    gpu.write(out, prev)
    run(gpu, kn.matmul_abt(gpu.upload(a), gpu.upload(b.T.copy()), out, M, N, K_, accumulate=True,
                          variant="tiled"))
    check(f"matmul_abt tiled (+=) {M}x{N}x{K_}", gpu.read(out), prev + R.matmul_abt_tiled(f64(a), f64(b.T)), tol)
    if M % 4 == 0:
        run(gpu, kn.matmul_atb(gpu.upload(a.T.copy()), gpu.upload(b), out, M, N, K_, variant="tiled"))
        check(f"matmul_atb tiled {M}x{N}x{K_}", gpu.read(out), R.matmul_atb_tiled(f64(a.T), f64(b)), tol)


def test_tile_limits_are_the_devices(gpu):
    """A tile over the device's workgroup memory or invocations is refused with the reason."""
    assert tile_problem(gpu.limits, (16, 16, 4, 1, 16)) is None
    assert "invocations" in tile_problem(gpu.limits, (64, 64, 4, 1, 16))
    assert "workgroup memory" in tile_problem(gpu.limits, (16, 16, 8, 2, 1024))   # 1 MiB
    assert "multiples of 4" in tile_problem(gpu.limits, (16, 16, 4, 1, 6))


def need_subgroups(gpu):
    if not subgroups_ok(gpu):
        pytest.skip(f"no working subgroups on {gpu.name} ({gpu.backend})")


@pytest.mark.parametrize("M,N,K_", [(4, 4, 4), (1, 8, 12), (36, 52, 20), (100, 96, 48), (17, 200, 64), (40, 36, 1028),
                                    (33, 64, 8), (20, 240, 36), (18, 288, 12), (18, 92, 12),
                                    (64, 96, 20), (62, 64, 12), (96, 240, 36)])  # 32 rows per workgroup
def test_matmul_family_sg(gpu, rng, M, N, K_, kn):
    need_subgroups(gpu)
    # column blocks per lane: 2 where 16-column blocks fill N/4 but for 1/8 (64, 240, 288),
    # else 3 where 24-column ones do (96, 92), else 1
    assert K.sg_blocks(N) == {64: 2, 240: 2, 288: 2, 96: 3, 92: 3}.get(N, 1)
    # rows per workgroup: 32 where M wastes at most 1/8 of them, with at most 2 blocks
    assert K.sg_tile(M, N) == ((32, min(2, K.sg_blocks(N, most=2))) if M in (64, 62, 96) else (16, K.sg_blocks(N)))
    a, b, bias, prev, out, tol = mm_inputs(gpu, rng, M, N, K_)
    run(gpu, kn.matmul(gpu.upload(a), gpu.upload(b), gpu.upload(bias), out, M, N, K_, variant="sg"))
    check(f"matmul sg {M}x{N}x{K_}", gpu.read(out), R.matmul_sg(f64(a), f64(b), f64(bias)), tol)
    gpu.write(out, prev)
    run(gpu, kn.matmul_abt(gpu.upload(a), gpu.upload(b.T.copy()), out, M, N, K_, accumulate=True, variant="sg"))
    check(f"matmul_abt sg (+=) {M}x{N}x{K_}", gpu.read(out), prev + R.matmul_abt_sg(f64(a), f64(b.T)), tol)
    if M % 4 == 0:  # A^T @ B reads A's rows as vec4; K need not be a multiple of 4 (4 k per step, zeros past K)
        for k in (K_, K_ - 1, K_ - 3):
            run(gpu, kn.matmul_atb(gpu.upload(a[:, :k].T.copy()), gpu.upload(b[:k]), out, M, N, k, variant="sg"))
            check(f"matmul_atb sg {M}x{N}x{k}", gpu.read(out), R.matmul_atb_sg(f64(a[:, :k].T), f64(b[:k])), tol)


def batched(gpu, mats, fill=np.nan):
    """A tensor holding `mats` (each [rows, cols]) K.batch_stride apart, the padding set to fill."""
    n = mats[0].size
    stride = K.batch_stride(n)
    flat = np.full(stride * len(mats), fill, np.float32)
    for j, m in enumerate(mats):
        flat[j * stride:j * stride + n] = m.reshape(-1)
    return gpu.upload(flat)


def unbatched(gpu, t, count, shape):
    """The matrices of a batched tensor, and its padding."""
    flat, n = gpu.read(t).reshape(-1), int(np.prod(shape))
    stride = K.batch_stride(n)
    mats = np.stack([flat[j * stride:j * stride + n].reshape(shape) for j in range(count)])
    pad = np.concatenate([flat[j * stride + n:(j + 1) * stride] for j in range(count)])
    return mats, pad


@pytest.mark.parametrize("variant", ["scalar", "vec4", "sg", "tiled"])
@pytest.mark.parametrize("M,N,K_,batch", [(7, 5, 3, 3), (12, 20, 8, 2), (36, 52, 20, 3), (33, 96, 12, 4)])
def test_matmul_batched(gpu, rng, kn, variant, M, N, K_, batch):
    """`batch` products in one dispatch (Muon's Newton-Schulz), each operand's matrices
    batch_stride apart: each product is its own matrices' (the twins' batched form), += adds into
    each, and the padding between them (NaN) is neither read nor written."""
    if variant == "sg":
        need_subgroups(gpu)
    if variant != "scalar" and (N % 4 or K_ % 4):
        pytest.skip("the vec4 families need N and K multiples of 4")
    a, b, prev = (rng.standard_normal((batch,) + s).astype(np.float32) for s in ((M, K_), (K_, N), (M, N)))
    tol = 2e-6 * np.sqrt(K_) * 4
    out = batched(gpu, list(prev))
    run(gpu, kn.matmul(batched(gpu, list(a)), batched(gpu, list(b)), None, out, M, N, K_, variant=variant,
                       batch=batch))
    got, pad = unbatched(gpu, out, batch, (M, N))
    check(f"matmul {variant} batch {batch} {M}x{N}x{K_}", got, R.matmul(f64(a), f64(b)), tol)
    assert np.isnan(pad).all()
    bt = np.swapaxes(b, 1, 2).copy()
    run(gpu, kn.matmul_abt(batched(gpu, list(a)), batched(gpu, list(bt)), out, M, N, K_, accumulate=True,
                           variant=variant, batch=batch))
    got, pad = unbatched(gpu, out, batch, (M, N))
    check(f"matmul_abt {variant} (+=) batch {batch} {M}x{N}x{K_}", got,
          f64(R.matmul(f64(a), f64(b))) + R.matmul_abt(f64(a), f64(bt)), 2 * tol)
    assert np.isnan(pad).all()
    if variant == "scalar" or M % 4 == 0:
        at = np.swapaxes(a, 1, 2).copy()
        run(gpu, kn.matmul_atb(batched(gpu, list(at)), batched(gpu, list(b)), out, M, N, K_, variant=variant,
                               batch=batch))
        got, pad = unbatched(gpu, out, batch, (M, N))
        check(f"matmul_atb {variant} batch {batch} {M}x{N}x{K_}", got, R.matmul_atb(f64(at), f64(b)), tol)
        assert np.isnan(pad).all()


def test_subgroups_used_on_lavapipe(gpu):
    """The sg kernels are the CPU adapter's fast path: losing them silently would cost 2-3x
    (matmul) and 3-15x (online attention)."""
    if not ("llvmpipe" in gpu.name and gpu.backend == "Vulkan"):
        pytest.skip("lavapipe only")
    if "128 bits" in gpu.name:    # 4-lane subgroups, which the sg kernels' lane indexing cannot take: refused
        assert not subgroups_ok(gpu)    # (this passed at 4 lanes only while Mesa's cache handed it 8-lane code)
        pytest.skip("lavapipe at 128 bits has 4-lane subgroups: the planner's check refuses them (asserted)")
    from tinygpt.device.planner import make_plan
    assert "subgroup" in gpu.features and subgroups_ok(gpu)
    plan = make_plan(gpu, tuning={})
    assert (plan.matmul, plan.attention, plan.loss, plan.reduce) == ("sg",) * 4 and plan.subgroups == "ok"
    assert K.matmul_variant(plan, "matmul_atb", 64, 64, 64) == "sg"
    assert K.matmul_variant(plan, "matmul", 64, 62, 64) == "scalar"  # N not a multiple of 4
    assert K.online_variant(plan, 1024, 64) == "sg"
    assert K.online_variant(plan, 30000, 128) == "tiles"  # past llvmpipe's loop cap for online_sg.wgsl


def test_no_subgroups_switch():
    """TINYGPT_NO_SUBGROUPS=1 leaves the feature off: every kernel family takes its other set."""
    import os
    import subprocess
    import sys
    code = ("from tinygpt.device.gpu import GPU; from tinygpt.device import kernels as K; "
            "from tinygpt.device.planner import make_plan, subgroups_ok; g = GPU(); p = make_plan(g); "
            "print('subgroup' in g.features, subgroups_ok(g), K.matmul_variant(p, 'matmul', 64, 64, 64), "
            "K.online_variant(p, 64, 32), p.loss, p.reduce)")
    env = dict(os.environ, TINYGPT_NO_SUBGROUPS="1")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.stdout.split() == ["False", "False", "vec4", "tiles", "scalar", "scalar"], out.stderr[-500:]
    # forcing a subgroup variant there is refused with the reason
    r = subprocess.run([sys.executable, "-m", "tinygpt", "eval", "--model", "x.tinygpt", "--kernels", "matmul=sg"],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode != 0 and "no such file" in r.stderr  # the model is read first ...
    code = ("from tinygpt.device.gpu import GPU; from tinygpt.device.planner import make_plan\n"
            "try:\n    make_plan(GPU(), {'matmul': 'sg'})\nexcept Exception as e:\n    print(e)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert "matmul=sg needs working subgroups" in out.stdout, out.stderr[-500:]


@pytest.mark.parametrize("n", [1, 4, 63, 1000, 4100, 64 * 65535 + 5])  # multiples of 4 take the vec4 width
def test_elementwise(gpu, rng, n, kn):
    if n > 100000:  # only the folded (x, y) grid matters at this size: test add
        x, y = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
        out = gpu.tensor((n,))
        run(gpu, kn.add(gpu.upload(x), gpu.upload(y), out, n))
        check(f"add n={n} (2-D grid)", gpu.read(out), f64(x) + y, 1e-6)
        return
    x = (rng.standard_normal(n) * 3).astype(np.float32)
    dy = rng.standard_normal(n).astype(np.float32)
    tx, out = gpu.upload(x), gpu.tensor((n,))
    xg = x.copy()
    xg[:4] = [30.0, -30.0, 1e5, -1e5][:n]        # the tanh form's x^3 past float32's range: its clamp
    tg = gpu.upload(xg)
    for act in ACTIVATIONS.values():              # every activation's room: GELU's two forms, relu2, ...
        run(gpu, kn.act_forward(act, tg, out, n))
        check(f"{act.name}_forward n={n}", gpu.read(out), act.forward(f64(xg)), 5e-7, 1e-6)
        run(gpu, kn.act_backward(act, tg, gpu.upload(dy), out, n))
        check(f"{act.name}_backward n={n}", gpu.read(out), act.backward(f64(xg), f64(dy)), 5e-7, 1e-6)
    run(gpu, kn.add(tx, gpu.upload(dy), out, n))
    check(f"add n={n}", gpu.read(out), R.add(f64(x), f64(dy)), 1e-6)
    acc = gpu.upload(dy)
    run(gpu, kn.accumulate(tx, acc, n))                         # in place, twice
    run(gpu, kn.accumulate(tx, acc, n))
    check(f"accumulate n={n}", gpu.read(acc), R.accumulate(f64(x), R.accumulate(f64(x), f64(dy))), 2e-6)


@pytest.mark.parametrize("rows,cols", [(1, 1), (7, 65), (130, 3), (1, 4), (13, 96), (1030, 8)])  # cols % 4 == 0: sg
def test_bias_grad(gpu, rng, rows, cols, kn):
    # 1030 rows is the sg kernel's case (8 lanes each summing every 8th row, then subgroupAdd):
    # its error is that of 8 sums of ~130 rows combined, so the bound grows as sqrt(rows / 130)
    # from the 1e-5 that holds up to 130 rows. The scalar kernel adds rows one after another,
    # whose error grows about linearly (1.3e-4 at 1030 rows on GL): it keeps its tests to 130 rows.
    variant = None
    if rows > 130:
        need_subgroups(gpu)
        variant = "sg"
    dy = rng.standard_normal((rows, cols)).astype(np.float32)
    out = gpu.tensor((cols,))
    run(gpu, kn.bias_grad(gpu.upload(dy), out, rows, cols, variant=variant))
    check(f"bias_grad {rows}x{cols}", gpu.read(out), R.bias_grad(f64(dy)), 1e-5 * max(1.0, np.sqrt(rows / 130)))


@pytest.mark.parametrize("rows,C,rms", [(1, 5, False), (7, 48, False), (65, 97, False), (65, 4, False), (1, 96, False),
                                        (1030, 8, False), (1, 5, True), (7, 48, True), (65, 97, True), (1030, 8, True)])
def test_layernorm(gpu, rng, rows, C, rms, kn):
    """LayerNorm, and RMSNorm (rms: no centring, no bias; g alone), at both widths (C % 4) and by
    subgroups (dgb past 65 rows)."""
    x = (rng.standard_normal((rows, C)) * 2 + 1).astype(np.float32)
    g, b = rng.standard_normal(C).astype(np.float32), rng.standard_normal(C).astype(np.float32)
    dy = rng.standard_normal((rows, C)).astype(np.float32)
    prev = rng.standard_normal((rows, C)).astype(np.float32)
    tx, y, stats = gpu.upload(x), gpu.tensor((rows, C)), gpu.tensor((2, rows))
    name = f"{'rmsnorm' if rms else 'layernorm'} {rows}x{C}"
    run(gpu, kn.layernorm_forward(tx, gpu.upload(g if rms else np.stack([g, b])), y, stats, rows, C, rms=rms))
    ry, rm, rr = R.layernorm_forward(f64(x), f64(g), f64(b), rms=rms)
    check(f"{name} forward y", gpu.read(y), ry, 1e-5)
    check(f"{name} forward mean|rstd", gpu.read(stats), np.stack([rm, rr]), 1e-5, 1e-5)
    dx = gpu.upload(prev)
    run(gpu, kn.layernorm_dx(gpu.upload(dy), tx, gpu.upload(g), stats, dx, rows, C, accumulate=True, rms=rms))
    check(f"{name} dx (+=)", gpu.read(dx), prev + R.layernorm_dx(f64(dy), f64(x), f64(g), rm, rr, rms=rms), 2e-5)
    # dgb sums over rows. Past 65 rows only the sg kernel (8 interleaved partial sums joined by
    # subgroupAdd) is checked, its bound growing as sqrt(rows / 65) from the 2e-5 that holds up to
    # 65 rows; the scalar kernel adds rows in order (error about linear in rows) and keeps to 65.
    if rows > 65 and not subgroups_ok(gpu):
        return
    sentinel = np.full((2, C), 7.0, np.float32)           # RMSNorm writes dg alone: the row after it stays
    dgb = gpu.upload(sentinel)
    run(gpu, kn.layernorm_dgb(gpu.upload(dy), tx, stats, dgb, rows, C, variant="sg" if rows > 65 else None,
                              rms=rms))
    dg, db = R.layernorm_dgb(f64(dy), f64(x), rm, rr, rms=rms)
    got, want = gpu.read(dgb), np.stack([dg, sentinel[1] if rms else db])
    check(f"{name} dgb", got, want, 2e-5 * max(1.0, np.sqrt(rows / 65)))


@pytest.mark.parametrize("rows,T,H,hd,offset,dtype", [(7, 7, 1, 4, 0, "f32"), (30, 10, 3, 12, 0, "f32"),
                                                      (5, 1, 2, 20, 37, "f32"), (130, 65, 2, 64, 0, "f32"),
                                                      (14, 7, 3, 12, 5, "bf16"), (14, 7, 3, 12, 5, "f16")])
def test_rope(gpu, rng, rows, T, H, hd, offset, dtype, kn):
    """RoPE in place on q or k as stored (float32, or 16-bit two to a word), forward and backward,
    against the float64 twin on the same float32 table (the float32 angles' own error, about the
    position times 2^-24 radians, is transformers' too: test_reference's); rows past T repeat
    positions (a batch), and a decode step's rows start at the cache's length (offset)."""
    C = H * hd
    x = rng.standard_normal((rows, C)).astype(np.float32)
    table = rope_table(T + offset, hd, 10000.0)
    exact = f64(table)
    cast, back, tol = {"f32": (lambda a: a, lambda w: w, 2e-6),
                       "bf16": (R.cast_bf16, lambda w: R.cast_f32(w, rows * C), 2.0 ** -8),
                       "f16": (R.cast_f16, R.unpack_f16, 2.0 ** -11)}[dtype]
    stored = cast(x)
    seen = back(stored).reshape(rows, C) if dtype != "f32" else x          # what the kernel reads
    for entry, twin in (("rope_forward", R.rope_forward), ("rope_backward", R.rope_backward)):
        t = gpu.tensor(np.shape(stored), dtype, data=stored) if dtype != "f32" else gpu.upload(x)
        run(gpu, getattr(kn.rope, entry)(gpu.upload(table), t, rows, T, C, hd, offset))
        got = back(gpu.read(t)).reshape(rows, C) if dtype != "f32" else gpu.read(t)
        want = twin(exact, f64(seen), T, hd, offset)
        check(f"{entry} {dtype} {rows}x{C} hd {hd} offset {offset}", got, want, 1e-6, tol)


@pytest.mark.parametrize("variant", ["vec4", "sg", "tiled"])
@pytest.mark.parametrize("M,H,hd,K_,T,offset", [(7, 1, 8, 4, 7, 0), (33, 3, 24, 20, 11, 0), (100, 2, 64, 48, 50, 3),
                                                (62, 2, 128, 12, 31, 0), (5, 1, 16, 8, 1, 37), (1, 5, 40, 36, 1, 9)])
def test_matmul_turned(gpu, rng, M, H, hd, K_, T, offset, variant):
    """The projections that write a rotary model's q and k, turned where they are stored
    (matmul_vec4.wgsl's and matmul_tiled.wgsl's turned kernels): x W + bias, and a LoRA's last
    product A @ B^T added to what out holds, against the float64 twins (the product, then
    rope_forward). Odd rows (past a workgroup's 16 or 32, or a tile's 64), one to five heads, hd 8
    to 128 (a tile of 64 columns holds 4 pairs of vec4 at hd 128, 32 at hd 8), rows repeating T
    positions, and a decode step's one row at an offset. Where no turned form exists (hd not a
    multiple of 8, the scalar plan, a 16-bit q) the launcher says so with None."""
    from tinygpt.device.plan import KernelPlan
    if variant == "sg":
        need_subgroups(gpu)
    kn = Kernels(gpu, KernelPlan(matmul=variant, subgroups="ok" if variant == "sg" else "not checked"))
    N = H * hd
    a, b, bias, prev, out, tol = mm_inputs(gpu, rng, M, N, K_)
    table = rope_table(T + offset, hd, 10000.0)
    t_table = gpu.upload(table)
    d = kn.matmul_turned("matmul", gpu.upload(a), gpu.upload(b), gpu.upload(bias), out, M, N, K_, False, t_table, T,
                         hd, offset)
    assert d.kernel.name == f"matmul_rope_{variant}"
    run(gpu, d)
    want = getattr(R, f"matmul_rope_{variant}")(f64(a), f64(b), f64(bias), f64(table), T, hd, offset)
    check(f"matmul_rope_{variant} {M}x{N}x{K_} hd {hd} offset {offset}", gpu.read(out), want, tol)
    gpu.write(out, prev)
    run(gpu, kn.matmul_turned("matmul_abt", gpu.upload(a), gpu.upload(b.T.copy()), None, out, M, N, K_, True,
                              t_table, T, hd, offset))
    want = getattr(R, f"matmul_abt_rope_{variant}")(f64(a), f64(b.T), f64(table), T, hd, offset, f64(prev))
    check(f"matmul_abt_rope_{variant} (+=) {M}x{N}x{K_} hd {hd}", gpu.read(out), want, tol)
    half = gpu.tensor((M, N), "bf16")
    assert kn.matmul_turned("matmul", gpu.upload(a), gpu.upload(b), None, half, M, N, K_, False, t_table, T, hd) is None
    assert kn.matmul_turned("matmul", gpu.upload(a), gpu.upload(b[:, :N - 4].copy()), None, out, M, N - 4, K_,
                            False, t_table, T, hd - 4) is None
    scalar = Kernels(gpu, KernelPlan(matmul="scalar"))
    assert scalar.matmul_turned("matmul", gpu.upload(a), gpu.upload(b), None, out, M, N, K_, False, t_table, T,
                                hd) is None


@pytest.mark.parametrize("rows,T,H,hd,offset,dtype", [(7, 7, 1, 4, 0, "f32"), (30, 10, 3, 12, 0, "f32"),
                                                      (5, 1, 2, 20, 37, "f32"), (65, 65, 2, 64, 0, "f32"),
                                                      (14, 7, 3, 12, 5, "bf16"), (14, 7, 3, 12, 5, "f16")])
def test_qk_norm_rope(gpu, rng, rows, T, H, hd, offset, dtype, kn):
    """QK-norm and RoPE in one pass (the float32 projection normed per head, turned, written as stored
    and rounded once), against the float64 twin: the statistics QK-norm's backward reads, and the turned
    values within one rounding of what is stored."""
    if dtype == "f16" and "shader-f16" not in gpu.features:
        pytest.skip(f"{gpu.name} has no shader-f16")
    C = H * hd
    xr, gain = rng.standard_normal((rows, C)).astype(np.float32) * 3, rng.standard_normal(hd).astype(np.float32)
    table = rope_table(T + offset, hd, 10000.0)
    back, tol = {"f32": (lambda w: w, 2e-6), "bf16": (lambda w: R.cast_f32(w, rows * C), 2.0 ** -8),
                 "f16": (R.unpack_f16, 2.0 ** -11)}[dtype]
    x, stats = gpu.tensor((rows, C // 2 if dtype != "f32" else C), dtype), gpu.tensor((2, rows * H))
    run(gpu, kn.rope.qk_norm_rope(gpu.upload(table), gpu.upload(xr), gpu.upload(gain), x, stats, rows, T, C, hd, offset,
                             eps=1e-6))
    want, want_stats = R.qk_norm_rope(f64(table), f64(xr), f64(gain), T, hd, offset, eps=1e-6)
    check(f"qk_norm_rope stats {rows}x{C} hd {hd}", gpu.read(stats), want_stats, 1e-6, 1e-6)
    check(f"qk_norm_rope {dtype} {rows}x{C} hd {hd} offset {offset}", back(gpu.read(x)).reshape(rows, C), want,
          1e-6 * np.abs(want).max(), tol)


@pytest.mark.parametrize("rows,T,H,hd,offset", [(7, 7, 1, 4, 0), (30, 10, 3, 12, 0), (5, 1, 2, 20, 37),
                                                (65, 65, 2, 64, 0)])
def test_qk_norm_rope_dx(gpu, rng, rows, T, H, hd, offset, kn):
    """qk_norm_rope's backward where the gain takes no gradient: dy turned back and through the RMSNorm,
    against the float64 twin on the statistics the forward wrote."""
    C = H * hd
    xr, gain = rng.standard_normal((rows, C)).astype(np.float32) * 3, rng.standard_normal(hd).astype(np.float32)
    dy = rng.standard_normal((rows, C)).astype(np.float32)
    table = rope_table(T + offset, hd, 10000.0)
    x, stats, dx = gpu.tensor((rows, C)), gpu.tensor((2, rows * H)), gpu.tensor((rows, C))
    t_table, t_xr, t_gain = gpu.upload(table), gpu.upload(xr), gpu.upload(gain)
    run(gpu, kn.rope.qk_norm_rope(t_table, t_xr, t_gain, x, stats, rows, T, C, hd, offset),
        kn.rope.qk_norm_rope_dx(t_table, gpu.upload(dy), t_xr, t_gain, stats, dx, rows, T, C, hd, offset))
    want = R.qk_norm_rope_dx(f64(table), f64(dy), f64(xr), f64(gain), f64(gpu.read(stats)), T, hd, offset)
    check(f"qk_norm_rope_dx {rows}x{C} hd {hd} offset {offset}", gpu.read(dx), want, 2e-6 * np.abs(want).max(), 1e-5)


@pytest.mark.parametrize("n,dtype", [(2, "f32"), (1030, "f32"), (64 * 2 * 3 + 2, "bf16"), (130, "f16")])
def test_swiglu(gpu, rng, n, dtype, kn):
    """SwiGLU, silu(gate) * up, reading gate and up as stored (float32, or 16-bit two to a word):
    forward within one rounding of the float64 twin on the same stored values, backward in float32."""
    if dtype == "f16" and "shader-f16" not in gpu.features:
        pytest.skip(f"{gpu.name} has no shader-f16")
    g, u = (rng.standard_normal(n) * 3).astype(np.float32), (rng.standard_normal(n) * 3).astype(np.float32)
    dy = rng.standard_normal(n).astype(np.float32)
    cast, back, tol = {"f32": (lambda a: a, lambda w: w, 0.0), "bf16": (R.cast_bf16, lambda w: R.cast_f32(w, n), 2.0 ** -8),
                       "f16": (R.cast_f16, R.unpack_f16, 2.0 ** -11)}[dtype]
    stored = lambda a: gpu.tensor(np.shape(cast(a)), dtype, data=cast(a)) if dtype != "f32" else gpu.upload(a)
    gs, us = stored(g), stored(u)
    out = gpu.tensor((n // 2,), dtype) if dtype != "f32" else gpu.tensor((n,))
    dg, du = gpu.tensor((n,)), gpu.tensor((n,))
    run(gpu, kn.swiglu_forward(gs, us, out, n), kn.swiglu_backward(gs, us, gpu.upload(dy), dg, du, n))
    gv, uv = (f64(back(cast(a))) for a in (g, u))
    check(f"swiglu_forward {dtype} n={n}", f64(back(gpu.read(out))), R.swiglu_forward(gv, uv), 2e-6, tol + 1e-6)
    want_g, want_u = R.swiglu_backward(gv, uv, f64(dy))
    check(f"swiglu_backward {dtype} n={n} dgate", gpu.read(dg), want_g, 2e-6, 1e-5)
    check(f"swiglu_backward {dtype} n={n} dup", gpu.read(du), want_u, 2e-6, 1e-5)


@pytest.mark.parametrize("rows,H,KV,hd,dtype", [(1, 1, 1, 4, "f32"), (7, 6, 2, 12, "f32"), (65, 9, 3, 20, "f32"),
                                                (13, 4, 1, 8, "bf16"), (13, 6, 3, 4, "f16")])
def test_kv_expand_and_reduce(gpu, rng, rows, H, KV, hd, dtype, kn):
    """Grouped-query attention's moves: kv_expand copies each kv head to its H/KV query heads bit for
    bit, as stored (16-bit values moved as words); kv_reduce sums them back in float32."""
    x = rng.standard_normal((rows, KV * hd)).astype(np.float32)
    packed = np.reshape({"f32": x, "bf16": R.cast_bf16(x), "f16": R.cast_f16(x)}[dtype], (rows, -1))
    src = gpu.tensor(np.shape(packed), dtype, data=packed) if dtype != "f32" else gpu.upload(x)
    words = H * hd // (1 if dtype == "f32" else 2)
    out = gpu.tensor((rows, words), dtype)
    run(gpu, kn.kv_expand(src, out, rows, H, KV, hd))
    got, want = gpu.read(out), R.kv_expand(np.asarray(packed), H, KV)
    assert np.array_equal(got.view(np.uint32), np.ascontiguousarray(want).view(np.uint32)), "kv_expand, bit for bit"
    dy = rng.standard_normal((rows, H * hd)).astype(np.float32)
    dx = gpu.tensor((rows, KV * hd))
    run(gpu, kn.kv_reduce(gpu.upload(dy), dx, rows, H, KV, hd))
    check(f"kv_reduce {rows}x{H}/{KV} heads of {hd}", gpu.read(dx), R.kv_reduce(f64(dy), H, KV), 1e-6)


@pytest.mark.parametrize("B,T,C,V", [(1, 1, 3, 5), (2, 7, 65, 256), (3, 33, 8, 70)])
def test_embedding(gpu, rng, B, T, C, V, kn):
    tokens = rng.integers(0, V, (B, T)).astype(np.uint32)
    tok, pos = rng.standard_normal((V, C)).astype(np.float32), rng.standard_normal((T + 2, C)).astype(np.float32)
    dout = rng.standard_normal((B * T, C)).astype(np.float32)
    out = gpu.tensor((B, T, C))
    run(gpu, kn.embed_forward(gpu.upload(tokens), gpu.upload(tok), gpu.upload(pos), out, B, T, C))
    check(f"embed_forward {B}x{T}x{C} (bitwise vs f32)", gpu.read(out), R.embed_forward(tokens, tok, pos), 0)
    off, positions = token_buckets(tokens, V)
    prev = rng.standard_normal((V, C)).astype(np.float32)
    dtok, dpos = gpu.upload(prev), gpu.tensor((T, C))
    run(gpu, kn.embed_tok_grad(gpu.upload(np.concatenate([off, positions])), gpu.upload(dout), dtok, B, T, C, V),
        kn.embed_pos_grad(gpu.upload(dout), dpos, B, T, C))
    check(f"embed_tok_grad (+=) {B}x{T}x{C} V={V}", gpu.read(dtok), prev + R.embed_tok_grad(off, positions, f64(dout)), 1e-5)
    check(f"embed_pos_grad {B}x{T}x{C}", gpu.read(dpos), R.embed_pos_grad(f64(dout).reshape(B, T, C)), 1e-5)


@pytest.mark.parametrize("B,T,C,V,v0,n", [(2, 7, 65, 256, 64, 128), (3, 33, 8, 70, 64, 6), (1, 1, 3, 5, 0, 3)])
def test_embedding_bound_a_chunk_of_rows_at_a_time(gpu, rng, B, T, C, V, v0, n, kn):
    """A token table over one binding is bound rows v0 .. v0+n-1 at a time: embed_forward writes the
    positions holding those tokens and leaves the others; embed_tok_grad sums only those rows."""
    tokens = rng.integers(0, V, (B, T)).astype(np.uint32)
    tokens[0, 0] = v0 + n - 1                          # one position in the chunk, the last in another
    if B * T > 1:
        tokens[-1, -1] = v0 + n if v0 + n < V else 0
    tok, pos = rng.standard_normal((V, C)).astype(np.float32), rng.standard_normal((T, C)).astype(np.float32)
    prev = rng.standard_normal((B, T, C)).astype(np.float32)
    out = gpu.upload(prev)
    run(gpu, kn.embed_forward(gpu.upload(tokens), gpu.upload(tok[v0:v0 + n]), gpu.upload(pos), out, B, T, C, v0, n))
    want = R.embed_forward(tokens, tok[v0:v0 + n], pos, v0, out=prev)
    assert ((tokens >= v0) & (tokens < v0 + n)).any() and not np.array_equal(want, prev)
    check(f"embed_forward rows {v0}..{v0 + n - 1} of {V} (bitwise)", gpu.read(out), want, 0)
    off, positions = token_buckets(tokens, V)
    dout = rng.standard_normal((B * T, C)).astype(np.float32)
    dtok = gpu.tensor((n, C))
    run(gpu, kn.embed_tok_grad(gpu.upload(np.concatenate([off, positions])), gpu.upload(dout), dtok, B, T, C, V,
                              False, v0, n))
    check(f"embed_tok_grad rows {v0}..{v0 + n - 1} of {V}", gpu.read(dtok),
          R.embed_tok_grad(off, positions, f64(dout), v0, n), 1e-5)


@pytest.mark.parametrize("rows,cols,src_stride,src_col,out_stride,out_col",
                         [(1, 1, 1, 0, 3, 2), (5, 7, 7, 0, 20, 12), (64, 36, 100, 64, 36, 0), (3, 130, 131, 1, 260, 130)])
def test_copy_block(gpu, rng, rows, cols, src_stride, src_col, out_stride, out_col, kn):
    """embed.wgsl's copy_block: a column block of the logits into place and out again, the rest left as it was."""
    src = rng.standard_normal(rows * src_stride).astype(np.float32)
    prev = rng.standard_normal(rows * out_stride).astype(np.float32)
    out = gpu.upload(prev)
    run(gpu, kn.copy_block(gpu.upload(src), out, rows, cols, src_stride, src_col, out_stride, out_col))
    check(f"copy_block {rows}x{cols} ({src_stride}+{src_col} -> {out_stride}+{out_col})", gpu.read(out),
          R.copy_block(src, prev, rows, cols, src_stride, src_col, out_stride, out_col), 0)


@pytest.mark.parametrize("variant", ["default", "plain"])
@pytest.mark.parametrize("rows,V,stride,unscored", [(1, 5, 5, ()), (7, 256, 256, (0, 3)), (65, 1000, 1000, ()),
                                                    (9, 301, 304, (8,)), (3, 2, 4, (1,)), (2, 7, 8, (0, 1))])
def test_cross_entropy(gpu, rng, rows, V, stride, unscored, variant):
    """stride > V: rows padded (the vocabulary rounded up to 4); padding is skipped, its gradient 0.
    default: the device's plan (cross_entropy_sg where subgroups work and stride % 4 == 0); plain: loss.wgsl.
    unscored: rows whose target is UNSCORED (loss 0, gradient 0); the scales are recorded as 1/rows
    and rewritten to the mean over the scored rows (set_loss_scale), as a chat batch's are."""
    from tinygpt.core.config import UNSCORED
    from tinygpt.device.plan import PORTABLE
    from tinygpt.device.planner import make_plan
    kn = Kernels(gpu, make_plan(gpu, tuning={}) if variant == "default" else PORTABLE)
    padded = (rng.standard_normal((rows, stride)) * 3).astype(np.float32)
    logits = padded[:, :V]
    tgt = rng.integers(0, V, rows).astype(np.uint32)
    tgt[list(unscored)] = UNSCORED
    scale = 1.0 / max(1, rows - len(unscored))
    tl, losses, loss = gpu.upload(padded), gpu.tensor((rows,)), gpu.tensor((4,))
    ds = [kn.losses.cross_entropy(gpu.upload(tgt), tl, losses, rows, V, 1.0 / rows, stride=stride),
          kn.losses.loss_reduce(losses, loss, rows, 1.0 / rows)]
    for d in ds:
        kn.losses.set_loss_scale(d, scale)
    run(gpu, *ds)
    rl, rd = R.cross_entropy(tgt, f64(logits), scale)
    want = np.zeros((rows, stride))
    want[:, :V] = rd
    assert np.all(rl[list(unscored)] == 0) and np.all(rd[list(unscored)] == 0)
    check(f"cross_entropy losses {rows}x{V}, {len(unscored)} unscored", gpu.read(losses), rl, 5e-6, 1e-6)
    check(f"cross_entropy dlogits {rows}x{V} stride {stride}", gpu.read(tl), want, 1e-7, 1e-5)
    check(f"loss_reduce {rows}", gpu.read(loss)[0], R.loss_reduce(rl, scale), 5e-6, 1e-6)


@pytest.mark.parametrize("variant", ["scalar", "sg"])
@pytest.mark.parametrize("rows,V,stride,cap", [(1, 5, 8, 2.0), (9, 301, 304, 15.0), (4, 50, 52, 0.3)])
def test_softcap_and_the_capped_cross_entropy(gpu, rng, rows, V, stride, cap, variant):
    """softcap caps the logits in place (the padding's 0 stays 0); cross_entropy with SOFTCAP
    writes the gradient of the uncapped logits: the capped one times 1 - (y / cap)^2."""
    from tinygpt.device.planner import make_plan
    from tinygpt.device.plan import PORTABLE
    if variant == "sg" and make_plan(gpu, tuning={}).loss != "sg":
        pytest.skip(f"{gpu.name}: no subgroups for cross_entropy_sg")
    kn = Kernels(gpu, make_plan(gpu, tuning={}) if variant == "sg" else PORTABLE)
    padded = np.zeros((rows, stride), np.float32)
    padded[:, :V] = rng.standard_normal((rows, V)) * 3 * cap          # well into tanh's flat part
    tgt = rng.integers(0, V, rows).astype(np.uint32)
    tl, losses = gpu.upload(padded), gpu.tensor((rows,))
    run(gpu, kn.losses.softcap(tl, rows, stride, cap))
    capped = R.softcap(f64(padded), cap)
    check(f"softcap {rows}x{stride} at {cap:g}", gpu.read(tl), capped, 1e-6, 1e-6)
    run(gpu, kn.losses.cross_entropy(gpu.upload(tgt), tl, losses, rows, V, 1.0 / rows, stride=stride, variant=variant,
                              softcap=cap))
    rl, rd = R.cross_entropy(tgt, capped[:, :V], 1.0 / rows, cap)
    want = np.zeros((rows, stride))
    want[:, :V] = rd
    check(f"cross_entropy {variant} capped at {cap:g}: losses", gpu.read(losses), rl, 5e-6, 1e-6)
    check(f"cross_entropy {variant} capped at {cap:g}: the uncapped logits' gradient", gpu.read(tl), want, 1e-7, 1e-5)


def gate_words(state: dict) -> np.ndarray:
    words = np.zeros(K.GATE_FLOATS, np.float32)
    for key, i in K.GATE.items():
        words[i] = state[key]
    return words


# multiples of 4 take optim.wgsl's and grad_norm.wgsl's vec4 forms; first: the chunk's place in the
# partial sums and the decay table, which are bound whole (a model's later flat chunks start past 0)
@pytest.mark.parametrize("n,first", [(5, 0), (4096, 1), (4096 * 3 + 7, 2), (4096 * 3 + 8, 3)])
@pytest.mark.parametrize("opt", ELEMENTWISE)
def test_gate_and_elementwise_optimizers(gpu, rng, n, first, kn, opt):
    """grad_sumsq, grad_clip (the gate: norm, factor, skip 0, one more step taken), then every
    elementwise optimizer (its room's entry point in optim.wgsl's frame) against its twin; a
    negative decay marks blocks another optimizer updates (Muon's matrices), which must stay as
    they were."""
    room = OPTIMIZERS[opt]
    grads = rng.standard_normal(n).astype(np.float32)
    w, m, v = (rng.standard_normal(n).astype(np.float32) for _ in range(3))
    v = np.abs(v)
    nblk = -(-n // 256)
    wd = np.array([0.1, 0.0, -1.0])[np.arange(nblk) % 3].astype(np.float32)
    n_part = -(-n // K.CHUNK)
    # entries before `first` belong to other chunks: zeros in the partials (another chunk's are
    # added by grad_clip as these are), a decay the chunk must not read in the table
    state = {"norm": 0.0, "factor": 0.0, "scale": 0.0, "skip": 1, "clean": 0, "skipped": 0, "taken": 6}
    tg, parts, gate = gpu.upload(grads), gpu.tensor((first + n_part,)), gpu.upload(gate_words(state))
    table = gpu.upload(np.concatenate([np.full(first, 7.0, np.float32), wd]))
    tw, tm, tv = gpu.upload(w), gpu.upload(m), gpu.upload(v)
    u = gpu.uniform(K.OPTIM_UNIFORM_BYTES)
    lr, clip = 1e-2, 1.0
    consts = room.constants(room.settings())
    gpu.write_uniform(u, K.optim_uniform(n, lr, *consts, first=first))
    two = len(room.state_rows) > 1
    step = kn.optim.elementwise_optimizer(opt, room.wgsl, tg, table, gate, tw, tm, tv if two else None, n, u)
    run(gpu, kn.optim.grad_sumsq(tg, parts, n, first=first), kn.optim.grad_clip(parts, gate, first + n_part, clip), step)
    assert not gpu.read(parts)[:first].any()
    parts = Tensor(parts.buf, 4 * first, (n_part,))
    rparts = R.grad_sumsq(f64(grads))
    check(f"grad_sumsq n={n}", gpu.read(parts), rparts, 1e-3, 1e-5)
    R.grad_clip(rparts, clip, state)
    got = gpu.read(gate)
    for key, i in K.GATE.items():
        if key in ("norm", "factor", "skip", "taken"):
            assert got[i] == pytest.approx(state[key], rel=1e-6), key
    assert state["taken"] == 7 and state["skip"] == 0
    rw, rm, rv = f64(w), f64(m), f64(v)
    per = np.repeat(wd, 256)[:n].astype(np.float64)
    room.twin(f64(grads), per, state, rw, rm, rv, lr, *consts)
    theirs = per < 0
    assert np.array_equal(gpu.read(tw)[theirs], w[theirs]) and np.array_equal(gpu.read(tm)[theirs], m[theirs])
    check(f"{opt} w n={n}", gpu.read(tw), rw, 1e-6, 1e-5)
    check(f"{opt} m n={n}", gpu.read(tm), rm, 1e-7, 1e-5)
    check(f"{opt} v n={n}", gpu.read(tv), rv, 1e-7, 1e-5)


@pytest.mark.parametrize("n", [5, 4096 * 3 + 8])     # grad_norm.wgsl and optim.wgsl, scalar and vec4
@pytest.mark.parametrize("case", ["clean", "grows", "inf", "nan"])
def test_loss_scaler_kernels(gpu, rng, n, case, kn):
    """The loss scaler's forms (SCALED) of the gate against their twins, state and all: gradients
    carrying the scale 2^16 are unscaled in the norm; a clean step at the last clean count before
    `growth` doubles the scale; an inf or a NaN anywhere skips the step (every optimizer's w and
    state untouched), halves the scale, zeroes the clean count and counts the skip; AdamW's bias
    corrections count the steps taken."""
    S, growth = 65536.0, 5
    grads = (rng.standard_normal(n) * S).astype(np.float32)
    if case in ("inf", "nan"):
        grads[n // 2] = np.inf if case == "inf" else np.nan
    w, m, v = (rng.standard_normal(n).astype(np.float32) for _ in range(3))
    v = np.abs(v)
    wd = np.full(-(-n // 256), 0.1, np.float32)
    state = {"norm": 0.5, "factor": 0.0, "scale": S, "skip": 0, "clean": growth - 1 if case == "grows" else 1,
             "skipped": 3, "taken": 7}
    tg, gate, parts = gpu.upload(grads), gpu.upload(gate_words(state)), gpu.tensor((-(-n // K.CHUNK),))
    tw, tm, tv, lw, lm = gpu.upload(w), gpu.upload(m), gpu.upload(v), gpu.upload(w), gpu.upload(m)
    u = gpu.uniform(K.OPTIM_UNIFORM_BYTES)
    lr, clip = 1e-2, 1.0
    gpu.write_uniform(u, K.optim_uniform(n, lr, ADAMW_BETA1, ADAMW_BETA2, ADAMW_EPS))
    lion = OPTIMIZERS["lion"]
    lu = gpu.uniform(K.OPTIM_UNIFORM_BYTES)
    gpu.write_uniform(lu, K.optim_uniform(n, lr, *lion.constants(lion.settings())))
    run(gpu, kn.optim.grad_sumsq(tg, parts, n, gate=gate), kn.optim.grad_clip(parts, gate, parts.size, clip, growth=growth),
        kn.optim.elementwise_optimizer("adamw", OPTIMIZERS["adamw"].wgsl, tg, gpu.upload(wd), gate, tw, tm, tv, n, u),
        kn.optim.elementwise_optimizer("lion", lion.wgsl, tg, gpu.upload(wd), gate, lw, lm, None, n, lu))
    rparts = R.grad_sumsq(f64(grads), gate=state)
    check(f"grad_sumsq scaled {case} n={n}", gpu.read(parts), rparts, 1e-3, 1e-5)
    R.grad_clip(rparts, clip, gate=state, growth=growth)
    got = gpu.read(gate)
    print(case, {k: float(got[i]) for k, i in K.GATE.items()}, "twin:", state)
    for key, i in K.GATE.items():
        assert got[i] == pytest.approx(state[key], rel=1e-5, abs=1e-12), key
    assert state["scale"] == {"clean": S, "grows": 2 * S, "inf": S / 2, "nan": S / 2}[case]
    rw, rm, rv = f64(w), f64(m), f64(v)
    OPTIMIZERS["adamw"].twin(f64(grads), np.repeat(wd, 256)[:n].astype(np.float64), state, rw, rm, rv, lr,
                             ADAMW_BETA1, ADAMW_BETA2, ADAMW_EPS)
    if case in ("inf", "nan"):
        for t, a in ((tw, w), (tm, m), (tv, v), (lw, w), (lm, m)):
            assert np.array_equal(gpu.read(t), a)
    check(f"adamw scaled {case} w n={n}", gpu.read(tw), rw, 1e-6, 1e-5)
    check(f"adamw scaled {case} m n={n}", gpu.read(tm), rm, 1e-7, 1e-5)
    check(f"adamw scaled {case} v n={n}", gpu.read(tv), rv, 1e-7, 1e-5)


@pytest.mark.parametrize("K_,N", [(1, 1), (7, 13), (13, 7), (33, 33), (20, 84)])
@pytest.mark.parametrize("skip", [0, 1])
def test_muon_kernels(gpu, rng, kn, K_, N, skip):
    """Muon's kernels and its Newton-Schulz iterations (muon.newton_schulz: the plan's
    matmuls, a tall matrix worked on as its transpose) against their twins at odd shapes; a step
    the gate skips leaves the momentum and the weights as they were."""
    n, r = K_ * N, min(K_, N)
    g, m, w = (rng.standard_normal((K_, N)).astype(np.float32) for _ in range(3))
    state = {"norm": 1.0, "factor": 0.5, "scale": 1.0, "skip": skip, "clean": 0, "skipped": 0, "taken": 3}
    gate, tg, tm, tw = gpu.upload(gate_words(state)), gpu.upload(g), gpu.upload(m), gpu.upload(w)
    xs = [gpu.tensor((K_, N)), gpu.tensor((K_, N))]
    bx, A, AA, B = gpu.tensor((K_, N)), gpu.tensor((r, r)), gpu.tensor((r, r)), gpu.tensor((r, r))
    ns, out = newton_schulz(kn, xs, bx, A, AA, B, K_, N)
    u = gpu.uniform(16)
    lr, wd, ratio = 1e-2, 0.1, muon_ratio((K_, N))
    gpu.write_uniform(u, K.pack_uniform((0, lr, wd, 0)))
    # the momentum, then (as the model runs them) normalise + iterate, then the update
    run(gpu, kn.optim.muon_momentum(tg, gate, tm, xs[0], n, 0.95, True))
    got_u = gpu.read(xs[0])
    rm, ru = f64(m), np.zeros((K_, N))
    R.muon_momentum(f64(g), state, rm, ru, 0.95, True)
    if skip:
        assert np.array_equal(gpu.read(tm), m)
        gpu.write(xs[0], got_u := (rng.standard_normal((K_, N)).astype(np.float32)))
        ru = f64(got_u)
    else:
        check(f"muon_momentum m {K_}x{N}", gpu.read(tm), rm, 1e-7, 1e-6)
        check(f"muon_momentum u {K_}x{N}", got_u, ru, 1e-7, 1e-6)
    run(gpu, *ns)
    want = ns_twin(ru)
    check(f"newton_schulz {K_}x{N}", gpu.read(out), want, 2e-5, 1e-4)
    run(gpu, kn.optim.muon_update(out, gate, tw, n, ratio, u))
    rw = f64(w)
    R.muon_update(f64(gpu.read(out)), state, rw, lr, wd, ratio)
    if skip:
        assert np.array_equal(gpu.read(tw), w)
    check(f"muon_update {K_}x{N}", gpu.read(tw), rw, 1e-6, 1e-6)


@pytest.mark.parametrize("K_,N,batch", [(7, 13, 3), (13, 7, 2), (33, 33, 4), (20, 84, 2)])
def test_newton_schulz_batched(gpu, rng, kn, K_, N, batch):
    """Newton-Schulz over a batch of matrices of one shape (as Muon runs the blocks' matrices):
    each matrix is orthogonalised as it would be alone (the twin on each), normalised by its own
    norm, and the padding between them (NaN) is never read or written."""
    r = min(K_, N)
    # matrices far apart in size: a shared norm would show at once
    x = rng.standard_normal((batch, K_, N)).astype(np.float32) * (10.0 ** np.arange(batch))[:, None, None]
    xs = [batched(gpu, list(x)), batched(gpu, list(x * 0))]
    bx = batched(gpu, list(x * 0))
    A, AA, B = (batched(gpu, [np.zeros((r, r), np.float32)] * batch) for _ in range(3))
    ns, out = newton_schulz(kn, xs, bx, A, AA, B, K_, N, batch)
    run(gpu, *ns)
    got, pad = unbatched(gpu, out, batch, (K_, N))
    check(f"newton_schulz batch {batch} {K_}x{N}", got, ns_twin(f64(x)), 2e-5, 1e-4)
    for j in range(batch):
        check(f"newton_schulz batch {batch} {K_}x{N}: matrix {j} as alone", got[j], ns_twin(f64(x[j])), 2e-5, 1e-4)
    assert np.isnan(pad).all()
    for t, shape in ((xs[0], (K_, N)), (xs[1], (K_, N)), (bx, (K_, N)), (A, (r, r)), (B, (r, r))):
        assert np.isnan(unbatched(gpu, t, batch, shape)[1]).all()


def test_cross_entropy_carries_the_loss_scale(gpu, rng, kn):
    """SCALED cross_entropy: dlogits times the scale read from the scaler on the device, in
    loss.wgsl and, where the plan's check passed the subgroups, cross_entropy_sg."""
    from tinygpt.device.planner import make_plan
    rows, V = 3, 37
    logits = rng.standard_normal((rows, 40)).astype(np.float32)
    tgt = rng.integers(0, V, rows).astype(np.uint32)
    words = np.zeros(K.GATE_FLOATS, np.float32)
    words[K.GATE["scale"]] = 1024.0
    _, rd = R.cross_entropy(tgt, f64(logits[:, :V]), 1024.0 / rows)
    for variant in ("scalar",) + (("sg",) if make_plan(gpu, tuning={}).loss == "sg" else ()):
        tl, losses = gpu.upload(logits), gpu.tensor((rows,))
        run(gpu, kn.losses.cross_entropy(gpu.upload(tgt), tl, losses, rows, V, 1.0 / rows, stride=40, variant=variant,
                                  scaler=gpu.upload(words)))
        got = gpu.read(tl)
        check(f"cross_entropy {variant} x 1024", got[:, :V], rd, 1e-4, 1e-5)
        assert not got[:, V:].any()


def test_wgsl_errors_name_file_and_line(gpu, tmp_path):
    from tinygpt.device.gpu import ShaderError
    bad = tmp_path / "broken.wgsl"
    bad.write_text("fn f() -> f32 {\n  return 1u;\n}\n")
    with pytest.raises(ShaderError) as e:
        gpu.module(str(bad))
    msg = str(e.value)
    print(msg)
    # naga names the function (1:1), Tint the statement (2:3): either is the file's own line
    assert "\n" not in msg and re.search(rf"{re.escape(str(bad))}:(1:1|2:3):", msg) and "return" in msg
    bad.write_text("fn f( {\n")
    with pytest.raises(ShaderError, match=r"broken\.wgsl:1:\d+: .*(pars|expected '\)')"):   # naga | Tint
        gpu.kernel(str(bad), "main", "u")


def test_prelude_helpers_are_defined_once_and_errors_keep_their_lines(gpu, tmp_path):
    """common.wgsl is put in front of every shader; a helper is defined there only, and an error
    on line 4 of a shader (after an enable directive) is still reported on line 4."""
    import re
    from tinygpt.device.gpu import ShaderError, shader_dir
    shaders = shader_dir()
    defs = {}
    for f in shaders.glob("*.wgsl"):
        for name in re.findall(r"^fn (\w+)\(", f.read_text(), re.M):
            defs.setdefault(name, []).append(f.name)
    for helper in ("group_index", "lin", "erf4", "erf_approx"):
        assert defs[helper] == ["common.wgsl"], (helper, defs[helper])
    assert not any(re.search(r"wid\.y \* nwg\.x \+ wid\.x", f.read_text()) for f in shaders.glob("*.wgsl")
                   if f.name != "common.wgsl")
    bad = tmp_path / "late.wgsl"
    bad.write_text("fn ok() -> u32 { return lin(vec3<u32>(), vec3<u32>(1u), vec3<u32>()); }\n\n"
                   "fn f() -> f32 {\n  return 1u;\n}\n")
    with pytest.raises(ShaderError) as e:
        gpu.module(str(bad))
    print(e.value)
    assert re.search(rf"{re.escape(str(bad))}:(3:1|4:3):", str(e.value))   # naga | Tint, as above
    # the prelude goes after enable directives; lines map back on both sides of it
    from tinygpt.device.gpu import with_prelude
    src, where = with_prelude("enable subgroups;\nfn a() {}\n", "shaders/x.wgsl")
    n = src.count("\n")
    assert src.startswith("enable subgroups;\n// Helpers") and where(1) == ("shaders/x.wgsl", 1)
    assert where(2) == ("shaders/common.wgsl", 1) and where(n) == ("shaders/x.wgsl", 2)



def test_a_files_sections_are_kept_only_where_asked(gpu, tmp_path):
    """One source per op family (docs/kernels.md): a file's `//#if TAG` sections are kept where
    the launcher's Fill names the tag and become empty lines elsewhere (compile errors keep their
    lines); a width's Fill names the entry points and types; unbalanced directives are refused."""
    from tinygpt.device.gpu import Fill, ShaderError, sections
    from tinygpt.device.kernels import width
    text = "a\n//#if sg\nb\n//#else\nc\n//#endif\n//#if !f16\nd\n//#endif\n"
    assert sections(text, {"sg"}, "x") == "a\n\nb\n\n\n\n\nd\n\n"
    assert sections(text, {"f16"}, "x") == "a\n\n\n\nc\n\n\n\n\n"
    for bad in ("//#if sg\n", "//#endif\n", "//#if a\n//#if b\n//#endif\n//#endif\n", "//#else\n"):
        with pytest.raises(ValueError, match=r"x:\d+: "):
            sections(bad, set(), "x")
    src = tmp_path / "family.wgsl"
    src.write_text("@group(0) @binding(0) var<uniform> p: vec4<u32>;\n"
                   "@group(0) @binding(1) var<storage, read_write> o: array<V>;\n"
                   "@compute @workgroup_size(1) fn fill{{VEC}}() { o[0] = V(hsum(V(1.0)) * f32(W)); }\n"
                   "//#if sg\nfn broken() -> f32 { return 1u; }\n//#endif\n")
    for variant, entry, want in (("scalar", "fill", 1.0), ("vec4", "fill4", 16.0)):
        out = gpu.tensor((4,))
        run(gpu, gpu.dispatch(gpu.kernel(str(src), entry, "uw", fill=width(variant)), (0, 0, 0, 0), [out], (1,)))
        print(variant, entry, gpu.read(out)[0])
        assert gpu.read(out)[0] == want
    with pytest.raises(ShaderError, match=r"family.wgsl:5:"):   # the section kept: its line named
        gpu.kernel(str(src), "fill4", "uw", fill=width("vec4", "sg"))
    assert Fill("x").tags == frozenset()

def test_lavapipe_subgroup_size_follows_its_vector_width(gpu, tmp_path):
    """make test reruns these tests with LP_NATIVE_VECTOR_WIDTH 128 and 512: that run means
    something only if lavapipe's subgroups really are 4 and 16 lanes then (8 by default)."""
    import os
    if not ("llvmpipe" in gpu.name and gpu.backend == "Vulkan" and "subgroup" in gpu.features):
        pytest.skip("lavapipe only")
    src = tmp_path / "size.wgsl"
    src.write_text("enable subgroups;\n@group(0) @binding(0) var<uniform> p: vec4<u32>;\n"
                   "@group(0) @binding(1) var<storage, read_write> o: array<u32>;\n"
                   "@compute @workgroup_size(8) fn size(@builtin(subgroup_size) s: u32,\n"
                   "    @builtin(local_invocation_id) l: vec3<u32>) { o[l.x] = s; }\n")
    out = gpu.tensor((8,), "u32")
    run(gpu, gpu.dispatch(gpu.kernel(str(src), "size", "uw"), (0, 0, 0, 0), [out], (1,)))
    width = os.environ.get("LP_NATIVE_VECTOR_WIDTH")
    lanes = set(gpu.read(out).tolist())
    print(f"LP_NATIVE_VECTOR_WIDTH={width}: subgroups of {lanes} lanes")
    # unset, the width is the CPU's (256 bits with AVX2: 8 lanes)
    assert lanes == {int(width) // 32} if width else len(lanes) == 1 and lanes <= {4, 8, 16}


# ---- bf16 storage ---------------------------------------------------------------------------
@pytest.mark.parametrize("n,variant", [(1, "scalar"), (2, "scalar"), (7, "scalar"), (4096 + 3, "scalar"),
                                       (16, "x8"), (8 * 64 * 3 + 8, "x8")])
def test_bf16_casts_round_to_nearest_even(gpu, rng, n, variant, kn):
    """cast_bf16 against its twin bit for bit (ties to even, signs, inf, NaN, subnormals), and
    cast_f32 gives back exactly the bf16 values."""
    x = (rng.standard_normal(n) * 10.0 ** rng.integers(-40, 39, n)).astype(np.float32)
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-40, 3.4e38,
                        np.uint32(0x3F808000).view(np.float32),     # a tie: 1.00390625 -> even 1.0
                        np.uint32(0x3F818000).view(np.float32)], np.float32)   # a tie -> up, to even
    x[:min(n, len(special))] = special[:min(n, len(special))]
    h = gpu.tensor((-(-n // 2),), "bf16")
    back = gpu.tensor((n,))
    run(gpu, kn.cast_bf16(gpu.upload(x), h, n, variant), kn.cast_f32(h, back, n, variant))
    want = R.cast_bf16(x)
    assert np.array_equal(gpu.read(h), want), "cast_bf16 differs from its twin"
    got, ref = gpu.read(back), R.bf16_round(x)
    assert np.array_equal(np.isnan(got), np.isnan(x))
    assert np.array_equal(got[~np.isnan(x)].view(np.uint32), ref[~np.isnan(x)].view(np.uint32))
    if n >= 9:
        assert ref[7] == 1.0 and ref[8] == np.float32(1.015625)
    fin = np.isfinite(x) & (np.abs(x) > 1e-30) & (np.abs(x) < 1e38)
    rel = np.abs(ref[fin].astype(np.float64) - x[fin]) / np.abs(x[fin])
    print(f"bf16 round trip n={n}: max relative error {rel.max() if rel.size else 0:.3e} (bound 2^-8, half a bf16 ulp)")
    assert rel.size == 0 or rel.max() <= 2.0 ** -8


@pytest.mark.parametrize("variant,nb,tm", [("sg", 2, 32), ("sg", 1, 32), ("sg", 2, 64), ("sg", 1, 64),
                                           ("scalar", None, None), ("tiled", None, None)])
@pytest.mark.parametrize("M,N,K_", [(1, 8, 8), (32, 64, 64), (33, 72, 24), (100, 200, 48), (64, 512, 136),
                                    (40, 8, 16), (24, 16, 7)])  # K 7: a bf16 model's backward at batch x ctx 7
def test_matmul_family_bf16(gpu, rng, M, N, K_, variant, nb, tm):
    """bf16 operands, float32 sums, with subgroups (matmul_words.wgsl's sg section: 8 or 4 columns a lane, 32 or
    64 rows a workgroup), without (the matmul.wgsl template) and in workgroup tiles (the
    matmul_tiled.wgsl template, a 16 x 16 tile so that the shapes cross many tiles and edges): each
    product against its twin (the float64 product of the same bf16 values) with the float32
    kernels' tolerance, so only the summation order differs. Then the mixed operands of the
    backward, and bf16 written out."""
    from tinygpt.device.plan import PORTABLE
    if variant == "sg" and not K.half_ok("matmul", M, N, K_):
        pytest.skip("the 8-wide kernels take K and N multiples of 8 (kernels.matmul_variant gives scalar)")
    if variant == "tiled" and not K.vec4_ok("matmul", M, N, K_):
        pytest.skip("the tiles take K and N multiples of 4 (kernels.matmul_variant gives scalar)")
    if variant == "sg":
        need_subgroups(gpu)
    a, b, bias, prev, out, tol = mm_inputs(gpu, rng, M, N, K_)
    pk = lambda x: R.cast_bf16(x)                                   # packed flat, two to a word
    ah, bh, bth = pk(a), pk(b), pk(b.T.copy())
    rd = lambda x: R.bf16_round(x).astype(np.float64)               # the same values, for the twins
    ra, rb, rbt = rd(a), rd(b), rd(b.T.copy())
    if K_ % 2 == 0 and N % 2 == 0:                                  # the twins unpack what they are given
        assert np.array_equal(R.matmul_bf16(ah.reshape(M, -1), bh.reshape(K_, -1)), R.matmul_bf16(ra, rb))
    up = lambda x: gpu.upload(x, dtype="bf16" if x.dtype == np.uint32 else None)     # packed words are bf16
    kn = Kernels(gpu, PORTABLE.with_(matmul_tile=(4, 2, 8, 1, 4)))  # the tile of the tiled variant
    run(gpu, kn.matmul(up(ah), up(bh), up(bias), out, M, N, K_, variant=variant, nb=nb, tm=tm))
    check(f"matmul_bf16 {variant}{f' nb{nb} tm{tm}' if nb else ''} {M}x{N}x{K_}", gpu.read(out), R.matmul_bf16(ra, rb, f64(bias)), tol)
    gpu.write(out, prev)
    run(gpu, kn.matmul(up(ah), up(bh), None, out, M, N, K_, accumulate=True, variant=variant, nb=nb, tm=tm))
    check(f"matmul_bf16 {variant}{f' nb{nb} tm{tm}' if nb else ''} (+=) {M}x{N}x{K_}", gpu.read(out), prev + R.matmul_bf16(ra, rb), tol)
    run(gpu, kn.matmul_abt(up(ah), up(bth), out, M, N, K_, variant=variant, nb=nb, tm=tm))
    check(f"matmul_abt_bf16 {variant}{f' nb{nb} tm{tm}' if nb else ''} {M}x{N}x{K_}", gpu.read(out), R.matmul_abt_bf16(ra, rbt), tol)
    if M % 8 == 0:                                                  # A^T @ B packs A's rows of M
        ath, rat = pk(a.T.copy()), rd(a.T.copy())
        gpu.write(out, prev)
        run(gpu, kn.matmul_atb(up(ath), up(bh), out, M, N, K_, accumulate=True, variant=variant, nb=nb, tm=tm))
        check(f"matmul_atb_bf16 {variant}{f' nb{nb} tm{tm}' if nb else ''} (+=) {M}x{N}x{K_}", gpu.read(out), prev + R.matmul_atb_bf16(rat, rb), tol)
        # the backward's dW = X^T @ dY: B float32 (B_F32)
        run(gpu, kn.matmul_atb(up(ath), up(b), out, M, N, K_, variant=variant, nb=nb, tm=tm))
        check(f"matmul_atb_bf16 {variant}{f' nb{nb} tm{tm}' if nb else ''} B float32 {M}x{N}x{K_}", gpu.read(out), R.matmul_atb_bf16(rat, b), tol)
        # the head's dtok = dlogits^T @ x: A float32
        run(gpu, kn.matmul_atb(up(a.T.copy()), up(bh), out, M, N, K_, variant=variant, nb=nb, tm=tm))
        check(f"matmul_atb_bf16 {variant}{f' nb{nb} tm{tm}' if nb else ''} A float32 {M}x{N}x{K_}", gpu.read(out),
              R.matmul_atb_bf16(a.T.copy(), rb), tol)
    # the head's dx = dlogits @ tok_emb: A float32, B bf16
    run(gpu, kn.matmul(up(a), up(bh), None, out, M, N, K_, variant=variant, nb=nb, tm=tm))
    check(f"matmul_bf16 {variant}{f' nb{nb} tm{tm}' if nb else ''} A float32 {M}x{N}x{K_}", gpu.read(out),
          R.matmul_bf16(a, rb), tol)
    # the backward's dX = dY @ W^T: A float32 (A_F32)
    run(gpu, kn.matmul_abt(up(a), up(bth), out, M, N, K_, variant=variant, nb=nb, tm=tm))
    check(f"matmul_abt_bf16 {variant}{f' nb{nb} tm{tm}' if nb else ''} A float32 {M}x{N}x{K_}", gpu.read(out), R.matmul_abt_bf16(a, rbt), tol)
    # A bf16 and B float32 in A @ B^T (a policy of bf16 activations over float32 weights): the 8-wide
    # kernel reads B packed, so its set declines (MatmulSet.takes) and the template serves them
    run(gpu, kn.matmul_abt(up(ah), up(b.T.copy()), out, M, N, K_, variant=variant, nb=nb, tm=tm))
    check(f"matmul_abt_bf16 {variant}{f' nb{nb} tm{tm}' if nb else ''} B float32 {M}x{N}x{K_}", gpu.read(out),
          R.matmul_abt_bf16(ra, b.T.copy()), tol)
    # the forward's q, k, v and pre-activation: out written as bf16 (OUT_BF16), bias added first.
    # A float32 sum on a rounding edge may round the other way from the float64 twin's: values
    # within the sum's tolerance plus one bf16 rounding, and most words equal.
    outh = gpu.tensor((M * N // 2,), "bf16")
    run(gpu, kn.matmul(up(ah), up(bh), up(bias), outh, M, N, K_, variant=variant, nb=nb, tm=tm))
    want_h = R.matmul_bf16(ra, rb, f64(bias), out_bf16=True)
    same = np.mean(gpu.read(outh).reshape(M, -1) == want_h)
    print(f"matmul_bf16 {variant}{f' nb{nb} tm{tm}' if nb else ''} bf16 out {M}x{N}x{K_}: {same:.2%} of words equal to the twin's")
    got, want = R.unpack_bf16(gpu.read(outh).reshape(M, -1)), R.matmul_bf16(ra, rb, f64(bias))
    check(f"matmul_bf16 {variant}{f' nb{nb} tm{tm}' if nb else ''} bf16 out {M}x{N}x{K_} (one bf16 rounding)", got, want, tol, 2.0 ** -8)
    assert same >= 0.9


@pytest.mark.parametrize("variant", ["vec4", "sg"])
@pytest.mark.parametrize("M,N,K_", [(4, 4, 4), (17, 36, 20), (33, 200, 64)])
def test_matmul_quad_template_with_float32_products(gpu, rng, M, N, K_, variant, kn):
    """matmul_quad.wgsl is a template as matmul_tiled.wgsl is: completed with float32's products it
    reads bf16 operands (f16's fast matmuls complete it with f16's, test_f16.py). No precision
    takes this form, so its launcher is called directly: each half operand beside a float32 one,
    and out bf16, against the float64 products of the same bf16 values."""
    if variant == "sg" and not subgroups_ok(gpu):
        pytest.skip("the sg kernels need subgroups that pass the plan's check")
    a, b, bias, prev, out, tol = mm_inputs(gpu, rng, M, N, K_)
    pk = lambda x: R.cast_bf16(x).reshape(len(x), -1)
    up = lambda x: gpu.upload(x, dtype="bf16" if x.dtype == np.uint32 else None)
    quad = lambda entry, A, B, o, bias=None: kn._mm_quad(entry, A, B, bias, o, M, N, K_,
                                                         (M, N, K_, bias is not None, 0), variant, None, None, "bf16")
    bt = b.T.copy()
    for A, B in ((pk(a), pk(b)), (a, pk(b)), (pk(a), b)):
        run(gpu, quad("matmul", up(A), up(B), out, up(bias)))
        kinds = "x".join("bf16" if x.dtype == np.uint32 else "float32" for x in (A, B))
        check(f"matmul_quad_{variant} {kinds} {M}x{N}x{K_}", gpu.read(out),
              R.matmul_quad_vec4(A, B, f64(bias)), tol)
    run(gpu, quad("matmul_abt", up(pk(a)), up(pk(bt)), out))
    check(f"matmul_abt_quad_{variant} bf16 {M}x{N}x{K_}", gpu.read(out), R.matmul_abt_quad_vec4(pk(a), pk(bt)), tol)
    if M % 4 == 0:                                                 # A^T @ B: vec4 along M
        at = a.T.copy()
        run(gpu, quad("matmul_atb", up(pk(at)), up(b), out))
        check(f"matmul_atb_quad_{variant} bf16 {M}x{N}x{K_}", gpu.read(out), R.matmul_atb_quad_vec4(pk(at), b), tol)
    outh = gpu.tensor((M * N // 2,), "bf16")
    run(gpu, quad("matmul", up(pk(a)), up(pk(b)), outh, up(bias)))
    got, want = R.unpack_bf16(gpu.read(outh).reshape(M, -1)), R.matmul_quad_vec4(pk(a), pk(b), f64(bias))
    check(f"matmul_quad_{variant} bf16 out {M}x{N}x{K_} (one bf16 rounding)", got, want, tol, 2.0 ** -8)


@pytest.mark.parametrize("M", [1, 2, 3, 4])
@pytest.mark.parametrize("N,K_", [(8, 8), (40, 16), (72, 200), (100, 24)])   # N 100: A @ B^T alone (4 columns a lane)
def test_matmul_rows(gpu, rng, M, N, K_, kn):
    """The few-row products (matmul_words.wgsl's matmul_rows and matmul_abt_rows, a decode step's): each operand float32 or bf16, out
    float32 (bias, +=) or bf16, against their twins (the float64 products of the same values);
    N past a workgroup's columns and not a multiple of it. The plan takes them for at most
    few_rows rows, and not with few_rows 0."""
    a, b, bias, prev, out, tol = mm_inputs(gpu, rng, M, N, K_)
    pk = lambda x: R.cast_bf16(x).reshape(len(x), -1)
    forms = {"f32": (a, b, b.T.copy()), "bf16": (pk(a), pk(b), pk(b.T.copy()))}
    up = lambda x: gpu.upload(x, dtype="bf16" if x.dtype == np.uint32 else None)
    for ta, tb in (("f32", "f32"), ("bf16", "bf16"), ("f32", "bf16")):
        A, Bm, Bt = forms[ta][0], forms[tb][1], forms[tb][2]
        name = f"{M}x{N}x{K_} A {ta} B {tb}"
        if N % 8 == 0:
            run(gpu, kn.matmul(up(A), up(Bm), up(bias), out, M, N, K_, variant="rows"))
            check(f"matmul_rows {name}", gpu.read(out), R.matmul_rows(A, Bm, f64(bias)), tol)
            gpu.write(out, prev)
            run(gpu, kn.matmul(up(A), up(Bm), None, out, M, N, K_, accumulate=True, variant="rows"))
            check(f"matmul_rows (+=) {name}", gpu.read(out), prev + R.matmul_rows(A, Bm), tol)
            outh = gpu.tensor((M * N // 2,), "bf16")
            run(gpu, kn.matmul(up(A), up(Bm), up(bias), outh, M, N, K_, variant="rows"))
            got, want = R.unpack_bf16(gpu.read(outh).reshape(M, -1)), R.matmul_rows(A, Bm, f64(bias))
            check(f"matmul_rows bf16 out {name} (one bf16 rounding)", got, want, tol, 2.0 ** -8)
        run(gpu, kn.matmul_abt(up(A), up(Bt), out, M, N, K_, variant="rows", bias=up(bias)))
        check(f"matmul_abt_rows {name}", gpu.read(out), R.matmul_abt_rows(A, Bt, f64(bias)), tol)
        gpu.write(out, prev)
        run(gpu, kn.matmul_abt(up(A), up(Bt), out, M, N, K_, accumulate=True, variant="rows"))
        check(f"matmul_abt_rows (+=) {name}", gpu.read(out), prev + R.matmul_abt_rows(A, Bt), tol)
    if N % 8 == 0:
        assert K.matmul_variant(kn.plan, "matmul", M, N, K_) == "rows"
        assert K.matmul_variant(kn.plan, "matmul", M, N, K_, "bf16") == "rows"
    assert K.matmul_variant(kn.plan.with_(few_rows=0), "matmul_abt", M, N, K_) != "rows"
    assert K.matmul_variant(kn.plan.with_(few_rows=M - 1), "matmul_abt", M, N, K_) != "rows"


@pytest.mark.parametrize("variant", ["scalar", "vec4", "sg", "tiled", "rows"])
def test_matmul_abt_adds_a_bias(gpu, rng, variant):
    """A @ B^T + bias, as a model whose matrices are held [out, in] (RunSpec.out_in) projects with
    biases (Qwen2's q, k, v), in each float32 variant and bf16's own kernel."""
    from tinygpt.device.plan import PORTABLE
    if variant == "sg":
        need_subgroups(gpu)
    M, N, K_ = (3, 40, 24) if variant == "rows" else (37, 40, 24)
    kn = Kernels(gpu, PORTABLE.with_(matmul_tile=(4, 2, 8, 1, 4)))
    a, b, bias, prev, out, tol = mm_inputs(gpu, rng, M, N, K_)
    run(gpu, kn.matmul_abt(gpu.upload(a), gpu.upload(b.T.copy()), out, M, N, K_, variant=variant, bias=gpu.upload(bias)))
    check(f"matmul_abt {variant} + bias {M}x{N}x{K_}", gpu.read(out), R.matmul_abt(f64(a), f64(b.T), f64(bias)), tol)
    if variant == "sg":
        bh = R.cast_bf16(b.T.copy())
        run(gpu, kn.matmul_abt(gpu.upload(a), gpu.upload(bh, dtype="bf16"), out, M, N, K_, variant="sg",
                               bias=gpu.upload(bias)))
        check(f"matmul_abt_bf16 sg + bias {M}x{N}x{K_}", gpu.read(out),
              R.matmul_abt_bf16(a, R.unpack_bf16(bh.reshape(N, -1))) + bias, tol)


@pytest.mark.parametrize("act", sorted(ACTIVATIONS))
@pytest.mark.parametrize("n", [8, 1024, 64 * 2 * 8 * 3 + 8])
def test_activation_bf16(gpu, rng, n, kn, act):
    """Every activation with its pre-activation stored as bf16 (the same entry points, the bf16
    section): forward within one bf16 rounding of the float64 twin of the same bf16 values (a
    float32 result on the other side of a rounding edge may round the other way), backward in
    float32 against the float64 twin."""
    act = ACTIVATIONS[act]
    x = (rng.standard_normal(n) * 3).astype(np.float32)
    dy = rng.standard_normal(n).astype(np.float32)
    xh = R.cast_bf16(x)
    outh, dx = gpu.tensor((n // 2,), "bf16"), gpu.tensor((n,))
    run(gpu, kn.act_forward(act, gpu.upload(xh, dtype="bf16"), outh, n),
        kn.act_backward(act, gpu.upload(xh, dtype="bf16"), gpu.upload(dy), dx, n))
    got = R.cast_f32(gpu.read(outh), n).astype(np.float64)
    check(f"{act.name}_forward bf16 n={n} (one bf16 rounding)", got, act.forward(R.cast_f32(xh, n).astype(np.float64)),
          1e-6, 2.0 ** -8)
    same = np.mean(gpu.read(outh) == R.stored_forward(act.forward, xh, "bf16"))
    print(f"{act.name}_forward bf16: {same:.2%} of words equal to the float64 twin's rounding")
    assert same > 0.98
    check(f"{act.name}_backward bf16 n={n}", gpu.read(dx), R.stored_backward(act.backward, xh, f64(dy), "bf16"),
          1e-6, 1e-6)


@pytest.mark.parametrize("rows,C,rms", [(1, 8, False), (65, 48, False), (130, 96, False), (65, 48, True)])
def test_layernorm_forward_bf16(gpu, rng, rows, C, rms, kn):
    """The output rounded to bf16 as the twin rounds it (a float32 result on a rounding edge may round
    the other way: almost every word equal), statistics in float32 as layernorm_forward4's; and RMSNorm's."""
    x = (rng.standard_normal((rows, C)) * 2 + 1).astype(np.float32)
    g, b = rng.standard_normal(C).astype(np.float32), rng.standard_normal(C).astype(np.float32)
    yh, stats = gpu.tensor((rows, C // 2), "bf16"), gpu.tensor((2, rows))
    run(gpu, kn.layernorm_forward(gpu.upload(x), gpu.upload(g if rms else np.stack([g, b])), yh, stats, rows, C,
                                  rms=rms))
    want_h, mean, rstd = R.stored_layernorm_forward(x, g, b, "bf16", rms=rms)
    same = np.mean(gpu.read(yh).reshape(-1) == want_h.reshape(-1))
    print(f"layernorm_forward_bf16 {rows}x{C}: {same:.2%} of words equal to the twin's")
    assert same > 0.97
    got = R.cast_f32(gpu.read(yh).reshape(-1), rows * C)
    want = R.layernorm_forward(f64(x), f64(g), f64(b), rms=rms)[0].reshape(-1)
    check(f"layernorm_forward_bf16 {rows}x{C} (one bf16 rounding)", got, want, 1e-5, 2.0 ** -8)
    check("its mean | rstd", gpu.read(stats), np.stack([mean, rstd]), 2e-5)


@pytest.mark.parametrize("pairs,T,beta", [(1, 1, 0.1), (3, 7, 0.5), (70, 5, 2.0)])
def test_dpo_and_scale_rows(gpu, rng, kn, pairs, T, beta):
    """preference.wgsl: each pair's DPO loss from its windows' row losses and the reference's
    log-probabilities (float32 bits in a u32 buffer), the factor on each window's rows, and those
    rows of dlogits scaled (a chunk from row0; 70 pairs: more than the workgroup's 64 lanes)."""
    losses = rng.uniform(0, 3, 2 * pairs * T).astype(np.float32)
    losses[::3] = 0.0                                           # unscored rows
    refs = (-rng.uniform(0, 3 * T, 2 * pairs)).astype(np.float32)
    weights, loss = gpu.tensor((2 * pairs,)), gpu.tensor((4,))
    wscale, lscale = 1.0 / (2 * pairs), 1.0 / pairs
    run(gpu, kn.losses.dpo(gpu.upload(refs.view(np.uint32)), gpu.upload(losses), weights, loss, pairs, T, beta, wscale,
                    lscale))
    rw, rl = R.dpo(f64(refs), f64(losses), pairs, T, beta, wscale, lscale)
    check(f"dpo weights, {pairs} pairs of {T}", gpu.read(weights), rw, 1e-6 * beta, 1e-5)
    check(f"dpo loss, {pairs} pairs of {T}", gpu.read(loss)[0], rl, 1e-5, 1e-5)
    stride, row0 = 12, T
    rows = 2 * pairs * T - row0
    dl = rng.standard_normal((rows, stride)).astype(np.float32)
    t = gpu.upload(dl)
    run(gpu, kn.losses.scale_rows(weights, t, rows, stride, T, row0))
    check(f"scale_rows {rows}x{stride} from row {row0}", gpu.read(t), R.scale_rows(rw, f64(dl), rows, stride, T, row0),
          1e-6, 1e-5)


def _packed_positions(rng, rows: int, T: int) -> np.ndarray:
    """Each row's position in its record: windows of T rows cut into records of random odd lengths."""
    out = []
    while len(out) < rows:
        n = int(rng.integers(1, T // 2 + 2))                  # at most half a window and one row
        out += list(range(min(n, T - len(out) % T)))
    return np.array(out[:rows], np.uint32)


@pytest.mark.parametrize("rows,T,H,hd,dtype", [(30, 10, 3, 12, "f32"), (130, 65, 2, 64, "f32"), (14, 7, 3, 12, "bf16")])
def test_rope_and_qk_norm_in_packed_windows(gpu, rng, rows, T, H, hd, dtype, kn):
    """Packed windows (docs: each row's position in its record, restarting at each record): rope's
    turn, qk_norm_rope and its backward at those positions, against the float64 twins."""
    C = H * hd
    docs = _packed_positions(rng, rows, T)
    assert (docs != np.arange(rows) % T).any()
    x = rng.standard_normal((rows, C)).astype(np.float32)
    table, t_docs = rope_table(T, hd, 10000.0), gpu.upload(docs)
    cast, back, tol = {"f32": (lambda a: a, lambda w: w, 2e-6),
                       "bf16": (R.cast_bf16, lambda w: R.cast_f32(w, rows * C), 2.0 ** -8)}[dtype]
    stored = cast(x)
    seen = back(stored).reshape(rows, C) if dtype != "f32" else x
    for entry in ("rope_forward", "rope_backward"):
        t = gpu.tensor(np.shape(stored), dtype, data=stored) if dtype != "f32" else gpu.upload(x)
        run(gpu, getattr(kn.rope, entry)(gpu.upload(table), t, rows, T, C, hd, docs=t_docs))
        got = back(gpu.read(t)).reshape(rows, C) if dtype != "f32" else gpu.read(t)
        want = getattr(R, entry)(f64(table), f64(seen), T, hd, docs=docs)
        check(f"{entry} {dtype} packed {rows}x{C} hd {hd}", got, want, 1e-6, tol)
    gain, dy = rng.standard_normal(hd).astype(np.float32), rng.standard_normal((rows, C)).astype(np.float32)
    xq, stats, dx = gpu.tensor((rows, C // 2 if dtype != "f32" else C), dtype), gpu.tensor((2, rows * H)), \
        gpu.tensor((rows, C))
    t_table, t_xr, t_gain = gpu.upload(table), gpu.upload(x), gpu.upload(gain)
    run(gpu, kn.rope.qk_norm_rope(t_table, t_xr, t_gain, xq, stats, rows, T, C, hd, eps=1e-6, docs=t_docs))
    want, _ = R.qk_norm_rope(f64(table), f64(x), f64(gain), T, hd, eps=1e-6, docs=docs)
    check(f"qk_norm_rope {dtype} packed {rows}x{C}", back(gpu.read(xq)).reshape(rows, C), want,
          1e-6 * np.abs(want).max(), tol)
    if dtype == "f32":
        run(gpu, kn.rope.qk_norm_rope_dx(t_table, gpu.upload(dy), t_xr, t_gain, stats, dx, rows, T, C, hd, docs=t_docs))
        want = R.qk_norm_rope_dx(f64(table), f64(dy), f64(x), f64(gain), f64(gpu.read(stats)), T, hd, docs=docs)
        check(f"qk_norm_rope_dx packed {rows}x{C}", gpu.read(dx), want, 2e-6 * np.abs(want).max(), 1e-5)


@pytest.mark.parametrize("B,T,C,V", [(2, 7, 65, 256), (3, 33, 8, 70)])
def test_embedding_in_packed_windows(gpu, rng, B, T, C, V, kn):
    """Packed windows: each row adds the position table's row of its position in its record; the
    table's gradient sums each position's rows over every record (embed_tok_grad over the rows
    bucketed by position, as the model takes it), against the float64 twins."""
    tokens = rng.integers(0, V, (B, T)).astype(np.uint32)
    docs = _packed_positions(rng, B * T, T).reshape(B, T)
    tok, pos = rng.standard_normal((V, C)).astype(np.float32), rng.standard_normal((T, C)).astype(np.float32)
    out = gpu.tensor((B, T, C))
    run(gpu, kn.embed_forward(gpu.upload(tokens), gpu.upload(tok), gpu.upload(pos), out, B, T, C,
                              docs=gpu.upload(docs)))
    check(f"embed_forward packed {B}x{T}x{C} (bitwise vs f32)", gpu.read(out),
          R.embed_forward(tokens, tok, pos, docs=docs), 0)
    dout = rng.standard_normal((B * T, C)).astype(np.float32)
    off, rows = token_buckets(docs, T)
    dpos = gpu.tensor((T, C))
    run(gpu, kn.embed_tok_grad(gpu.upload(np.concatenate([off, rows])), gpu.upload(dout), dpos, B, T, C, T,
                               accumulate=False))
    want = np.zeros((T, C))
    np.add.at(want, docs.reshape(-1), f64(dout))
    check(f"position table's gradient, packed {B}x{T}x{C}", gpu.read(dpos), want, 1e-5)
