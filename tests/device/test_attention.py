"""The three attention paths against the float64 reference: out, dq, dk, dv."""
import numpy as np
import pytest

from tinygpt.device.gpu import LimitError
from tinygpt.device.kernels import Kernels
from tinygpt.device.planner import make_plan
from tinygpt.model import attention
from tinygpt.model.layout import head_chunks
from tinygpt.reference import attention as RA

from conftest import check

pytestmark = pytest.mark.kernel

# (B, T, C, H): T in {1, 7, 64, 65, 257}; head dims 1, 5, 13, 24, 33 and 128
SHAPES = [(2, 1, 10, 2), (2, 7, 15, 3), (1, 64, 48, 2), (2, 65, 26, 2), (1, 257, 33, 1), (1, 65, 128, 1)]
TOL = 2e-5  # absolute; inputs ~N(0,1), outputs O(1)


def _inputs(B, T, C, seed=0):
    r = np.random.default_rng(seed)
    return [r.standard_normal((B, T, C)).astype(np.float32) for _ in range(4)]


def use(gpu, impl):
    """-> (impl, launchers). 'online-tiles': online with online.wgsl's workgroup-memory tiles, where
    the device's plan would take online_sg.wgsl (both must stay right: GPUs and GL use the tiles)."""
    plan = make_plan(gpu, tuning={})
    if impl == "online-tiles":
        return "online", Kernels(gpu, plan.with_(attention="tiles"))
    return impl, Kernels(gpu, plan)


@pytest.mark.parametrize("impl", attention.IMPLS + ("online-tiles",))
@pytest.mark.parametrize("B,T,C,H", SHAPES)
def test_attention_against_float64(gpu, impl, B, T, C, H):
    tag_impl, (impl, kn) = impl, use(gpu, impl)
    q, k, v, do = _inputs(B, T, C)
    f = lambda a: a.astype(np.float64)
    ref = RA.attention_forward(f(q), f(k), f(v), H)
    rdq, rdk, rdv = RA.attention_backward(f(q), f(k), f(v), f(do), H)
    tag = f"{tag_impl} B={B} T={T} C={C} H={H} hd={C // H}"
    check(f"{tag} out", attention.forward(kn, q, k, v, H, impl), ref, TOL)
    dq, dk, dv = attention.backward(kn, q, k, v, do, H, impl)
    check(f"{tag} dq", dq, rdq, TOL)
    check(f"{tag} dk", dk, rdk, TOL)
    check(f"{tag} dv", dv, rdv, TOL)


def positions_of(lengths: list) -> np.ndarray:
    """[B, T] each row's position in its record, the records of each window laid end to end."""
    return np.array([np.concatenate([np.arange(n) for n in window]) for window in lengths], np.uint32)


# packed windows (B, T, C, H, window, record lengths per window): odd lengths, a record of one row,
# a window of one record, records across online's tiles (32 rows; 8 for the sg kernels)
PACKED = [(2, 7, 15, 3, 0, [[3, 4], [1, 1, 5]]),
          (2, 65, 26, 2, 0, [[20, 1, 30, 14], [65]]),
          (1, 64, 48, 2, 9, [[17, 33, 14]])]


@pytest.mark.parametrize("impl", attention.IMPLS + ("online-tiles",))
@pytest.mark.parametrize("B,T,C,H,window,lengths", PACKED)
def test_packed_windows_attend_within_their_records(gpu, impl, B, T, C, H, window, lengths):
    """Several records to a window (docs: each row's position in its record): out, dq, dk, dv equal
    each record's attention run on its own, in float64, on every path (with a sliding window too)."""
    tag_impl, (impl, kn) = impl, use(gpu, impl)
    q, k, v, do = _inputs(B, T, C, 5)
    docs = positions_of(lengths)
    f = lambda a: a.astype(np.float64)
    want = [np.zeros((B, T, C)) for _ in range(4)]
    for b, window_lengths in enumerate(lengths):
        t0 = 0
        for n in window_lengths:
            part = lambda x: f(x[b:b + 1, t0:t0 + n])
            want[0][b, t0:t0 + n] = RA.attention_forward(part(q), part(k), part(v), H, window)[0]
            for g, got in zip(want[1:], RA.attention_backward(part(q), part(k), part(v), part(do), H, window=window)):
                g[b, t0:t0 + n] = got[0]
            t0 += n
    check(f"float64 twin's mask: packed = each record alone, T={T}",
          RA.attention_forward(f(q), f(k), f(v), H, window, docs), want[0], 1e-12)
    tag = f"{tag_impl} packed {lengths} T={T} C={C} H={H} window={window}"
    check(f"{tag} out", attention.forward(kn, q, k, v, H, impl, window, docs), want[0], TOL)
    for name, got, w in zip(("dq", "dk", "dv"), attention.backward(kn, q, k, v, do, H, impl, window, docs), want[1:]):
        check(f"{tag} {name}", got, w, TOL)


@pytest.mark.slow
@pytest.mark.parametrize("impl", ["online", "online-tiles"])
@pytest.mark.parametrize("hd", [32, 128])
def test_online_beyond_the_old_cap(gpu, impl, hd):
    """T = 2048 (twice the original's cap). hd = 128 also guards llvmpipe's silent stop of an
    invocation's loops after 65,535 iterations: a kernel looping over T*hd would fail here."""
    _, kn = use(gpu, impl)
    B, T, C, H = 1, 2048, hd, 1
    q, k, v, do = _inputs(B, T, C, 1)
    f = lambda a: a.astype(np.float64)
    check(f"{impl} T=2048 out", attention.forward(kn, q, k, v, H, "online"),
          RA.attention_forward(f(q), f(k), f(v), H), TOL)
    dq, dk, dv = attention.backward(kn, q, k, v, do, H, "online")
    for name, got, want in zip("qkv", (dq, dk, dv), RA.attention_backward(f(q), f(k), f(v), f(do), H)):
        check(f"{impl} T=2048 d{name}", got, want, TOL)


@pytest.mark.parametrize("impl,T,hd", [("naive", 1024, 64), ("fused_sv", 1100, 40)])
def test_long_rows_are_not_cut_short(gpu, plan, impl, T, hd):
    """Rows whose loops would pass llvmpipe's 65,535-iteration cap if they looped over T*hd; fused_sv
    past the 1,024 positions the original's private array of scores held (its scores are parked in P)."""
    q, k, v, do = _inputs(1, T, hd, 3)
    f = lambda a: a.astype(np.float64)
    tag = f"{impl} T={T} hd={hd}"
    kn = Kernels(gpu, plan)
    check(f"{tag} out", attention.forward(kn, q, k, v, 1, impl), RA.attention_forward(f(q), f(k), f(v), 1), TOL)
    for name, got, want in zip("qkv", attention.backward(kn, q, k, v, do, 1, impl),
                               RA.attention_backward(f(q), f(k), f(v), f(do), 1)):
        check(f"{tag} d{name}", got, want, TOL)


def test_score_paths_refuse_rows_past_a_cpu_adapters_loop_cap(gpu, plan, monkeypatch):
    """llvmpipe stops an invocation's loops after GPU.LOOP_CAP iterations in all, without a word:
    a row of fused_sv loops 4 x T times (scores, exponentials, the whole row's weights, P @ V),
    of naive's softmax 3 x T. The cap forced to 100: T = 30 is refused for fused_sv (120) and
    runs on naive (90), against float64."""
    if not gpu.is_cpu:
        pytest.skip(f"{gpu.name} is not a CPU adapter: no loop cap")
    monkeypatch.setattr(gpu, "LOOP_CAP", 100)
    q = _inputs(1, 30, 8, 4)[0]
    with pytest.raises(LimitError, match=r"fused_sv's loops over a row's keys \(4 x ctx\) is 120.*online"):
        attention.forward(Kernels(gpu, plan), q, q, q, 1, "fused_sv")
    f = lambda a: a.astype(np.float64)
    check("naive T=30 under a cap of 100", attention.forward(Kernels(gpu, plan), q, q, q, 1, "naive"),
          RA.attention_forward(f(q), f(q), f(q), 1), TOL)


def test_scratch_is_quadratic_or_linear():
    assert attention.path("online").scratch_bytes(1, 4096, 1) == 2 * 4 * 4096
    assert attention.path("naive").scratch_bytes(1, 4096, 1) == 2 * 4 * 4096 * 4096
    assert attention.path("fused_sv").scratch_bytes(2, 10, 3) == 2 * 4 * 2 * 3 * 100


def test_naive_splits_heads_over_the_binding_limit(gpu, plan, monkeypatch):
    """With a binding too small for all heads' T x T, the naive path runs head chunks."""
    B, T, C, H = 1, 40, 12, 3
    monkeypatch.setitem(gpu.limits, "max-storage-buffer-binding-size", 4 * T * T + 16)
    assert len(head_chunks(B, T, H, gpu.max_binding)) == 3
    q, k, v, do = _inputs(B, T, C, 2)
    f = lambda a: a.astype(np.float64)
    kn = Kernels(gpu, plan)
    check("naive in 3 head chunks out", attention.forward(kn, q, k, v, H, "naive"), RA.attention_forward(f(q), f(k), f(v), H), TOL)
    dq, _, _ = attention.backward(kn, q, k, v, do, H, "naive")
    check("naive in 3 head chunks dq", dq, RA.attention_backward(f(q), f(k), f(v), f(do), H)[0], TOL)


@pytest.mark.parametrize("variant", ["sg", "tiles"])
@pytest.mark.parametrize("half", ["bf16", "f16"])
@pytest.mark.parametrize("B,T,C,H", [(2, 7, 16, 2), (1, 65, 48, 2), (2, 33, 40, 8), (1, 64, 128, 1)])
def test_online_reads_half_q_k_v(gpu, plan, B, T, C, H, half, variant):
    """A bf16 or f16 model's q, k, v read by online_sg.wgsl (whole words) and online.wgsl (by
    element; tiles of 16 query and 8 key rows, so T crosses several) as stored, two to a word: out,
    dq, dk, dv against the float64 reference on the same 16-bit values, with float32's tolerance
    (hd 8, 24, 5 (the unaligned gather) and 128)."""
    from tinygpt.reference import kernels as R
    if variant == "sg" and plan.attention != "sg":
        pytest.skip("online_sg.wgsl needs subgroups that pass the plan's check")
    plan = plan.with_(attention=variant, online_block=(16, 8))
    online = attention.path("online")
    assert online.reads(half, plan, B, T, C, H)
    att = online.bind(Kernels(gpu, plan), B, T, C, H, online.own_scratch(gpu, B, T, H))
    q, k, v, do = _inputs(B, T, C, 3)
    cast, back = (R.cast_bf16, R.cast_f32) if half == "bf16" else (R.cast_f16, R.cast_f16_to_f32)
    packed = [cast(x) for x in (q, k, v)]
    f = lambda a: back(a, B * T * C).reshape(B, T, C).astype(np.float64)
    qb, kb, vb = (f(x) for x in packed)
    tq, tk, tv = (gpu.tensor(((B * T * C) // 2,), half, data=x) for x in packed)
    out, dq, dk, dv = (gpu.tensor((B, T, C)) for _ in range(4))
    gpu.run(att.forward(tq, tk, tv, out) + att.backward(tq, tk, tv, out, gpu.upload(do), dq, dk, dv))
    check(f"online {variant} {half} out B={B} T={T} C={C} H={H}", gpu.read(out), RA.attention_forward(qb, kb, vb, H), TOL)
    for name, got, want in zip(("dq", "dk", "dv"), (dq, dk, dv), RA.attention_backward(qb, kb, vb, do.astype(np.float64), H)):
        check(f"online {variant} {half} {name}", gpu.read(got), want, TOL)


@pytest.mark.parametrize("variant", ["sg", "tiles"])
@pytest.mark.parametrize("B,T,C,H,window,half", [(2, 7, 16, 2, 0, None), (1, 65, 48, 2, 0, None),
                                                 (2, 33, 64, 1, 5, None), (1, 40, 256, 2, 0, None),
                                                 (2, 9, 32, 2, 0, "bf16")])
def test_online_turns_dq_and_dk_back(gpu, plan, B, T, C, H, window, half, variant):
    """A rotary model's dq and dk turned back where online_sg.wgsl and online.wgsl (tiles of 16
    query and 8 key rows, so T crosses several) store them (the _rope entries): against the float64
    reference's dq, dk turned back by rope_backward, dv untouched; hd 8, 24, 64 (with a sliding
    window) and 128, and q, k, v read as bf16. Where hd is not a multiple of 8, turns_back says no
    and the block keeps rope_backward's pass."""
    from tinygpt.core.rope import rope_table
    from tinygpt.model.block import Rotary
    from tinygpt.reference import kernels as R
    if variant == "sg" and plan.attention != "sg":
        pytest.skip("online_sg.wgsl needs subgroups that pass the plan's check")
    kn, online, hd = Kernels(gpu, plan.with_(attention=variant)), attention.path("online"), C // H
    att = attention.Attention(online, kn, (B, T, C, H), online.own_scratch(gpu, B, T, H), window, (16, 8))
    table = rope_table(T + 3, hd, 10000.0)
    rot = Rotary(gpu.upload(table), T, hd)
    assert att.turns_back(rot)
    assert not attention.Attention(online, kn, (B, T, 24, 2), {}, 0).turns_back(Rotary(rot.cs, T, 12))
    q, k, v, do = _inputs(B, T, C, 5)
    if half:
        packed = [R.cast_bf16(x) for x in (q, k, v)]
        q, k, v = (R.cast_f32(x, B * T * C).reshape(B, T, C) for x in packed)
        tq, tk, tv = (gpu.tensor(((B * T * C) // 2,), half, data=x) for x in packed)
    else:
        tq, tk, tv = (gpu.upload(x) for x in (q, k, v))
    out, dq, dk, dv = (gpu.tensor((B, T, C)) for _ in range(4))
    gpu.run(att.forward(tq, tk, tv, out) + att.backward(tq, tk, tv, out, gpu.upload(do), dq, dk, dv, rot=rot))
    f = lambda a: np.asarray(a, np.float64)
    rdq, rdk, rdv = RA.attention_backward(f(q), f(k), f(v), f(do), H, window=window or None)
    back = lambda g: R.rope_backward(f(table), g.reshape(B * T, C), T, hd).reshape(B, T, C)
    tag = f"online {variant} turned back B={B} T={T} C={C} H={H} window={window} {half or 'f32'}"
    check(f"{tag} dq", gpu.read(dq), back(rdq), TOL)
    check(f"{tag} dk", gpu.read(dk), back(rdk), TOL)
    check(f"{tag} dv", gpu.read(dv), rdv, TOL)
