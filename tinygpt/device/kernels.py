"""The launchers: one method per WGSL entry point, its bindings and its grid.

The only place that knows binding numbers. `Kernels(gpu, plan)` is one device's launchers under
one kernel plan, made by the caller and handed down; nothing here makes or defaults a plan. Each
launcher builds its bind group once and returns a Dispatch that the caller replays every step.
Arguments follow the NumPy twin of the same name: inputs in binding order, then outputs, then
sizes. None stands for an absent optional binding (gpu.dispatch binds a dummy there). Which
variant runs: `variant=` forces one (tests and benchmarks); otherwise the plan's choice for the
family, where the shape allows it.

bf16 and f16 tensors (dtypes "bf16", "f16") hold two values a word. One matmul family serves every
precision: it reads either operand as stored or as float32, as each tensor's dtype says, writes
the half type where `out` is such a tensor, and takes its products as the precision does.
"""
from __future__ import annotations

import math
import struct

from .gpu import DTYPES, GPU, HALVES, PER_WORD, Dispatch, Fill, grid1d, pack_uniform, products
from .plan import KernelPlan, online_tiles, tile_problem

MM_TILE = 4 * 8      # scalar kernels: rows (and cols) of output per workgroup, TM * WG
VEC_ROWS = 16        # rows per workgroup of the vec4 kernels (the sg ones: sg_tile)
SG_LANES = 8         # invocations per workgroup of the sg kernels (one subgroup)
ROWS_MOST = 4        # the most rows matmul_words.wgsl takes (its MR)
ROWS_LANES = 8       # invocations per workgroup of matmul_words.wgsl
# The widths of the shaders written once for both (layernorm.wgsl, elementwise.wgsl, grad_norm.wgsl):
# the element type V, W floats in it, hsum (the sum of its lanes), the entry points' suffix {{VEC}}.
# to4 and from4 carry a V to 4 lanes and back (an activation's act4, at either width).
WIDTH_WGSL = {"scalar": "alias V = f32;\nconst W = 1u;\nfn hsum(v: f32) -> f32 { return v; }\n"
                        "fn to4(v: f32) -> vec4<f32> { return vec4<f32>(v); }\n"
                        "fn from4(v: vec4<f32>) -> f32 { return v.x; }\n",
              "vec4": "alias V = vec4<f32>;\nconst W = 4u;\n"
                      "fn hsum(v: vec4<f32>) -> f32 { return (v.x + v.y) + (v.z + v.w); }\n"
                      "fn to4(v: V) -> vec4<f32> { return v; }\nfn from4(v: vec4<f32>) -> V { return v; }\n"}


def width(variant: str, *tags: str) -> Fill:
    """What completes such a shader at a width ("scalar", "vec4"), with its sections of that width
    and of `tags` kept ("sg": subgroups, "f16": WGSL's f16)."""
    return Fill(f"the {variant} width", WIDTH_WGSL[variant], (("VEC", "4" if variant == "vec4" else ""),),
                frozenset((variant,) + tags))


SUBGROUPS = Fill("subgroups", tags=frozenset({"sg"}))   # a file's sg section kept: its subgroup kernels
F16 = Fill("f16", tags=frozenset({"f16"}))               # its f16 section: the kernels of WGSL's f16
# a file's section of a stored type (f32, bf16, f16): how its kernels read and write that type
STORED = {n: Fill(f"stored as {n}", tags=frozenset({n})) for n in ("f32", "bf16", "f16")}
# a file's DOCS section: packed windows, several records to a window, each attending within itself
# and its positions restarting at 0 (docs: each row's position in its record, u32 [rows])
DOCS = Fill("packed windows", tags=frozenset({"DOCS"}))


def _docs(access: str, tensors: list, docs) -> tuple:
    """(access, tensors, fill) with the rows' positions in their records bound last where docs is given."""
    return (access + "r", list(tensors) + [docs], DOCS) if docs is not None else (access, list(tensors), None)


# elementwise.wgsl's activations on a 16-bit type: the values of its section's unit (one vector
# load), a multiple of which n must be; float32's unit is its width's
ACT_UNIT = {"bf16": 8, "f16": 4}
CHUNK = 4096         # floats per partial sum of the gradient norm (optim.wgsl)
NO_CLIP = 3.0e38     # a clip threshold no norm reaches
DECODE_ACCESS = "urrrrwww"     # decode.wgsl's bindings: uniform | a b c ids_in | o1 o2 ids_out
DECODE_UNIFORM_BYTES = 80


# ---- shape rules: which variant a shape allows -----------------------------------------------------
def vec4_ok(entry, M, N, K) -> bool:
    """The vec4, sg and tiled kernels need K and N (and M for A^T @ B) to be multiples of 4."""
    return N % 4 == 0 and K % 4 == 0 and (M % 4 == 0 or entry != "matmul_atb")


def half_ok(entry, M, N, K) -> bool:
    """matmul_words.wgsl reads 8 bf16 at a time: K and N multiples of 8 (M too for A^T @ B)."""
    return N % 8 == 0 and K % 8 == 0 and (M % 8 == 0 or entry != "matmul_atb")


def rows_ok(plan: KernelPlan, entry, M, N, K) -> bool:
    """matmul_words.wgsl takes A @ B and A @ B^T of at most plan.few_rows rows (and at most 4), K a
    multiple of 8, N of 8 (A @ B) or 4 (A @ B^T)."""
    return (entry != "matmul_atb" and 0 < M <= min(plan.few_rows, ROWS_MOST) and K % 8 == 0
            and N % (8 if entry == "matmul" else 4) == 0)


def _word_flags(a, b, out) -> dict:
    """matmul_words.wgsl's constants for these operands: A_F32, B_F32 where they are not packed,
    OUT_BF16 where out is."""
    packed = [DTYPES[t.dtype].packed for t in (a, b, out)]
    return {n: True for n, on in zip(("A_F32", "B_F32", "OUT_BF16"), (not packed[0], not packed[1], packed[2])) if on}


def _template_bindings(a, b, bias, out) -> tuple:
    """The matmul templates' constants and bindings (products.wgsl says which): a float32 operand
    at A or B, a half one at AH or BH (A_HALF, B_HALF), out at out or OH (OUT_HALF); the other
    binding of each pair gets a dummy."""
    half = {"A_HALF": a.dtype in HALVES, "B_HALF": b.dtype in HALVES, "OUT_HALF": out.dtype in HALVES}
    pick = lambda t, on: t if on else None
    return ({n: True for n, on in half.items() if on},
            [pick(a, not half["A_HALF"]), pick(b, not half["B_HALF"]), pick(a, half["A_HALF"]),
             pick(b, half["B_HALF"]), bias, pick(out, not half["OUT_HALF"]), pick(out, half["OUT_HALF"])])


def quad_ok(entry, M, N, K) -> bool:
    """matmul_quad.wgsl's kernels read vec4 along K and N of A @ B and A @ B^T,
    along M and N of A^T @ B (whose k advances one row at a time: any K)."""
    return N % 4 == 0 and (M % 4 == 0 if entry == "matmul_atb" else K % 4 == 0)


class MatmulSet:
    """A stored type's own fast matmul kernels, beside the templates every type shares (scalar:
    matmul.wgsl, any shape; tiled: matmul_tiled.wgsl), completed with its DType's products. One
    per type in MATMULS: `variant` is which kernel a plan and a shape take, `launch` the Kernels
    method that binds it (given the variant, the shape, the uniform: whole where `batched`, else
    its first five values, and the stored type); `batched`: whether its kernels take a batch of
    products in one dispatch."""
    batched = False
    launch = ""

    def variant(self, plan: KernelPlan, entry, M, N, K) -> str:
        raise NotImplementedError

    def takes(self, entry, a, b, out) -> bool:
        """Whether its kernels take these operands' types (else the shared templates serve them)."""
        return True


class F32Matmuls(MatmulSet):
    """float32: scalar, vec4 (matmul_vec4.wgsl), sg (its sg section) or tiled, as the plan says."""
    batched, launch = True, "_mm_f32"

    def variant(self, plan, entry, M, N, K):
        if rows_ok(plan, entry, M, N, K):
            return "rows"
        return plan.matmul if vec4_ok(entry, M, N, K) else "scalar"


class BF16Matmuls(MatmulSet):
    """bf16: tiled; sg (matmul_words.wgsl: K and N multiples of 8) for sg, and for vec4 (which has
    no bf16 form) where subgroups work; scalar otherwise."""
    launch = "_mm_words_sg"

    def variant(self, plan, entry, M, N, K):
        if rows_ok(plan, entry, M, N, K):
            return "rows"
        if plan.matmul == "tiled" and vec4_ok(entry, M, N, K):
            return "tiled"
        return "sg" if subgroups_on(plan) and half_ok(entry, M, N, K) else "scalar"

    def takes(self, entry, a, b, out):
        return entry != "matmul_abt" or DTYPES[b.dtype].packed      # B of A @ B^T is read 8 packed at a time


class F16Matmuls(MatmulSet):
    """f16: tiled (the template with f16 products); sg (the matmul_quad.wgsl template's sg section,
    f16 products) where the plan's matmuls take subgroups (sg, or vec4 with subgroups that passed
    the check); vec4 (matmul_quad.wgsl's vec4 kernels) otherwise."""
    launch = "_mm_quad"

    def variant(self, plan, entry, M, N, K):
        if plan.matmul == "tiled" and vec4_ok(entry, M, N, K):
            return "tiled"
        if not quad_ok(entry, M, N, K):
            return "scalar"
        return "sg" if subgroups_on(plan) else "vec4"


MATMULS = {"f32": F32Matmuls(), "bf16": BF16Matmuls(), "f16": F16Matmuls()}   # keyed as gpu.DTYPES


def subgroups_on(plan: KernelPlan) -> bool:
    """Whether the plan's matmuls take subgroups: sg, or vec4 with subgroups that passed the check."""
    return plan.matmul in ("sg", "vec4") and plan.subgroups == "ok"


def matmul_variant(plan: KernelPlan, entry, M, N, K, dtype: str = "f32") -> str:
    """The plan's matmul family (plan.matmul) in a stored type's form, where the shape allows it;
    "scalar" (the matmul.wgsl template: any shape, every type) where it does not."""
    return MATMULS[dtype].variant(plan, entry, M, N, K)


def sg_blocks(N, most=3) -> int:
    """Column blocks per lane of the sg kernels: 2 or 3 (about equally fast, both faster than 1 on
    lavapipe: docs/kernels.md) unless that leaves over 1/8 of the lanes computing columns past N;
    2 first, having fewer accumulators to spill. N = 96: 24 vec4 columns fill 1 workgroup of 3
    blocks exactly."""
    n4 = N // 4
    for nc in (2, 3)[:most - 1]:
        if -(-n4 // (8 * nc)) * 8 * nc - n4 <= n4 // 8:
            return nc
    return 1


def sg_tile(M, N) -> tuple:
    """(rows per workgroup, column blocks per lane) of an sg matmul. 32 rows where M wastes at most
    1/8 of them (faster for all three products on lavapipe: docs/kernels.md), with at most 2
    column blocks (2 x 32 rows already spill); else 16."""
    if -(-M // 32) * 32 - M <= M // 8:
        return 32, sg_blocks(N, most=2)
    return 16, sg_blocks(N)


def bf16_blocks(N) -> int:
    """Column blocks of 4 per lane of matmul_words.wgsl: 2 (64-column workgroups) unless that
    leaves over 1/8 of the lanes past N, as N = 96 does; then 1 (32 columns: 96 in 3 exactly)."""
    n8 = N // 8
    return 2 if -(-n8 // 8) * 8 - n8 <= n8 // 8 else 1


def bf16_rows(M) -> int:
    """Rows per workgroup of matmul_words.wgsl's A @ B and A @ B^T: 64 (each B word loaded for
    twice the rows) unless that leaves over 1/8 of the rows past M; then 32."""
    return 64 if -(-M // 64) * 64 - M <= M // 8 else 32


def online_variant(plan: KernelPlan, T=0, hd=0) -> str:
    """The plan's online attention variant; sg also has to stay under llvmpipe's loop cap, where
    a lane makes up to 6 * ceil(hd / 32) + 2 loop trips per block of 8 rows (T up to ~20,000
    at hd = 128); past it, the tiles."""
    trips = -(-T // SG_LANES) * (6 * -(-hd // 32) + 2)
    fits = plan.loop_cap is None or trips <= plan.loop_cap
    return "sg" if plan.attention == "sg" and fits else "tiles"


OPTIM_UNIFORM_BYTES = 32   # optim.wgsl's Params: six 4-byte fields, padded to 16 bytes

# The gate (grad_norm.wgsl's grad_clip writes it, every optimizer reads it): the slot of each
# value, all float32 (counts exact to 2^24). The loss scaler's state lives here too; GradScaler's
# defaults: PyTorch's.
GATE = {"norm": 0, "factor": 1, "scale": 2, "skip": 3, "clean": 4, "skipped": 5, "taken": 6}
GATE_FLOATS = 8
LOSS_SCALE = 65536.0       # the initial scale (the loss_scale option's default)
SCALE_GROWTH = 2000        # clean steps in a row before the scale doubles


def optim_uniform(n: int, lr: float, k0: float, k1: float = 0.0, k2: float = 0.0, first: int = 0) -> bytes:
    """optim.wgsl's Params: n, lr, the optimizer's three constants (its room's `constants`: AdamW's
    beta1, beta2, eps), and the chunk's first decay block in the whole decay table. The step
    count lives in the gate, on the device."""
    return pack_uniform((int(n), float(lr), float(k0), float(k1), float(k2), int(first)))


def decode_uniform(N, T, C, H, pos, step, V, VP, top_k=0, row0=0, row_stride=1, seed=0, temperature=0.0,
                   top_p=1.0, v0=0, vn=None, KV=None) -> bytes:
    """decode.wgsl's Params, rewritten before each token; v0, vn: the token rows embed_decode's
    table binding holds (all VP by default); KV: the key/value heads of the caches (H by default)."""
    seed = int(seed) & (2 ** 64 - 1)
    return pack_uniform((N, T, C, H, pos, step, V, VP, int(top_k or 0), row0, row_stride, seed & 0xFFFFFFFF,
                        seed >> 32, float(temperature), float(top_p), 1.0 / math.sqrt(C // H),
                        v0, VP if vn is None else vn, H if KV is None else KV))


# The entries that turn by position, and the word of their Params that holds the position offset,
# which a decode step rewrites per token: rope.wgsl's, and the turned matmuls (matmul_vec4.wgsl's,
# matmul_tiled.wgsl's).
ROPE_TURNS = {"rope_forward": 4, "qk_norm_rope": 4, **{e + v: 10 for e in ("matmul_rope", "matmul_abt_rope")
                                                      for v in ("_vec4", "_sg", "_tiled")}}


def rope_at(packed: bytes, offset: int, word: int = 4) -> bytes:
    """A turning dispatch's Params as it packed them, with the position offset (at `word`) replaced."""
    return packed[:4 * word] + struct.pack("<I", offset) + packed[4 * word + 4:]


def windowed(window: int, T: int | None = None) -> dict:
    """The attention kernels' WINDOW constant: only for a window that masks something (0, or one
    at least T, is plain causal attention and keeps the pipeline it always had)."""
    return {"WINDOW": int(window)} if window and (T is None or window < T) else {}


def batch_stride(n: int) -> int:
    """Floats from one matrix of a batch to the next (batched matmuls, muon_normalize, ns_mix): n
    rounded up to 64, 256 bytes, any adapter's storage offset alignment, so that each matrix can
    also be bound alone (Muon's momentum writes it, its update reads it)."""
    return -(-n // 64) * 64


class Kernels:
    """One device's launchers under one kernel plan: its own (the products, the casts, the
    elementwise ops and activations, the norms, the gated MLP's, the heads' and the tables'), and
    one object per other family (Family): rope, losses, optim, attention, decoding."""

    def __init__(self, gpu: GPU, plan: KernelPlan):
        self.gpu, self.plan = gpu, plan
        self.rope = RopeKernels(gpu, plan)
        self.losses = LossKernels(gpu, plan)
        self.optim = OptimKernels(gpu, plan)
        self.attention = AttentionKernels(gpu, plan)
        self.decoding = DecodeKernels(gpu, plan)

    # ---- matmul ----------------------------------------------------------------------------------
    def matmul(self, a, b, bias, out, M, N, K, accumulate=False, variant=None, batch=1, nb=None, tm=None,
               dtype=None) -> Dispatch:
        """out[M,N] = a[M,K] @ b[K,N] + bias[N] (batch: that many products, without bias). dtype: the
        precision whose kernels run ("f32", "bf16", "f16"); None: the first half dtype among a, b
        and out (a precision's model passes its own: its gradients' products are all float32
        tensors, which f16 still takes in f16)."""
        return self._mm("matmul", a, b, bias, out, M, N, K, accumulate, variant, batch, nb, tm, dtype)

    def matmul_abt(self, a, b, out, M, N, K, accumulate=False, variant=None, batch=1, nb=None, tm=None,
                   dtype=None, bias=None) -> Dispatch:
        """out[M,N] = a[M,K] @ b[N,K]^T (+ bias[N]: a model whose matrices are held [out, in])"""
        return self._mm("matmul_abt", a, b, bias, out, M, N, K, accumulate, variant, batch, nb, tm, dtype)

    def matmul_atb(self, a, b, out, M, N, K, accumulate=False, variant=None, batch=1, nb=None, tm=None,
               dtype=None) -> Dispatch:
        """out[M,N] = a[K,M]^T @ b[K,N]"""
        return self._mm("matmul_atb", a, b, None, out, M, N, K, accumulate, variant, batch, nb, tm, dtype)

    def _mm(self, entry, a, b, bias, out, M, N, K, accumulate, variant, batch, nb, tm, dtype) -> Dispatch:
        """One launcher for every precision: dtype, or else the tensors' dtypes, says which (float32
        operands beside a half one are the backward's gradients, read as the precision reads
        them), the plan and the shape which variant (matmul_variant). scalar and tiled are the
        templates every precision shares; the others a precision's own fast set. batch: that many
        products of these shapes, each operand's batch_stride apart, one per workgroup row z of
        the grid: one dispatch where a loop would make `batch` (Muon's Newton-Schulz over the
        matrices of one shape). nb, tm: the bf16 sg kernel's column blocks per lane and rows per
        workgroup (bf16_blocks, bf16_rows if None)."""
        dtype = dtype or next((t.dtype for t in (a, b, out) if t.dtype in HALVES), "f32")
        variant = variant or matmul_variant(self.plan, entry, M, N, K, dtype)
        if variant == "rows" and batch > 1:        # matmul_words.wgsl takes one product a dispatch
            variant = matmul_variant(self.plan.with_(few_rows=0), entry, M, N, K, dtype)
        assert batch == 1 or bias is None, entry
        assert not (accumulate and out.dtype in HALVES), entry
        strides = tuple(batch_stride(n) for n in (M * K, K * N, M * N)) if batch > 1 else (0, 0, 0)
        uniform = (M, N, K, bias is not None, accumulate, batch) + strides
        if variant in ("scalar", "tiled"):
            return self._mm_template(entry, a, b, bias, out, M, N, K, uniform, variant, dtype)
        if variant == "rows":
            return self._mm_rows(entry, a, b, bias, out, M, N, K, uniform[:5])
        own = MATMULS[dtype]
        if not own.takes(entry, a, b, out):
            return self._mm_template(entry, a, b, bias, out, M, N, K, uniform, "scalar", dtype)
        assert batch == 1 or own.batched, (entry, dtype)
        return getattr(self, own.launch)(entry, a, b, bias, out, M, N, K, uniform if own.batched else uniform[:5],
                                         variant, nb, tm, dtype)

    def _mm_rows(self, entry, a, b, bias, out, M, N, K, uniform) -> Dispatch:
        """matmul_words.wgsl: one pipeline per row count M; each operand float32 or bf16, as its
        dtype says (f16 has no form there: its products are f16's, not float32's)."""
        assert entry != "matmul_atb" and M <= ROWS_MOST and K % 8 == 0 and N % 4 == 0, (entry, M, N, K)
        kinds = [DTYPES[t.dtype] for t in (a, b, out)]
        assert all(d.products == DTYPES["f32"].products for d in kinds), (entry, a.dtype, b.dtype, out.dtype)
        consts = {"MR": M, **_word_flags(a, b, out)}
        assert not (kinds[2].packed and uniform[4]), entry      # a 16-bit out is written, never added to
        cols = 8 if entry == "matmul" else 4
        k = self.gpu.kernel("matmul_words.wgsl", entry + "_rows", "urrrw", consts)
        return self.gpu.dispatch(k, uniform, [a, b, bias, out], (-(-N // (cols * ROWS_LANES)), 1, 1))

    def _mm_f32(self, entry, a, b, bias, out, M, N, K, uniform, variant, nb, tm, dtype) -> Dispatch:
        """matmul_vec4.wgsl's vec4 kernels, or its sg section's (rows and column blocks: sg_tile)."""
        assert not any(DTYPES[t].packed for t in (dtype, a.dtype, b.dtype, out.dtype)), (entry, dtype)
        gpu, tensors, batch = self.gpu, [a, b, bias, out], uniform[5]
        if variant == "sg":
            tm, nc = sg_tile(M, N)
            k = gpu.kernel("matmul_vec4.wgsl", entry + "_sg", "urrrw", {"NC": nc, "TM": tm}, SUBGROUPS)
            return gpu.dispatch(k, uniform, tensors, (-(-N // (4 * SG_LANES * nc)), -(-M // tm), batch))
        assert variant == "vec4", variant
        wx = self.plan.matmul_wx
        k = gpu.kernel("matmul_vec4.wgsl", entry + "_vec4", "urrrw", {"WX": wx})
        return gpu.dispatch(k, uniform, tensors, (-(-N // (4 * wx)), -(-M // VEC_ROWS), batch))

    def matmul_turned(self, entry, a, b, bias, out, M, N, K, accumulate, cs, T, hd, offset=0) -> Dispatch | None:
        """out (+)= a @ b (+ bias) ("matmul") or a @ b^T ("matmul_abt"), turned by RoPE where it is
        stored, for the projection that writes a rotary model's q or k (cs its (cos, sin) table, row
        i at position i % T + offset): matmul_vec4.wgsl's turned kernels on the vec4 and sg plans,
        matmul_tiled.wgsl's on the tiled plan. None where there is no turned form: hd not a
        multiple of 8 or N of hd, the scalar variant, and a 16-bit q or k, which the reference
        rounds where the model stores it before the turn (core.precision): the caller turns in
        rope_forward's pass of its own."""
        variant = matmul_variant(self.plan, entry, M, N, K)
        if entry not in ("matmul", "matmul_abt") or hd % 8 or N % hd or any(t.dtype in HALVES for t in (a, b, out)):
            return None
        gpu, pairs = self.gpu, N // 8
        uniform = (M, N, K, bias is not None, accumulate, 1, 0, 0, 0, T, offset)
        tensors = [a, b, bias, out, cs]
        if variant == "tiled":
            wx, wy, tm, tv, bk = self.plan.matmul_tile      # 2 vec4 columns an invocation: the same tile
            tile = (wx // 2 if tv == 1 and wx > 1 else wx, wy, tm, 2, bk)
            if tile_problem(gpu.limits, tile):
                return None
            k = gpu.kernel("matmul_tiled.wgsl", entry + "_rope_tiled", "urrrrrwwr",
                           dict(zip(("WX", "WY", "TM", "TV", "BK"), tile), HALF4=hd // 8), DTYPES["f32"].products)
            tensors = [a, b, None, None, bias, out, None, cs]
            return gpu.dispatch(k, uniform, tensors, (-(-pairs // tile[0]), -(-M // (wy * tm)), 1))
        if variant == "sg":
            tm = sg_tile(M, N)[0]
            k = gpu.kernel("matmul_vec4.wgsl", entry + "_rope_sg", "urrrwr", {"NC": 2, "TM": tm, "HALF4": hd // 8},
                           SUBGROUPS)
            return gpu.dispatch(k, uniform, tensors, (-(-pairs // SG_LANES), -(-M // tm), 1))
        if variant != "vec4":
            return None
        wx = self.plan.matmul_wx
        k = gpu.kernel("matmul_vec4.wgsl", entry + "_rope_vec4", "urrrwr", {"WX": wx, "HALF4": hd // 8})
        return gpu.dispatch(k, uniform, tensors, (-(-pairs // wx), -(-M // VEC_ROWS), 1))

    def _mm_template(self, entry, a, b, bias, out, M, N, K, uniform, variant, dtype) -> Dispatch:
        """matmul.wgsl (scalar) or matmul_tiled.wgsl (workgroup tiles of BM x BN, TM x 4TV per
        invocation, the plan's tile), completed with the precision's products, bound as
        _template_bindings says."""
        consts, tensors = _template_bindings(a, b, bias, out)
        products = DTYPES[dtype].products
        batch = uniform[5]
        if variant == "scalar":
            assert "OUT_HALF" not in consts or N % 2 == 0, (entry, N)
            k = self.gpu.kernel("matmul.wgsl", entry, "urrrrrww", consts, products)
            return self.gpu.dispatch(k, uniform, tensors, (-(-N // MM_TILE), -(-M // MM_TILE), batch))
        assert vec4_ok(entry, M, N, K), (entry, M, N, K)
        wx, wy, tm, tv, bk = self.plan.matmul_tile
        k = self.gpu.kernel("matmul_tiled.wgsl", entry + "_tiled", "urrrrrww",
                            {"WX": wx, "WY": wy, "TM": tm, "TV": tv, "BK": bk, **consts}, products)
        return self.gpu.dispatch(k, uniform, tensors, (-(-N // (4 * wx * tv)), -(-M // (wy * tm)), batch))

    def _mm_words_sg(self, entry, a, b, bias, out, M, N, K, uniform, variant, nb, tm, dtype) -> Dispatch:
        """matmul_words.wgsl: 8 bf16 at a time (its one fast kernel: a forced vec4 has no bf16
        form). An operand not packed is float32 (the backward's gradients; any operand but B of
        A @ B^T); out float32 or bf16."""
        words = DTYPES[dtype].packed and DTYPES[dtype].products == DTYPES["f32"].products   # bf16: float32 sums
        assert variant == "sg" and half_ok(entry, M, N, K) and words, (entry, variant, M, N, K, dtype)
        consts = _word_flags(a, b, out)
        assert not (entry == "matmul_abt" and "B_F32" in consts), (entry, consts)
        nb = bf16_blocks(N) if nb is None else nb
        tm = tm or bf16_rows(M)
        k = self.gpu.kernel("matmul_words.wgsl", entry + "_words_sg", "urrrw", {**consts, "NB": nb, "TM": tm},
                            SUBGROUPS)
        return self.gpu.dispatch(k, uniform, [a, b, bias, out], (-(-N // (4 * nb * SG_LANES)), -(-M // tm)))

    def _mm_quad(self, entry, a, b, bias, out, M, N, K, uniform, variant, nb, tm, dtype) -> Dispatch:
        """matmul_quad.wgsl's sg section ("sg") or its vec4 kernels ("vec4"), completed with the stored
        type's products (f16's: the f16 precision's own), bound as the other templates are."""
        assert variant in ("sg", "vec4") and quad_ok(entry, M, N, K), (entry, variant, M, N, K)
        consts, tensors = _template_bindings(a, b, bias, out)
        fill = products(DTYPES[dtype].products, *(("sg",) if variant == "sg" else ()))
        k = self.gpu.kernel("matmul_quad.wgsl", f"{entry}_quad_{variant}", "urrrrrww", consts, fill)
        grid = (-(-N // (4 * SG_LANES)), -(-M // 16)) if variant == "sg" else (-(-N // 256), -(-M // 4))
        return self.gpu.dispatch(k, uniform, tensors, grid)

    # ---- bf16 (cast.wgsl, elementwise.wgsl) ------------------------------------------------------------
    def _cast(self, entry, bindings, n, per_group, variant):
        """cast.wgsl's 8 values an invocation where n is a multiple of 8 (variant "x8"), else one word."""
        if (variant or ("x8" if n % 8 == 0 else "scalar")) == "x8":
            k = self.gpu.kernel("cast.wgsl", entry + "x8", "urrww")
            return self.gpu.dispatch(k, (n,), bindings, grid1d(-(-n // (8 * 64))))
        k = self.gpu.kernel("cast.wgsl", entry, "urrww")
        return self.gpu.dispatch(k, (n,), bindings, grid1d(-(-n // per_group)))

    def cast_bf16(self, x, out, n, variant=None) -> Dispatch:
        """out (bf16 [ceil(n/2)] words) = x (f32 [n]) rounded to nearest even. variant: "x8"
        (8 values an invocation) where n is a multiple of 8, else "scalar"."""
        return self._cast("cast_bf16", [x, None, out, None], n, 128, variant)

    def cast_f32(self, xh, out, n, variant=None) -> Dispatch:
        """out (f32 [n]) = the bf16 values of xh; "x8" where n is a multiple of 8, as cast_bf16."""
        return self._cast("cast_f32", [None, xh, None, out], n, 64, variant)

    # ---- f16 (the f16 sections of cast.wgsl, layernorm.wgsl, elementwise.wgsl) ------------------------
    def cast_f16(self, x, out, n) -> Dispatch:
        """out (f16 [ceil(n/2)] words) = x (f32 [n]) rounded to nearest even, +-inf past f16's range."""
        k = self.gpu.kernel("cast.wgsl", "cast_f16", "urrww", fill=F16)
        return self.gpu.dispatch(k, (n,), [x, None, out, None], grid1d(-(-(n + n % 2) // 64)))

    def cast_f16_to_f32(self, xh, out, n) -> Dispatch:
        """out (f32 [n]) = the f16 values of xh, exactly."""
        k = self.gpu.kernel("cast.wgsl", "cast_f16_to_f32", "urrww", fill=F16)
        return self.gpu.dispatch(k, (n,), [None, xh, None, out], grid1d(-(-n // 64)))

    # ---- elementwise -------------------------------------------------------------------------------
    def _ew(self, entry, x, y, out, n, cols=0, groups=None, variant=None, consts=None) -> Dispatch:
        """elementwise.wgsl at the vec4 width (16 floats an invocation as 4 vec4) where the plan says
        vec4 and n allows; else one float an invocation."""
        gpu = self.gpu
        variant = variant or ("vec4" if self.plan.elementwise == "vec4" and n % 4 == 0 and groups is None
                              else "scalar")
        if variant == "vec4":
            k = gpu.kernel("elementwise.wgsl", entry + "4", "urrw", consts, width("vec4"))
            return gpu.dispatch(k, (n, cols), [x, y, out], grid1d(-(-n // (64 * 16))))
        k = gpu.kernel("elementwise.wgsl", entry, "urrw", consts, width("scalar"))
        return gpu.dispatch(k, (n, cols), [x, y, out], grid1d(groups or -(-n // 64)))

    def add(self, x, y, out, n, variant=None) -> Dispatch:
        return self._ew("add", x, y, out, n, variant=variant)

    def accumulate(self, x, out, n, variant=None) -> Dispatch:
        """out += x (out is read and written: a buffer other than x)."""
        return self._ew("accumulate", x, None, out, n, variant=variant)

    def scale(self, x, out, n, s: float) -> Dispatch:
        """out = x * s (LoRA's alpha / rank; s is the pipeline's constant SCALE)."""
        return self._ew("scale", x, None, out, n, variant="scalar", consts={"SCALE": float(s)})

    # ---- the MLP's activation (elementwise.wgsl's {{ACT}}_ entry points, its room's WGSL) --------------
    def act_forward(self, act, x, out, n, variant=None) -> Dispatch:
        """out = act(x) over n values, x and out stored alike (float32, or bf16 or f16 two to a
        word): `act` an activation's room (core.activations: its name and WGSL)."""
        return self._act(act, "forward", [x, None, out, None], x.dtype, n, variant)

    def act_backward(self, act, x, dy, dx, n, variant=None) -> Dispatch:
        """dx (float32) = dy * act'(x), x the pre-activation as stored."""
        return self._act(act, "backward", [x, dy, None, dx], x.dtype, n, variant)

    def _act(self, act, way, bindings, dtype, n, variant) -> Dispatch:
        """The activation's entry point for the stored type of x: float32 at the plan's width (vec4
        where n is a multiple of 4), a 16-bit type at the vec4 width, 16 values an invocation, n a
        multiple of 8 (bf16) or 4 (f16)."""
        unit = ACT_UNIT.get(dtype)
        if unit is None:
            variant = variant or ("vec4" if self.plan.elementwise == "vec4" and n % 4 == 0 else "scalar")
        else:
            assert n % unit == 0, (dtype, n)
            variant = "vec4"
        fill = Fill(f"{act.name} on {dtype} at the {variant} width", WIDTH_WGSL[variant] + act.wgsl,
                    (("VEC", "4" if variant == "vec4" else ""), ("ACT", act.name)), frozenset((variant, "act", dtype)))
        k = self.gpu.kernel("elementwise.wgsl", f"{act.name}_{way}", "urrww", fill=fill)
        return self.gpu.dispatch(k, (n, 0), bindings, grid1d(-(-n // (64 * (16 if variant == "vec4" else 1)))))

    def bias_grad(self, dy, out, rows, cols, variant=None) -> Dispatch:
        variant = variant or ("sg" if cols % 4 == 0 and self.plan.reduce == "sg" else "scalar")
        if variant == "sg":  # one 8-lane subgroup per 4 columns
            k = self.gpu.kernel("elementwise.wgsl", "bias_grad_sg", "urrw", fill=width("vec4", "sg"))
            return self.gpu.dispatch(k, (rows, cols), [dy, None, out], grid1d(cols // 4))
        return self._ew("bias_grad", dy, None, out, rows, cols, groups=-(-cols // 64))

    # ---- layernorm ---------------------------------------------------------------------------------
    def _ln(self, entry, C, variant=None, access="urrrww", stored="f32"):
        """layernorm.wgsl's `entry` at the width the plan reads (vec4 where C is a multiple of 4),
        its y stored as `stored` (the file's section of that name)."""
        variant = variant or ("vec4" if self.plan.elementwise == "vec4" and C % 4 == 0 else "scalar")
        return self.gpu.kernel("layernorm.wgsl", entry + ("4" if variant == "vec4" else ""), access,
                               fill=width(variant, stored))

    def layernorm_forward(self, x, gb, y, stats, rows, C, eps=1e-5, variant=None, rms=False) -> Dispatch:
        """gb = [g | b] packed [2, C] (RMSNorm's, rms: g alone, [C]); stats = [mean | rstd] packed
        [2, rows] (RMSNorm's mean 0). y is stored as its dtype: float32, or bf16 or f16 two to a
        word ([rows, C/2] words: the vec4 width, C a multiple of 4)."""
        if DTYPES[y.dtype].packed:
            assert C % 4 == 0, C
            variant = "vec4"
        k = self._ln("layernorm_forward", C, variant, stored=y.dtype)
        return self.gpu.dispatch(k, (rows, C, float(eps), 0, bool(rms)), [x, gb, None, y, stats], (-(-rows // 64),))

    def layernorm_dx(self, dy, x, g, stats, dx, rows, C, accumulate=True, variant=None, rms=False) -> Dispatch:
        k = self._ln("layernorm_dx", C, variant)
        return self.gpu.dispatch(k, (rows, C, 0.0, accumulate, bool(rms)), [dy, x, g, dx, stats], (-(-rows // 64),))

    def layernorm_dgb(self, dy, x, stats, dgb, rows, C, variant=None, rms=False) -> Dispatch:
        """dgb = [dg | db] [2, C]; RMSNorm's (rms) dg alone [C], from its stats (mean 0)."""
        variant = variant or ("sg" if C % 4 == 0 and self.plan.reduce == "sg" else "scalar")
        u = (rows, C, 0.0, 0, bool(rms))
        if variant == "sg":  # one 8-lane subgroup per 4 channels
            k = self.gpu.kernel("layernorm.wgsl", "layernorm_dgb_sg", "urrrww", fill=width("vec4", "sg", "f32"))
            return self.gpu.dispatch(k, u, [dy, x, stats, dgb, None], grid1d(C // 4))
        k = self.gpu.kernel("layernorm.wgsl", "layernorm_dgb", "urrrww", fill=width("scalar", "f32"))
        return self.gpu.dispatch(k, u, [dy, x, stats, dgb, None], (-(-C // 64),))

    # ---- the gated MLP's activation (glu.wgsl) -------------------------------------------------------
    def _glu(self, entry, access, tensors, n, dtype) -> Dispatch:
        assert n % 2 == 0, n
        flag = DTYPES[dtype].flag                                     # gate and up as stored
        k = self.gpu.kernel("glu.wgsl", entry, access, {flag: True} if flag else None)
        return self.gpu.dispatch(k, (n,), tensors, grid1d(-(-n // 2 // 64)))

    def swiglu_forward(self, gate, up, out, n) -> Dispatch:
        """out = silu(gate) * up, n values (even), all three as stored."""
        return self._glu("swiglu_forward", "urrw", [gate, up, out], n, gate.dtype)

    def swiglu_backward(self, gate, up, dy, dgate, dup, n) -> Dispatch:
        """dgate = dy * up * silu'(gate), dup = dy * silu(gate); dy, dgate, dup float32."""
        return self._glu("swiglu_backward", "urrrww", [gate, up, dy, dgate, dup], n, gate.dtype)

    # ---- grouped-query attention (heads.wgsl) ------------------------------------------------------
    def kv_expand(self, src, dst, rows, H, KV, hd) -> Dispatch:
        """dst [rows, H*hd] <- src [rows, KV*hd]: query head h takes kv head h // (H/KV), as stored
        (any dtype: moved as words)."""
        w = hd // PER_WORD[src.dtype]
        k = self.gpu.kernel("heads.wgsl", "kv_expand", "urw")
        return self.gpu.dispatch(k, (rows, H, KV, w), [src, dst], grid1d(-(-rows * H * w // 64)))

    def kv_reduce(self, src, dst, rows, H, KV, hd) -> Dispatch:
        """dst [rows, KV*hd] = the sum of src [rows, H*hd] over each kv head's query heads (float32)."""
        k = self.gpu.kernel("heads.wgsl", "kv_reduce", "urw")
        return self.gpu.dispatch(k, (rows, H, KV, hd), [src, dst], grid1d(-(-rows * KV * hd // 64)))

    # ---- embedding and the split head (embed.wgsl) ---------------------------------------
    def embed_forward(self, tokens, tok, pos, out, B, T, C, v0=0, n=None, docs=None) -> Dispatch:
        """tok: the token table's rows v0 .. v0+n-1 (all of it by default); only the positions whose
        token lies there are written, so one dispatch per chunk of rows writes every position once.
        pos None: no position table (a rotary model's), the token's row alone. docs: packed windows'
        positions of each row in its record (u32 [B*T]), the rows of pos they add."""
        n = tok.shape[0] if n is None else n
        access, tensors, fill = _docs("urrrw", [tokens, tok, pos, out], docs)
        k = self.gpu.kernel("embed.wgsl", "embed_forward", access, None if pos is not None else {"LEARNED": False},
                            fill)
        return self.gpu.dispatch(k, (B, T, C, 0, 0, v0, n), tensors, grid1d(-(-B * T * C // 64)))

    def embed_tok_grad(self, buckets, dout, dtok, B, T, C, V, accumulate=True, v0=0, n=None) -> Dispatch:
        """buckets = [offsets (V+1) | positions (B*T)] as u32; dtok: rows v0 .. v0+n-1 (all V by default)."""
        n = V if n is None else n
        k = self.gpu.kernel("embed.wgsl", "embed_tok_grad", "urrrw")
        return self.gpu.dispatch(k, (B, T, C, V, accumulate, v0, n), [buckets, dout, None, dtok],
                                 grid1d(-(-n * C // 64)))

    def embed_pos_grad(self, dout, dpos, B, T, C) -> Dispatch:
        k = self.gpu.kernel("embed.wgsl", "embed_pos_grad", "urrrw")
        return self.gpu.dispatch(k, (B, T, C, 0, 0, 0, 0), [None, dout, None, dpos], grid1d(-(-T * C // 64)))

    def copy_block(self, src, out, rows, cols, src_stride, src_col, out_stride, out_col) -> Dispatch:
        """out[r, out_col + c] = src[r, src_col + c]: a column block of the logits."""
        k = self.gpu.kernel("embed.wgsl", "copy_block", "urw")
        return self.gpu.dispatch(k, (rows, cols, src_stride, src_col, out_stride, out_col), [src, out],
                                 grid1d(-(-rows * cols // 64)))



class Family:
    """One shader family's launchers on one device under one kernel plan: Kernels holds one of
    each beside its own (the products, the elementwise ops, the norms, the MLP's and the tables'),
    so that each family's launchers read together and the model's parts take the family they use."""

    def __init__(self, gpu: GPU, plan: KernelPlan):
        self.gpu, self.plan = gpu, plan


class RopeKernels(Family):
    """RoPE's turns of q and k, alone or with QK-norm (rope.wgsl): Kernels.rope."""

    # ---- rotary position embedding (rope.wgsl) -------------------------------------------------------
    # docs: packed windows' positions of each row in its record (u32 [rows]), which replace r % T + offset
    def _rope(self, entry, cs, x, rows, T, C, hd, offset, docs=None) -> Dispatch:
        assert hd % 4 == 0 and C % hd == 0, (C, hd)
        flag = DTYPES[x.dtype].flag                                    # q or k as stored
        access, tensors, fill = _docs("urw" + "rrrr" * (docs is not None), [cs, x] + [None] * 4 * (docs is not None),
                                      docs)                            # docs at binding 7
        k = self.gpu.kernel("rope.wgsl", entry, access, {flag: True} if flag else None, fill)
        return self.gpu.dispatch(k, (rows, T, C, hd, offset), tensors, grid1d(-(-rows * C // 4 // 64)))

    def rope_forward(self, cs, x, rows, T, C, hd, offset=0, docs=None) -> Dispatch:
        """x [rows, C] (q or k, heads of hd channels) turned in place by its rows' positions,
        r % T + offset (or docs); cs = (cos, sin) [positions, hd/2] (core.rope.rope_table)."""
        return self._rope("rope_forward", cs, x, rows, T, C, hd, offset, docs)

    def rope_backward(self, cs, x, rows, T, C, hd, offset=0, docs=None) -> Dispatch:
        """d(out) [rows, C] in place becomes d(in): rope_forward's transpose."""
        return self._rope("rope_backward", cs, x, rows, T, C, hd, offset, docs)

    def qk_norm_rope(self, cs, xr, g, x, stats, rows, T, C, hd, offset=0, eps=1e-5, docs=None) -> Dispatch:
        """QK-norm then rope_forward in one pass: x [rows, C] as stored = the turn of RMSNorm over each
        head of the float32 xr (gain g [hd]); stats [2, rows * C/hd] = 0 | rstd (layernorm_forward's)."""
        assert hd % 4 == 0 and C % hd == 0, (C, hd)
        flag = DTYPES[x.dtype].flag
        access, tensors, fill = _docs("urwrrw" + "r" * (docs is not None), [cs, x, xr, g, stats]
                                      + [None] * (docs is not None), docs)
        k = self.gpu.kernel("rope.wgsl", "qk_norm_rope", access, {flag: True} if flag else None, fill)
        return self.gpu.dispatch(k, (rows, T, C, hd, offset, float(eps)), tensors, grid1d(-(-rows * (C // hd) // 64)))

    def qk_norm_rope_dx(self, cs, dy, xr, g, stats, dx, rows, T, C, hd, offset=0, docs=None) -> Dispatch:
        """qk_norm_rope's backward to its input where g takes no gradient: dy [rows, C], the gradient
        of what it wrote, turned back and through the RMSNorm of xr (its stats) into dx [rows, C]."""
        assert hd % 4 == 0 and C % hd == 0 and not (DTYPES[dy.dtype].packed or DTYPES[dx.dtype].packed), (C, hd)
        access, tensors, fill = _docs("urwrrwr", [cs, dx, xr, g, stats, dy], docs)
        k = self.gpu.kernel("rope.wgsl", "qk_norm_rope_dx", access, None, fill)
        return self.gpu.dispatch(k, (rows, T, C, hd, offset), tensors, grid1d(-(-rows * (C // hd) // 64)))



class LossKernels(Family):
    """The loss over the logits' chunks, its reductions and DPO's (loss.wgsl, preference.wgsl): Kernels.losses."""

    # ---- loss --------------------------------------------------------------------------------------
    def cross_entropy(self, targets, logits, losses, rows, V, scale, write_grad=True, row0=0, stride=None,
                      variant=None, scaler=None, softcap=0.0) -> Dispatch:
        """stride: floats between logit rows (>= V; the padded vocabulary). cross_entropy_sg (one 8-lane
        subgroup per row, no barriers) where rows are whole vec4 and the plan chose sg. scaler: the
        loss scaler's state (GATE), whose scale dlogits then carry too. softcap: the cap the logits
        were capped at (softcap), whose gradient dlogits then carry too."""
        stride = stride or V
        variant = variant or ("sg" if stride % 4 == 0 and self.plan.loss == "sg" else "scalar")
        entry, sg = ("cross_entropy_sg", SUBGROUPS) if variant == "sg" else ("cross_entropy", None)
        consts = {**({"SCALED": True} if scaler is not None else {}),
                  **({"SOFTCAP": float(softcap)} if softcap else {})}
        k = self.gpu.kernel("loss.wgsl", entry, "urwwr", consts or None, sg)
        return self.gpu.dispatch(k, (rows, V, float(scale), write_grad, row0, stride),
                                 [targets, logits, losses, scaler], grid1d(rows))

    def set_loss_scale(self, d: Dispatch, scale: float):
        """A recorded cross_entropy's or loss_reduce's scale rewritten (its Params' third field): a
        batch whose targets are not all scored (UNSCORED) is the mean over the ones that are."""
        data = bytearray(self.gpu.uniform_bytes[d.uniform_buffer])
        data[8:12] = struct.pack("<f", float(scale))
        self.gpu.write_uniform(d.uniform_buffer, bytes(data))

    # ---- preference pairs: DPO's loss and its factor on each window's rows (preference.wgsl) -------------
    def dpo(self, refs, losses, weights, loss, pairs, T, beta, wscale, lscale) -> Dispatch:
        """A micro-batch of pairs (windows 2i chosen, 2i+1 rejected): each window's factor on its
        rows' gradient into weights, the pairs' DPO loss times lscale into loss[0]."""
        k = self.gpu.kernel("preference.wgsl", "dpo", "urrww")
        return self.gpu.dispatch(k, (pairs, T, float(beta), float(wscale), float(lscale)),
                                 [refs, losses, weights, loss], (1,))

    def scale_rows(self, weights, logits, rows, stride, T, row0=0) -> Dispatch:
        """dlogits' rows [rows, stride] each times its window's weight (window (row0 + r) // T)."""
        k = self.gpu.kernel("preference.wgsl", "scale_rows", "urw")
        return self.gpu.dispatch(k, (rows, stride, T, row0), [weights, logits], grid1d(-(-rows * stride // 64)))

    def softcap(self, logits, rows, stride, cap) -> Dispatch:
        """logits [rows, stride] <- cap * tanh(logits / cap), in place."""
        k = self.gpu.kernel("loss.wgsl", "softcap", "urwwr", {"SOFTCAP": float(cap)})
        return self.gpu.dispatch(k, (rows, stride, 0.0, 0, 0, stride), [None, logits, None, None],
                                 grid1d(-(-rows * stride // 64)))

    def loss_reduce(self, losses, loss, rows, scale) -> Dispatch:
        k = self.gpu.kernel("loss.wgsl", "loss_reduce", "urww")
        return self.gpu.dispatch(k, (rows, 0, float(scale), 0, 0, 0), [None, loss, losses], (1,))



class OptimKernels(Family):
    """The gate (the gradient's norm, the clip, the loss scaler) and the optimizers' updates (grad_norm.wgsl,
    optim.wgsl, muon.wgsl): Kernels.optim."""

    # ---- the gradient's norm, the clip and the loss scaler: the gate (grad_norm.wgsl) -----------------
    def grad_sumsq(self, g, partials, n, first=0, variant=None, gate=None) -> Dispatch:
        """The partial sums of g's n floats into partials[first:] (partials bound whole); given the
        gate of a loss scaler, of g unscaled, and -1 for a chunk holding an inf or NaN.
        vec4 where n is a multiple of 4, as the model's flat buffers always are."""
        variant = variant or ("vec4" if self.plan.elementwise == "vec4" and n % 4 == 0 else "scalar")
        consts = {"SCALED": True} if gate is not None else None
        k = self.gpu.kernel("grad_norm.wgsl", "grad_sumsq" + ("4" if variant == "vec4" else ""), "urrw", consts,
                            width(variant))
        return self.gpu.dispatch(k, (n, 0.0, int(first), 0), [g, gate, partials], grid1d(-(-n // CHUNK)))

    def grad_clip(self, partials, gate, n_partials, clip, growth=None) -> Dispatch:
        """The gate from the partial sums: [norm, factor, ..., skip, ..., taken] (GATE); growth:
        the loss scaler's clean steps before the scale doubles, which makes this the scaler's
        update too (SCALED)."""
        k = self.gpu.kernel("grad_norm.wgsl", "grad_clip", "urrw", {"SCALED": True} if growth else None,
                            width("scalar"))
        return self.gpu.dispatch(k, (n_partials, float(clip), 0, int(growth or 0)), [None, partials, gate], (1,))

    # ---- the optimizers (optim.wgsl completed by each one's room, muon.wgsl) ---------------------------
    def elementwise_optimizer(self, entry, wgsl, g, wd_table, gate, w, m, v, n, step_uniform,
                              variant=None) -> Dispatch:
        """An elementwise optimizer's step: optim.wgsl's frame, its entry point named `entry`,
        completed by its room's WGSL, the `update` of one element; vec4 where n is a multiple of 4 and the plan reads
        vec4. v: None for an optimizer with one state row. step_uniform: optim_uniform(...) in a
        uniform buffer, rewritten each step; wd_table bound whole, the chunk's first block in the
        uniform; the step count from the gate."""
        variant = variant or ("vec4" if self.plan.elementwise == "vec4" and n % 4 == 0 else "scalar")
        width = "alias V = vec4<f32>;\nconst W = 4u;\nconst WG = 64u;\n" if variant == "vec4" else \
            "alias V = f32;\nconst W = 1u;\nconst WG = 256u;\n"
        k = self.gpu.kernel("optim.wgsl", entry, "urrrwww",
                            fill=Fill(f"{entry} (its room's WGSL)", width + wgsl, (("NAME", entry),)))
        return self.gpu.dispatch_with(k, step_uniform, [g, wd_table, gate, w, m, v], grid1d(-(-n // 256)))

    def muon_momentum(self, g, gate, m, u, n, beta, nesterov=True) -> Dispatch:
        k = self.gpu.kernel("muon.wgsl", "muon_momentum", "urrww")
        return self.gpu.dispatch(k, (n, float(beta), 0.0, bool(nesterov)), [g, gate, m, u], grid1d(-(-n // 256)))

    def muon_normalize(self, x, n, eps, batch=1) -> Dispatch:
        """x /= max(|x|_F, eps), in place: one workgroup a matrix of n values (batch of them,
        batch_stride(n) floats apart)."""
        k = self.gpu.kernel("muon.wgsl", "muon_normalize", "urrww")
        return self.gpu.dispatch(k, (n, float(eps), 0.0, batch_stride(n)), [None, None, x, None], (1, 1, batch))

    def ns_mix(self, x, y, out, n, a, b, batch=1) -> Dispatch:
        """out = a x + b y over n values (batch of them, batch_stride(n) floats apart)"""
        k = self.gpu.kernel("muon.wgsl", "ns_mix", "urrww")
        return self.gpu.dispatch(k, (n, float(a), float(b), batch_stride(n)), [x, y, out, None],
                                 grid1d(-(-n // 256))[:2] + (batch,))

    def muon_update(self, x, gate, w, n, ratio, step_uniform) -> Dispatch:
        """w -= lr (ratio x + wd w), lr and wd from step_uniform (muon.wgsl's Params: n unused, a =
        lr, b = wd), rewritten each step; n: w's length, which its binding gives the kernel."""
        k = self.gpu.kernel("muon.wgsl", "muon_update", "urrww", {"RATIO": float(ratio)})
        return self.gpu.dispatch_with(k, step_uniform, [x, gate, w, None], grid1d(-(-n // 256)))



class AttentionKernels(Family):
    """Attention's kernels over the whole window: the score matrix's (attention.wgsl) and the online
    ones (online.wgsl, online_sg.wgsl): Kernels.attention."""

    # ---- attention with the score matrix (attention.wgsl) ------------------------------------------
    def _attn(self, entry, x1, x2, x3, o1, o2, B, T, C, H, h0, nh, n_inv, window, docs=None) -> Dispatch:
        """docs: packed windows' positions of each row in its record (u32 [B*T]), a query seeing its record alone."""
        hd = C // H
        access, tensors, fill = _docs("urrrww", [x1, x2, x3, o1, o2], docs)
        k = self.gpu.kernel("attention.wgsl", entry, access, {"HD4": -(-hd // 32) * 8, **windowed(window, T)}, fill)
        return self.gpu.dispatch(k, (B, T, C, hd, h0, nh, 1.0 / math.sqrt(hd)), tensors, grid1d(-(-n_inv // 64)))

    def attn_scores(self, q, k, S, B, T, C, H, h0=0, nh=None, window=0, docs=None) -> Dispatch:
        nh = nh or H
        return self._attn("attn_scores", q, k, None, S, None, B, T, C, H, h0, nh, B * nh * T * T, window, docs)

    def attn_softmax(self, S, B, T, C, H, h0=0, nh=None, window=0, docs=None) -> Dispatch:
        nh = nh or H
        return self._attn("attn_softmax", None, None, None, S, None, B, T, C, H, h0, nh, B * nh * T, window, docs)

    def attn_value(self, P, v, out, B, T, C, H, h0=0, nh=None, window=0, docs=None) -> Dispatch:
        nh = nh or H
        return self._attn("attn_value", P, v, None, out, None, B, T, C, H, h0, nh, B * T * nh * (C // H),
                          window, docs)

    def attn_fused_sv(self, q, k, v, out, P, B, T, C, H, h0=0, nh=None, window=0, docs=None) -> Dispatch:
        nh = nh or H
        return self._attn("attn_fused_sv", q, k, v, out, P, B, T, C, H, h0, nh, B * nh * T, window, docs)

    def attn_dscores(self, dout, v, P, dS, B, T, C, H, h0=0, nh=None, window=0, docs=None) -> Dispatch:
        nh = nh or H
        return self._attn("attn_dscores", dout, v, P, dS, None, B, T, C, H, h0, nh, B * nh * T, window, docs)

    def attn_dq(self, dS, k, dq, B, T, C, H, h0=0, nh=None, window=0, docs=None) -> Dispatch:
        nh = nh or H
        return self._attn("attn_dq", dS, k, None, dq, None, B, T, C, H, h0, nh, B * T * nh * (C // H),
                          window, docs)

    def attn_dk(self, dS, q, dk, B, T, C, H, h0=0, nh=None, window=0, docs=None) -> Dispatch:
        nh = nh or H
        return self._attn("attn_dk", dS, q, None, dk, None, B, T, C, H, h0, nh, B * T * nh * (C // H),
                          window, docs)

    def attn_dvalue(self, P, dout, dv, B, T, C, H, h0=0, nh=None, window=0, docs=None) -> Dispatch:
        nh = nh or H
        return self._attn("attn_dvalue", P, dout, None, dv, None, B, T, C, H, h0, nh, B * T * nh * (C // H),
                          window, docs)

    # ---- online attention (online.wgsl, online_sg.wgsl) -------------------------------------------
    def _online(self, entry, ins, o1, o2, B, T, C, H, groups, block=None, window=0, cs=None,
                docs=None) -> Dispatch:
        """cs: RoPE's table, where dq and dk are turned back as they are stored (the _rope entries).
        docs: packed windows' positions of each row in its record (u32 [B*T]), bound after cs's place."""
        hd = C // H
        bq, bk = block or online_tiles(self.gpu.limits, self.plan, hd, T)
        consts = {"HD": hd, "HD4": -(-hd // 32) * 8, "BQ": bq, "BK": bk, **windowed(window, T)}
        if DTYPES[ins[0].dtype].flag:                                # q, k, v as stored
            consts[DTYPES[ins[0].dtype].flag] = True
        turned = cs is not None
        tensors = list(ins) + [None] * (6 - len(ins)) + [o1, o2] + ([cs] if turned or docs is not None else [])
        access, tensors, fill = _docs("urrrrrrww" + "r" * (turned or docs is not None), tensors, docs)
        k = self.gpu.kernel("online.wgsl", entry + ("_rope" if turned else ""), access, consts, fill)
        return self.gpu.dispatch(k, (B, T, C, H, 1.0 / math.sqrt(hd)), tensors, groups)

    def _online_sg(self, entry, ins, o1, o2, B, T, C, H, window=0, cs=None, docs=None) -> Dispatch:
        """One workgroup (a subgroup of 8 lanes) per 8 rows of each (b, h); q, k, v may be bf16 or
        f16 (their dtype says; B*T*C a multiple of 8). cs: RoPE's table, where dq and dk are turned
        back as they are stored (the _rope entries; turns_back says where they run). docs: as _online's."""
        hd = C // H
        consts = {"HD": hd, "HD4": -(-hd // 32) * 8, "ALIGNED": hd % 4 == 0 and C % 4 == 0,
                  **({DTYPES[ins[0].dtype].flag: True} if DTYPES[ins[0].dtype].flag else {}), **windowed(window, T)}
        turned = cs is not None
        tensors = list(ins) + [None] * (6 - len(ins)) + [o1, o2] + ([cs] if turned or docs is not None else [])
        access, tensors, fill = _docs("urrrrrrww" + "r" * (turned or docs is not None), tensors, docs)
        k = self.gpu.kernel("online_sg.wgsl", entry + ("_rope" if turned else "") + "_sg", access, consts, fill)
        return self.gpu.dispatch(k, (B, T, C, H, 1.0 / math.sqrt(hd)), tensors, (B * H * -(-T // SG_LANES),))

    def turns_back(self, T, C, H, variant=None) -> bool:
        """Whether the online backward of this shape turns a rotary model's dq and dk back as it
        stores them (the _rope entries of online_sg.wgsl, for whole vec4 rows, and of online.wgsl;
        HD a multiple of 8); elsewhere rope_backward's pass does."""
        hd = C // H
        return hd % 8 == 0 and (C % 4 == 0 or self._tiles(T, C, H, None, variant) is not None)

    def _tiles(self, T, C, H, block, variant) -> tuple | None:
        """None where the sg kernels run (variant, or the plan for this shape), else the (BQ, BK) tiles."""
        if (variant or online_variant(self.plan, T, C // H)) == "sg":
            return None
        return block or online_tiles(self.gpu.limits, self.plan, C // H, T)

    def _online_either(self, entry, ins, o1, o2, B, T, C, H, block, variant, along: int, window,
                       cs=None, docs=None) -> Dispatch:
        """online_sg.wgsl where the plan (or variant) takes it; else online.wgsl, one workgroup per
        tile of BQ query rows (along 0) or BK key rows (along 1) of each (b, h). q, k, v may be bf16
        or f16 in either. cs: turn dq, dk back (only where turns_back). docs: packed windows'."""
        tiles = self._tiles(T, C, H, block, variant)
        if tiles is None:
            return self._online_sg(entry, ins, o1, o2, B, T, C, H, window, cs, docs)
        return self._online(entry, ins, o1, o2, B, T, C, H, (B * H * -(-T // tiles[along]),), tiles, window, cs,
                            docs)

    def attn_online_forward(self, q, k, v, out, L, B, T, C, H, block=None, variant=None, window=0,
                            docs=None) -> Dispatch:
        return self._online_either("attn_online_forward", [q, k, v], out, L, B, T, C, H, block, variant, 0, window,
                                   docs=docs)

    def attn_online_d(self, dout, out, D, B, T, C, H, block=None) -> Dispatch:
        return self._online("attn_online_d", [dout, out], D, None, B, T, C, H, grid1d(-(-B * H * T // 64)), block)

    def attn_online_dq(self, q, k, v, dout, L, D, dq, B, T, C, H, block=None, variant=None, window=0,
                       cs=None, docs=None) -> Dispatch:
        """cs: a rotary model's (cos, sin) table, dq turned back as it is stored (where turns_back)."""
        return self._online_either("attn_online_dq", [q, k, v, dout, L, D], dq, None, B, T, C, H, block, variant, 0,
                                   window, cs, docs)

    def attn_online_dkv(self, q, k, v, dout, L, D, dk, dv, B, T, C, H, block=None, variant=None,
                        window=0, cs=None, docs=None) -> Dispatch:
        """cs: as attn_online_dq's, for dk."""
        return self._online_either("attn_online_dkv", [q, k, v, dout, L, D], dk, dv, B, T, C, H, block, variant, 1,
                                   window, cs, docs)



class DecodeKernels(Family):
    """The decode step's kernels over the key/value cache, and sampling (decode.wgsl): Kernels.decoding."""

    # ---- decoding from a key/value cache, and sampling (decode.wgsl) -------------------------------
    # Every decode kernel reads one uniform buffer (decode_uniform), rewritten before each token.
    def _decode(self, entry, uniform, a, b, c, ids_in, o1, o2, ids_out, grid, consts=None) -> Dispatch:
        k = self.gpu.kernel("decode.wgsl", entry, DECODE_ACCESS, consts, STORED["f32"])
        return self.gpu.dispatch_with(k, uniform, [a, b, c, ids_in, o1, o2, ids_out], grid)

    def embed_decode(self, ids, tok, pos, out, N, C, uniform) -> Dispatch:
        """out[n] = tok[ids[n]] + pos[p.pos], for the ids within rows p.v0 .. p.v0+p.vn-1 that tok holds
        (pos None: the token's row alone, a rotary model's)"""
        return self._decode("embed_decode", uniform, tok, pos, None, ids, out, None, None, grid1d(-(-N * C // 64)),
                            None if pos is not None else {"LEARNED": False})

    def kv_append(self, k, v, kc, vc, N, W, uniform) -> Dispatch:
        """kc[n, p.pos] = k[n]; vc[n, p.pos] = v[n] (caches [N, T, W], W the key/value heads' width),
        copied as words whatever their dtype (a bf16 or f16 model's: two values a word, W even)."""
        per = DTYPES[k.dtype].per_word
        assert k.dtype == v.dtype == kc.dtype == vc.dtype and W % per == 0, (k.dtype, kc.dtype, W)
        return self._decode("kv_append", uniform, k, v, None, None, kc, vc, None, grid1d(-(-N * W // (64 * per))),
                            {"PER_WORD": per} if per > 1 else None)

    def attn_decode(self, q, kc, vc, out, scratch, N, H, uniform, window=0, variant=None) -> Dispatch:
        """out[n] = attention of q[n] over cache rows 0..p.pos (the last `window` of them where
        window > 0), per head, each query head reading its key/value head's channels of the caches
        (the uniform's KV heads); scratch [N, H, T]. q and the caches are stored alike (float32, or
        bf16 or f16 two to a word: decode.wgsl's section of their type), out is float32. variant:
        "vec4" (attn_decode4: a vector load at a time, a head dim that is a multiple of its unit,
        4 float32 or 8 16-bit values) where the head dim allows it, else "scalar"."""
        dt = DTYPES[q.dtype]
        assert q.dtype == kc.dtype == vc.dtype and not DTYPES[out.dtype].packed, (q.dtype, kc.dtype, out.dtype)
        hd = q.size * dt.per_word // N // H                       # q: [N, H * hd] values
        unit = 8 if dt.packed else 4
        variant = variant or ("vec4" if hd % unit == 0 else "scalar")
        assert variant == "scalar" or hd % unit == 0, (variant, hd)
        entry = "attn_decode4" if variant == "vec4" else "attn_decode"
        k_ = self.gpu.kernel("decode.wgsl", entry, DECODE_ACCESS, windowed(window) or None, STORED[q.dtype])
        return self.gpu.dispatch_with(k_, uniform, [q, kc, vc, None, out, scratch, None], grid1d(N * H))

    def sample_tokens(self, logits, ids, N, uniform) -> Dispatch:
        """ids[n] (and ids[N + step*N + n]) = the token drawn from logits row p.row0 + n * p.row_stride."""
        return self._decode("sample_tokens", uniform, logits, None, None, None, None, None, ids, (N,))
