"""The numerics check of a half precision: before the first step, every kernel a model recorded that
reads or writes f16 runs once at a ragged shape on this device, against its NumPy twin.

WGSL's f16 is an optional feature, and how a driver rounds it, flushes its subnormals or widens
its products is the driver's; a kernel that disagrees with its twin is refused in one line that
names it and the error, before anything is trained (TinyGPT checks each of its fast paths against
f32 on the device at start-up the same way). This module and the tuner are the runtime's two
users of the reference: both judge a kernel before it is trusted. A verdict is reached once per
device, kernel and override constants.
"""
from __future__ import annotations

import re
import weakref

import numpy as np

from ..core.activations import ACTIVATIONS
from ..core.precision import PRECISIONS
from ..core.rope import rope_table

from ..reference import attention as RA
from ..reference import kernels as R
from .gpu import DTYPES, GPU, GPUError
from .kernels import DECODE_UNIFORM_BYTES, Kernels, decode_uniform
from .plan import PORTABLE

TOL = 2e-3           # of the twin's largest magnitude: a broken kernel is off by far more, a rounding by less
_VERDICTS = weakref.WeakKeyDictionary()     # device -> {(entry, constants): None or why not}
# The stored type this check's cases are written for: f16's, the one precision that needs a device
# feature. Its entry points are named as any type's (an activation's, the norm's forward: the type is
# a section of their file), so a precision storing another type is refused whole, not judged by
# cases of f16's kernels.
CASES = DTYPES["f16"]


class NumericsError(GPUError):
    """A kernel of the asked precision disagrees with its twin on this device."""


def half_kernels(dispatches, dtype: str = "f16") -> set:
    """(entry, constants) of the dispatches that read or write `dtype` (a precision's stored type):
    every one that binds a tensor of it, those built with a file's section tagged with its name
    (decode.wgsl's attention, the activations, ...), the matmul templates completed with its
    products (named as their twins are: matmul_atb_f16, matmul_f16_tiled, matmul_f16_quad_sg; they
    take float32 gradients rounded to it as read) and the attention's with its constant (F16)."""
    dt = DTYPES[dtype]
    consts = {(dt.flag, True)} if dt.packed else set()
    own = lambda k: dtype in k.tags or bool(consts & set(k.constants)) or _own_products(k, dt)
    return {(typed_name(d.kernel, dt), d.kernel.constants) for d in dispatches if dtype in d.dtypes or own(d.kernel)}


def _own_products(kernel, dt) -> bool:
    """Whether a template kernel was completed with `dt`'s products, where those are not float32's."""
    return dt.products != DTYPES["f32"].products and kernel.products == dt.products


def typed_name(kernel, dt=DTYPES["f16"]) -> str:
    """A template's entry point with the type of its products after the product's name
    (matmul_abt_tiled -> matmul_abt_f16_tiled, matmul_quad_sg -> matmul_f16_quad_sg: the twin's name)
    where they are `dt`'s; any other kernel's entry point."""
    if not _own_products(kernel, dt):
        return kernel.name
    op = re.match(r"matmul(_abt|_atb)?(_rope)?", kernel.name)[0]
    return op + "_" + dt.name + kernel.name[len(op):]


def _far(got, want) -> float | None:
    """The error where it exceeds TOL of the twin's scale (an inf where the twin has none too), else None."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if not np.array_equal(np.isinf(got), np.isinf(want)) or np.isnan(got).any():
        return float("inf")
    fin = np.isfinite(want)
    err = float(np.abs(got[fin] - want[fin]).max()) if fin.any() else 0.0
    return err if err > TOL * max(float(np.abs(want[fin]).max()) if fin.any() else 0.0, 1e-3) else None


def _matmul(gpu: GPU, kn: Kernels, entry: str, consts: dict, rng):
    """matmul(_abt, _atb)_f16(_quad_vec4, _quad_sg, _tiled) with its operand mix (and tile), at a
    ragged shape its variant takes. Every template says a half operand with A_HALF, B_HALF, OUT_HALF."""
    variant = entry.rsplit("_", 1)[1] if entry.endswith(("_vec4", "_sg", "_tiled")) else "scalar"
    base = entry.removesuffix("_" + variant).removesuffix("_quad").removesuffix("_f16")
    half = [bool(consts.get(n)) for n in ("A_HALF", "B_HALF", "OUT_HALF")]
    atb = base == "matmul_atb"
    if variant == "tiled":
        kn = Kernels(gpu, PORTABLE.with_(matmul_tile=tuple(consts[n] for n in ("WX", "WY", "TM", "TV", "BK"))))
    if variant != "scalar":     # vec4 along M and N of A^T @ B (the f16 kernels: any K; the tiled: 4 | K)
        M, N, K = (20 if atb else 19, 36, 11 if atb and variant != "tiled" else 12)
    else:
        M, N, K = (13, 10, 9)
    shape_a = {"matmul": (M, K), "matmul_abt": (M, K), "matmul_atb": (K, M)}[base]
    shape_b = {"matmul": (K, N), "matmul_abt": (N, K), "matmul_atb": (K, N)}[base]
    a, b = rng.standard_normal(shape_a).astype(np.float32), rng.standard_normal(shape_b).astype(np.float32)
    store = lambda x, h: gpu.tensor((-(-x.size // 2),), "f16", data=R.cast_f16(x)) if h else gpu.upload(x)
    A, B = store(a, half[0]), store(b, half[1])
    out = gpu.tensor((M * N // 2,), "f16") if half[2] else gpu.tensor((M, N))
    launch = getattr(kn, base)
    args = (A, B, None, out) if base == "matmul" else (A, B, out)
    gpu.run([launch(*args, M, N, K, variant=variant, dtype="f16")])
    got = R.cast_f16_to_f32(gpu.read(out), M * N).reshape(M, N) if half[2] else gpu.read(out)
    return got, getattr(R, base + "_f16")(a, b)


def _elementwise(gpu: GPU, kn: Kernels, entry: str, rng):
    n, rows, C = 36, 7, 12
    x = (rng.standard_normal(n) * 3).astype(np.float32)
    xh = gpu.tensor((n // 2,), "f16", data=R.cast_f16(x))
    if entry == "cast_f16":
        x[:3] = [70000.0, -1e6, 3e-8]               # past f16's range both ways, and a subnormal's underflow
        out = gpu.tensor((n // 2,), "f16")
        gpu.run([kn.cast_f16(gpu.upload(x), out, n)])
        return R.cast_f16_to_f32(gpu.read(out), n), R.f16_round(x)
    if entry == "cast_f16_to_f32":
        out = gpu.tensor((n,))
        gpu.run([kn.cast_f16_to_f32(xh, out, n)])
        return gpu.read(out), R.cast_f16_to_f32(R.cast_f16(x), n)
    name, _, way = entry.rpartition("_")
    act = ACTIVATIONS.get(name) if way in ("forward", "backward") else None
    if act is not None:         # any activation's room, stored f16: its entry points against its twins
        if way == "forward":
            out = gpu.tensor((n // 2,), "f16")
            gpu.run([kn.act_forward(act, xh, out, n)])
            return R.unpack_f16(gpu.read(out)), R.unpack_f16(R.stored_forward(act.forward, R.cast_f16(x), "f16"))
        dy, out = rng.standard_normal(n).astype(np.float32), gpu.tensor((n,))
        gpu.run([kn.act_backward(act, xh, gpu.upload(dy), out, n)])
        return gpu.read(out), R.stored_backward(act.backward, R.cast_f16(x), dy.astype(np.float64), "f16")
    if entry in ("rope_forward", "rope_backward"):      # q or k stored f16, turned in place (the F16 flag)
        rows, T, hd, C, offset = 10, 5, 4, 12, 3
        table = rope_table(T + offset, hd, 10000.0)
        xh = R.cast_f16(rng.standard_normal((rows, C)).astype(np.float32))
        t = gpu.tensor(np.shape(xh), "f16", data=xh)
        gpu.run([getattr(kn.rope, entry)(gpu.upload(table), t, rows, T, C, hd, offset)])
        want = getattr(R, entry)(table.astype(np.float64), R.unpack_f16(xh).reshape(rows, C), T, hd, offset)
        return R.unpack_f16(gpu.read(t)).reshape(rows, C), want
    if entry == "qk_norm_rope":
        return _qk_norm_rope(gpu, kn, rng)
    if entry in ("swiglu_forward", "swiglu_backward"):      # gate and up stored f16 (the F16 flag)
        g, u = (rng.standard_normal(n).astype(np.float32) * 3 for _ in range(2))
        gh, uh = gpu.tensor((n // 2,), "f16", data=R.cast_f16(g)), gpu.tensor((n // 2,), "f16", data=R.cast_f16(u))
        gv, uv = R.unpack_f16(R.cast_f16(g)), R.unpack_f16(R.cast_f16(u))
        if entry == "swiglu_forward":
            out = gpu.tensor((n // 2,), "f16")
            gpu.run([kn.swiglu_forward(gh, uh, out, n)])
            return R.unpack_f16(gpu.read(out)), R.swiglu_forward(gv, uv)
        dy = rng.standard_normal(n).astype(np.float32)
        dg, du = gpu.tensor((n,)), gpu.tensor((n,))
        gpu.run([kn.swiglu_backward(gh, uh, gpu.upload(dy), dg, du, n)])
        return np.concatenate([gpu.read(dg), gpu.read(du)]), np.concatenate(R.swiglu_backward(gv, uv, dy))
    if entry == "kv_expand":                        # f16 k or v copied to their query heads: word for word
        src = gpu.tensor((rows, 2), "f16", data=R.cast_f16(rng.standard_normal((rows, 4)).astype(np.float32)))
        out = gpu.tensor((rows, 6), "f16")
        gpu.run([kn.kv_expand(src, out, rows, 6, 2, 2)])
        return R.unpack_f16(gpu.read(out)), R.unpack_f16(R.kv_expand(gpu.read(src), 6, 2))
    if entry == "layernorm_forward4":               # y stored f16 (the file's f16 section, at the vec4 width)
        xs, gb = rng.standard_normal((rows, C)).astype(np.float32), rng.standard_normal((2, C)).astype(np.float32)
        y, stats = gpu.tensor((rows, C // 2), "f16"), gpu.tensor((2, rows))
        gpu.run([kn.layernorm_forward(gpu.upload(xs), gpu.upload(gb), y, stats, rows, C)])
        want = R.layernorm_forward(xs.astype(np.float64), gb[0], gb[1])[0]
        return R.unpack_f16(gpu.read(y)), want
    raise NoCheck(entry)


def _qk_norm_rope(gpu: GPU, kn: Kernels, rng):
    """q or k normed and turned as it is written, as f16 (the F16 flag), at a ragged shape."""
    rows, T, hd, C, offset = 10, 5, 4, 12, 3
    table, gain = rope_table(T + offset, hd, 10000.0), rng.standard_normal(hd).astype(np.float32)
    xr = rng.standard_normal((rows, C)).astype(np.float32)
    t, stats = gpu.tensor((rows, C // 2), "f16"), gpu.tensor((2, rows * C // hd))
    gpu.run([kn.rope.qk_norm_rope(gpu.upload(table), gpu.upload(xr), gpu.upload(gain), t, stats, rows, T, C, hd,
                                  offset)])
    want = R.qk_norm_rope(table.astype(np.float64), xr.astype(np.float64), gain.astype(np.float64), T, hd, offset)[0]
    return R.unpack_f16(gpu.read(t)).reshape(rows, C), want


class NoCheck(Exception):
    """A kernel of the precision that this check has no case for."""


def _attention(gpu: GPU, plan, rng, variant: str):
    """online_sg.wgsl ("sg") or online.wgsl ("tiles") reading f16 q, k, v: forward and backward
    (out, dq, dk, dv) at a ragged T."""
    from_plan = Kernels(gpu, plan)
    B, T, C, H = 1, 13, 16, 2
    q, k, v, do = (rng.standard_normal((B, T, C)).astype(np.float32) for _ in range(4))
    hq = [R.cast_f16(x) for x in (q, k, v)]
    tq, tk, tv = (gpu.tensor((B * T * C // 2,), "f16", data=x) for x in hq)
    f = [R.cast_f16_to_f32(x, B * T * C).reshape(B, T, C).astype(np.float64) for x in hq]
    L, D = gpu.tensor((B, H, T)), gpu.tensor((B, H, T))
    out, dq, dk, dv = (gpu.tensor((B, T, C)) for _ in range(4))
    tdo = gpu.upload(do)
    gpu.run([from_plan.attention.attn_online_forward(tq, tk, tv, out, L, B, T, C, H, variant=variant),
             from_plan.attention.attn_online_d(tdo, out, D, B, T, C, H),
             from_plan.attention.attn_online_dq(tq, tk, tv, tdo, L, D, dq, B, T, C, H, variant=variant),
             from_plan.attention.attn_online_dkv(tq, tk, tv, tdo, L, D, dk, dv, B, T, C, H, variant=variant)])
    got = np.concatenate([gpu.read(t).ravel() for t in (out, dq, dk, dv)])
    want = np.concatenate([RA.attention_forward(*f, H).ravel()] +
                          [g.ravel() for g in RA.attention_backward(*f, do.astype(np.float64), H)])
    return got, want


def _decode(gpu: GPU, kn: Kernels, rng, wide: bool):
    """decode.wgsl's f16 cache: kv_append (its words) then attn_decode with its f16 section (head dim
    5, a ragged T), or where wide attn_decode4 with it (head dim 8: the launcher's choice for a
    multiple of 8)."""
    N, T, C, H, pos = 2, 9, 32 if wide else 20, 4, 6
    f = lambda *s: R.cast_f16(rng.standard_normal(s).astype(np.float32)).reshape(*s[:-1], s[-1] // 2)
    k, v, q, kc0, vc0 = f(N, C), f(N, C), f(N, C), f(N, T, C), f(N, T, C)
    u = gpu.uniform(DECODE_UNIFORM_BYTES)
    gpu.write_uniform(u, decode_uniform(N, T, C, H, pos, 0, 1, 1))
    up = lambda x: gpu.tensor(x.shape, "f16", data=x)
    kc, vc, out, scratch = up(kc0), up(vc0), gpu.tensor((N, C)), gpu.tensor((N, H, T))
    gpu.run([kn.decoding.kv_append(up(k), up(v), kc, vc, N, C, u),
             kn.decoding.attn_decode(up(q), kc, vc, out, scratch, N, H, u)])
    want_kc, want_vc = R.kv_append(k, v, kc0, vc0, pos)
    got = np.concatenate([R.unpack_f16(gpu.read(kc)).ravel(), R.unpack_f16(gpu.read(vc)).ravel(),
                          gpu.read(out).ravel()])
    want = np.concatenate([R.unpack_f16(want_kc).ravel(), R.unpack_f16(want_vc).ravel(),
                           R.stored_attn_decode(q, want_kc, want_vc, pos, H, "f16").ravel()])
    return got, want


def check(gpu: GPU, plan, kernels: set, precision: str = "f16"):
    """Run each (entry, constants) of `kernels` against its twin, once per device; NumericsError names
    the first that disagrees (or fails to run, or has no check here: a kernel of a precision that
    needs a device feature is never trusted unjudged)."""
    seen = _VERDICTS.setdefault(gpu, {})
    if kernels and DTYPES[PRECISIONS[precision].stored] is not CASES:
        first = min(e for e, _ in kernels)
        raise NumericsError(f"{{opt:precision}} {precision}: the kernel {first} has no case in the numerics check "
                            "(device/numerics.py: its cases are f16's), so it is not trusted on this device; use "
                            "{opt:precision} fp32 (or write its cases)")
    kn = Kernels(gpu, PORTABLE)
    for entry, consts in sorted(kernels, key=str):
        key = ("attention", "sg" if entry.endswith("_sg") else "tiles") if entry.startswith("attn_online") else \
            ("decode", ()) if entry in ("kv_append", "attn_decode") else \
            ("decode", "wide") if entry == "attn_decode4" else (entry, consts)
        if key not in seen:
            rng = np.random.default_rng(11)
            try:
                if key[0] == "attention":
                    got, want = _attention(gpu, plan, rng, key[1])
                elif key[0] == "decode":
                    got, want = _decode(gpu, kn, rng, key[1] == "wide")
                elif "matmul" in entry:
                    got, want = _matmul(gpu, kn, entry, dict(consts), rng)
                else:
                    got, want = _elementwise(gpu, kn, entry, rng)
                err = _far(got, want)
                seen[key] = None if err is None else f"max error {err:.3g} against {TOL:g} of its scale"
            except GPUError as e:
                seen[key] = f"it does not run here: {str(e).splitlines()[0][:160]}"
            except NoCheck:
                raise NumericsError(f"{{opt:precision}} {precision}: the kernel {entry} has no case in the numerics "
                                    "check (device/numerics.py), so it is not trusted on this device; use "
                                    "{opt:precision} fp32 (or write its case)") from None
        if seen[key]:
            flags = [n for n, v in consts if v is True]
            what = entry + (f" ({', '.join(flags)})" if flags else "")
            raise NumericsError(f"{{opt:precision}} {precision}: the kernel {what} disagrees with its NumPy twin on "
                            f"{gpu.name}: {seen[key]}; use {{opt:precision}} bf16 or fp32")
