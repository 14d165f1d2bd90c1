// Products of a few rows: a decode step's one row per sequence through every weight matrix.
//   matmul_rows      out[M,N] = A[M,K] @ B[K,N] (+ bias[N]) (+= out)
//   matmul_abt_rows  out[M,N] = A[M,K] @ B[N,K]^T (+= out)
// M is the override MR (1 to 4, one pipeline per row count), so no work is spent on rows that
// are not there: the tiled kernels' 16 to 64 rows a workgroup cost 16 to 64 times the products
// for one row, and on lavapipe the products then cost as much as the loads.
// Why this shape: one row reads each weight once, so the weights' loads are the whole cost. On
// lavapipe a lane's load costs about the same whatever it carries (scripts/probe_adapter.py),
// so each load here carries a vec4 of words: 4 float32 or 8 bf16 weights. Each lane owns its
// own columns and walks all of K: no workgroup memory, no barriers, no subgroups, so the same
// kernel runs on every adapter.
// Operands are bound as words, and an override says what a word holds (one entry point per
// product, whatever the storage type): float32 (a bitcast) or bf16, two to a word (element 2i
// in the low half, common.wgsl):
//   A_BF16   A is bf16         B_BF16   B is bf16         OUT_BF16   out is written as bf16
//   (bias added first, no accumulate: the forward's q, k, v and pre-activation)
// Sums are float32, one k at a time in order within a lane's 8-k step; the twins are the
// float64 products of the same values.
// matmul_rows: lane g owns columns 8g .. 8g+7 and reads B's row k there (2 words of float32,
//   1 of bf16) and A's 8 k of each row (2 words or 1) per step of 8 k.
// matmul_abt_rows: lane g owns columns 4g .. 4g+3, B's rows 4g .. 4g+3, and reads each row's next
//   8 k (2 words or 1) and A's as above; its four dot products are summed in vec4 lanes and
//   added up at the end.
// Shapes: K a multiple of 8; N of 8 (matmul_rows) or 4 (matmul_abt_rows). Columns past N are
// clamped on load and skipped on store.

struct Params { M: u32, N: u32, K: u32, has_bias: u32, accumulate: u32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> A: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> B: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read> bias: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read_write> out: array<vec2<u32>>;   // float32 bits, or bf16 (OUT_BF16)

override MR: u32 = 1u;        // rows of A and out: 1 to 4
override A_BF16: bool = false;
override B_BF16: bool = false;
override OUT_BF16: bool = false;
const LANES: u32 = 8u;         // a workgroup: one SIMD vector of lavapipe's 256-bit width

// 8 values: k (or columns) 0-3 in lo, 4-7 in hi
struct V8 { lo: vec4<f32>, hi: vec4<f32> }

fn f4(w: vec4<u32>) -> vec4<f32> { return bitcast<vec4<f32>>(w); }

// 8 values from word index i of a float32 operand (i, i + 1) or a bf16 one (i / 2: one word)
fn a8(m: u32, k: u32) -> V8 {
  if (A_BF16) {
    let w = A[(m * p.K + k) / 8u];
    return V8(bf16_lo4(w.xy), bf16_lo4(w.zw));
  }
  let i = (m * p.K + k) / 4u;
  return V8(f4(A[i]), f4(A[i + 1u]));
}

// B's 8 values from element e on (8 consecutive, e a multiple of 8)
fn b8(e: u32) -> V8 {
  if (B_BF16) {
    let w = B[e / 8u];
    return V8(bf16_lo4(w.xy), bf16_lo4(w.zw));
  }
  return V8(f4(B[e / 4u]), f4(B[e / 4u + 1u]));
}

// out[m, n .. n+3] = v (+ what is there, float32 out only); n a multiple of 4
fn store4(m: u32, n: u32, v: vec4<f32>) {
  let e = m * p.N + n;
  if (OUT_BF16) {
    out[e / 4u] = vec2<u32>(bf16_pack(v.x, v.y), bf16_pack(v.z, v.w));
    return;
  }
  var o = v;
  if (p.accumulate != 0u) {
    o += bitcast<vec4<f32>>(vec4<u32>(out[e / 2u], out[e / 2u + 1u]));
  }
  let w = bitcast<vec4<u32>>(o);
  out[e / 2u] = w.xy;
  out[e / 2u + 1u] = w.zw;
}

// acc + the 8 rows of B at k .. k+7 (these 8 columns) times a's 8 values
fn step8(acc: V8, a: V8, k: u32, c: u32) -> V8 {
  var s = acc;
  let n = p.N;
  let r0 = b8(k * n + c); let r1 = b8((k + 1u) * n + c); let r2 = b8((k + 2u) * n + c); let r3 = b8((k + 3u) * n + c);
  s.lo = fma(r0.lo, vec4<f32>(a.lo.x), s.lo); s.hi = fma(r0.hi, vec4<f32>(a.lo.x), s.hi);
  s.lo = fma(r1.lo, vec4<f32>(a.lo.y), s.lo); s.hi = fma(r1.hi, vec4<f32>(a.lo.y), s.hi);
  s.lo = fma(r2.lo, vec4<f32>(a.lo.z), s.lo); s.hi = fma(r2.hi, vec4<f32>(a.lo.z), s.hi);
  s.lo = fma(r3.lo, vec4<f32>(a.lo.w), s.lo); s.hi = fma(r3.hi, vec4<f32>(a.lo.w), s.hi);
  let r4 = b8((k + 4u) * n + c); let r5 = b8((k + 5u) * n + c); let r6 = b8((k + 6u) * n + c); let r7 = b8((k + 7u) * n + c);
  s.lo = fma(r4.lo, vec4<f32>(a.hi.x), s.lo); s.hi = fma(r4.hi, vec4<f32>(a.hi.x), s.hi);
  s.lo = fma(r5.lo, vec4<f32>(a.hi.y), s.lo); s.hi = fma(r5.hi, vec4<f32>(a.hi.y), s.hi);
  s.lo = fma(r6.lo, vec4<f32>(a.hi.z), s.lo); s.hi = fma(r6.hi, vec4<f32>(a.hi.z), s.hi);
  s.lo = fma(r7.lo, vec4<f32>(a.hi.w), s.lo); s.hi = fma(r7.hi, vec4<f32>(a.hi.w), s.hi);
  return s;
}

// Each row is its own pass over B: B's words are loaded once per row, and MR is at most 4, where
// keeping the rows' sums together would hold 4x the accumulators. The next rows' passes find
// B's rows in the CPU's cache less often than one would think (a matrix of 3.5 MB), so the
// launcher picks this kernel for few rows only.
@compute @workgroup_size(LANES)
fn matmul_rows(@builtin(global_invocation_id) gid: vec3<u32>) {
  let live = 8u * gid.x < p.N;
  let c = min(8u * gid.x, p.N - 8u);           // clamped: every lane runs the loop, its loads in bounds
  for (var m = 0u; m < MR; m++) {
    var acc = V8(vec4<f32>(), vec4<f32>());
    for (var k = 0u; k < p.K; k += 8u) {
      acc = step8(acc, a8(m, k), k, c);
    }
    if (live) {
      var lo = acc.lo;
      var hi = acc.hi;
      if (p.has_bias != 0u) {
        lo += bias[c / 4u];
        hi += bias[c / 4u + 1u];
      }
      store4(m, c, lo);
      store4(m, c + 4u, hi);
    }
  }
}

@compute @workgroup_size(LANES)
fn matmul_abt_rows(@builtin(global_invocation_id) gid: vec3<u32>) {
  let live = 4u * gid.x < p.N;
  let n0 = min(4u * gid.x, p.N - 4u);
  let K = p.K;
  for (var m = 0u; m < MR; m++) {
    var s0 = vec4<f32>(); var s1 = vec4<f32>(); var s2 = vec4<f32>(); var s3 = vec4<f32>();
    for (var k = 0u; k < K; k += 8u) {
      let a = a8(m, k);
      let b0 = b8(n0 * K + k); let b1 = b8((n0 + 1u) * K + k); let b2 = b8((n0 + 2u) * K + k); let b3 = b8((n0 + 3u) * K + k);
      s0 = fma(b0.lo, a.lo, fma(b0.hi, a.hi, s0));
      s1 = fma(b1.lo, a.lo, fma(b1.hi, a.hi, s1));
      s2 = fma(b2.lo, a.lo, fma(b2.hi, a.hi, s2));
      s3 = fma(b3.lo, a.lo, fma(b3.hi, a.hi, s3));
    }
    if (live) {
      var hs = vec4<f32>((s0.x + s0.y) + (s0.z + s0.w), (s1.x + s1.y) + (s1.z + s1.w),
                         (s2.x + s2.y) + (s2.z + s2.w), (s3.x + s3.y) + (s3.z + s3.w));
      if (p.has_bias != 0u) { hs += bias[n0 / 4u]; }
      store4(m, n0, hs);
    }
  }
}

