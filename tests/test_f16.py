"""The f16 precision's kernels against their twins (tinygpt.reference.kernels), at ragged shapes:
WGSL's f16 where the adapter has the shader-f16 feature, and the one-line refusal where it has not
(make test runs this file on GL's llvmpipe, which lacks it)."""
import numpy as np
import pytest

from tinygpt.reference import kernels as R

from conftest import check

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


@pytest.mark.parametrize("M,N,K_", [(1, 1, 1), (7, 5, 3), (33, 65, 17), (64, 96, 48), (13, 38, 70)])
def test_matmul_family_f16(gpu, rng, M, N, K_, kn, f16):
    """Products in f16, sums in float32, against the twin that rounds each product to f16 and sums
    in float64: only the summation order differs, so the float32 kernels' tolerance. Every operand
    mix the model uses (float32 gradients rounded to f16 as read), out float32, += and f16."""
    a = rng.standard_normal((M, K_)).astype(np.float32)
    b = rng.standard_normal((K_, N)).astype(np.float32)
    bias = rng.standard_normal(N).astype(np.float32)
    prev = rng.standard_normal((M, N)).astype(np.float32)
    out = gpu.tensor((M, N))
    tol = 8e-6 * np.sqrt(K_)
    A, B = half(gpu, a), half(gpu, b)
    run(gpu, kn.matmul_f16(A, B, gpu.upload(bias), out, M, N, K_))
    check(f"matmul_f16 {M}x{N}x{K_}", gpu.read(out), R.matmul_f16(a, b, f64(bias)), tol)
    gpu.write(out, prev)
    run(gpu, kn.matmul_f16(A, B, None, out, M, N, K_, accumulate=True))
    check(f"matmul_f16 (+=) {M}x{N}x{K_}", gpu.read(out), prev + R.matmul_f16(a, b), tol)
    run(gpu, kn.matmul_f16(gpu.upload(a), B, None, out, M, N, K_))           # the head's dx: A float32
    check(f"matmul_f16 A float32 {M}x{N}x{K_}", gpu.read(out), R.matmul_f16(a, b), tol)
    if N % 2 == 0:                                                            # out f16: q, k, v, pre
        oh = gpu.tensor((M * N // 2,), "f16")
        run(gpu, kn.matmul_f16(A, B, gpu.upload(bias), oh, M, N, K_))
        got = R.cast_f16_to_f32(gpu.read(oh), M * N).reshape(M, N)
        want = R.matmul_f16(a, b, f64(bias))
        check(f"matmul_f16 out f16 {M}x{N}x{K_}", got, want, tol, rtol=2.0 ** -11)
    bt = b.T.copy()
    BT = half(gpu, bt)
    run(gpu, kn.matmul_abt_f16(A, BT, out, M, N, K_))
    check(f"matmul_abt_f16 {M}x{N}x{K_}", gpu.read(out), R.matmul_abt_f16(a, bt), tol)
    run(gpu, kn.matmul_abt_f16(gpu.upload(a), BT, out, M, N, K_))           # dx = dy @ W^T: A float32
    check(f"matmul_abt_f16 A float32 {M}x{N}x{K_}", gpu.read(out), R.matmul_abt_f16(a, bt), tol)
    at = a.T.copy()
    AT = half(gpu, at)
    run(gpu, kn.matmul_atb_f16(AT, gpu.upload(b), out, M, N, K_))            # dW = x^T @ dy: B float32
    check(f"matmul_atb_f16 B float32 {M}x{N}x{K_}", gpu.read(out), R.matmul_atb_f16(at, b), tol)
    gpu.write(out, prev)
    run(gpu, kn.matmul_atb_f16(gpu.upload(at), B, out, M, N, K_, accumulate=True))   # dtok: A float32
    check(f"matmul_atb_f16 A float32 (+=) {M}x{N}x{K_}", gpu.read(out), prev + R.matmul_atb_f16(at, b), tol)


def test_matmul_f16_products_are_f16(gpu, kn, f16):
    """The twin's rule, seen on the device: a product past 65504 is inf even where the float32 sum
    would have been small, and one under f16's subnormals is 0; a float32 operand past 65504 reads
    as inf."""
    a = np.array([[300.0, 1e-4, 1.0]], np.float32)
    b = np.array([[300.0], [1e-4], [-1.0]], np.float32)
    out = gpu.tensor((1, 1))
    run(gpu, kn.matmul_f16(half(gpu, a), half(gpu, b),
                           None, out, 1, 1, 3))
    assert np.isinf(gpu.read(out)[0, 0]) and np.isinf(R.matmul_f16(a, b)[0, 0])
    a[0, 0] = 1.0
    run(gpu, kn.matmul_f16(half(gpu, a), half(gpu, b),
                           None, out, 1, 1, 3))
    assert gpu.read(out)[0, 0] == np.float32(R.matmul_f16(a, b)[0, 0]) == np.float32(300.0 - 1.0)  # 1e-8 -> 0
    run(gpu, kn.matmul_f16(gpu.upload(np.array([[1e5, 0.0, 0.0]], np.float32)),
                           half(gpu, b), None, out, 1, 1, 3))
    assert np.isposinf(gpu.read(out)[0, 0])


@pytest.mark.parametrize("rows,C", [(1, 4), (7, 12), (67, 64)])
def test_layernorm_forward_f16(gpu, rng, rows, C, kn, f16):
    x = (rng.standard_normal((rows, C)) * 3 + 1).astype(np.float32)
    gb = rng.standard_normal((2, C)).astype(np.float32)
    y, stats = gpu.tensor((rows, C // 2), "f16"), gpu.tensor((2, rows))
    run(gpu, kn.layernorm_forward_f16(gpu.upload(x), gpu.upload(gb), y, stats, rows, C))
    yw, mean, rstd = R.layernorm_forward(f64(x), f64(gb[0]), f64(gb[1]))
    got = R.unpack_f16(gpu.read(y))
    # f16 rounding of the float32 result: half an ulp of |y|, and the float32 arithmetic before it
    check(f"layernorm_forward_f16 {rows}x{C}", got, yw, 1e-5, rtol=2.0 ** -11 + 1e-6)
    check(f"layernorm_forward_f16 stats {rows}x{C}", gpu.read(stats), np.stack([mean, rstd]), 1e-5, rtol=1e-5)


@pytest.mark.parametrize("n", [4, 12, 64 * 16 + 4, 3 * 64 * 16])
def test_gelu_f16(gpu, rng, n, kn, f16):
    x = (rng.standard_normal(n) * 3).astype(np.float32)
    xh = R.cast_f16(x)
    X = gpu.tensor((n // 2,), "f16", data=xh)
    out = gpu.tensor((n // 2,), "f16")
    dy = rng.standard_normal(n).astype(np.float32)
    dx = gpu.tensor((n,))
    run(gpu, kn.gelu_forward_f16(X, out, n), kn.gelu_backward_f16(X, gpu.upload(dy), dx, n))
    xv = R.unpack_f16(xh)
    check(f"gelu_forward_f16 n={n}", R.unpack_f16(gpu.read(out)), R.gelu_forward(xv), 2e-6, rtol=2.0 ** -11 + 1e-6)
    check(f"gelu_backward_f16 n={n}", gpu.read(dx), R.gelu_backward_f16(xh, f64(dy)), 2e-6, rtol=1e-5)


def test_refusal_without_shader_f16(gpu):
    """An adapter without shader-f16 gets one line naming the feature (GL's llvmpipe here)."""
    if "shader-f16" in gpu.features:
        pytest.skip(f"{gpu.name} has shader-f16 (the f16 kernels are tested above)")
    from tinygpt.core.precision import F16
    from tinygpt.model.gpt import precision_problem
    msg = precision_problem(gpu, F16)
    print(msg)
    assert msg and "shader-f16" in msg and "\n" not in msg
