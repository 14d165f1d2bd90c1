//#if sg
enable subgroups;
//#endif
// The matmuls that bind their operands as words: float32 bits, or bf16 two to a word (element 2i
// in the low half, common.wgsl). An override says what each word holds, so one entry point
// serves every storage type (and a float32 word is a bitcast):
//   A_F32     A is float32 (else bf16)      B_F32     B is float32 (else bf16)
//   OUT_BF16  out is written as bf16 (bias added first, no accumulate: the forward's q, k, v and
//             pre-activation, stored only as bf16); else float32, added to where accumulating
// Two sets: the few-row products, which every adapter runs, and (the sg section) the bf16
// model's subgroup matmuls.
//
// ---- Products of a few rows: a decode step's one row per sequence through every weight matrix.
//   matmul_rows      out[M,N] = A[M,K] @ B[K,N] (+ bias[N]) (+= out)
//   matmul_abt_rows  out[M,N] = A[M,K] @ B[N,K]^T (+ bias[N]) (+= out)
// M is the override MR (1 to 4, one pipeline per row count), so no work is spent on rows that
// are not there: the tiled kernels' 16 to 64 rows a workgroup cost 16 to 64 times the products
// for one row, and on lavapipe the products then cost as much as the loads.
// Why this shape: one row reads each weight once, so the weights' loads are the whole cost. On
// lavapipe a lane's load costs about the same whatever it carries (scripts/probe_adapter.py),
// so each load here carries a vec4 of words: 4 float32 or 8 bf16 weights. Each lane owns its
// own columns and walks all of K: no workgroup memory, no barriers, no subgroups.
// Sums are float32; the twins are the float64 products of the same values.
// matmul_rows: lane g owns columns 8g .. 8g+7 and reads B's row k there (2 words of float32,
//   1 of bf16) and A's 8 k of each row (2 words or 1) per step of 8 k. Each row of A is its own
//   pass over B (MR is at most 4: the rows' sums held together would spill further).
// matmul_abt_rows: lane g owns columns 4g .. 4g+3, B's rows 4g .. 4g+3, and reads each row's next
//   8 k (2 words or 1) and A's as above; its four dot products are summed in vec4 lanes and
//   added up at the end. Each lane reads its rows of B end to end, which a CPU streams from
//   memory: a model that does not train holds its matrices [out, in] for it (docs/kernels.md).
// Shapes: K a multiple of 8; N of 8 (matmul_rows) or 4 (matmul_abt_rows). Columns past N are
// clamped on load and skipped on store.
//
// ---- The sg section: matmul_vec4.wgsl's sg kernels on words (A and B bf16 unless A_F32,
// B_F32), the sums in float32, out (and bias) float32 unless OUT_BF16: the bf16 model's.
//   matmul_words_sg      out[M,N] = A[M,K]   @ B[K,N] (+ bias[N])
//   matmul_abt_words_sg  out[M,N] = A[M,K]   @ B[N,K]^T
//   matmul_atb_words_sg  out[M,N] = A[K,M]^T @ B[K,N]
// Why: on lavapipe a load costs the same whatever it carries (scripts/probe_adapter.py), and
// a vec4<u32> carries 8 bf16 where a vec4<f32> carries 4: per lane and 8 k this kernel loads
// 4 words of A (rows l, 8+l, 16+l, 24+l) and 8 of B (8 rows of its 8 columns), 12 loads for
// 32 x 8 x 8 multiply-adds, half of matmul_sg's 24 (TM 32, NC 2). Unpacking is a shift or a mask.
// A workgroup is one subgroup of 8 lanes owning 32 rows x 64 columns; lane l owns columns
// 8(8 wid.x + l) .. +7 as two column blocks of 4. Rows of A reach the other lanes by broadcast,
// unpacked by the lane that loaded them (one unpack per value, not one per value per lane).
// Shapes: K and N multiples of 8; any M (rows clamped on load, skipped on store); the same lane
// assumptions as those, checked the same way.
// A @ B^T reads B's 8 rows (this lane's columns) 8 k at a time and transposes the blocks;
// A^T @ B has lane l load row k0+l of A (32 output rows = 4 words) and builds the row blocks from
// the 8 lanes' words, unpacked before the broadcast too. It needs M a multiple of 8.
// Mixed operands, for the backward of a bf16 model, whose gradients stay float32: A_F32 (dX =
// dY @ W^T, W bf16: 2 words per row per 8 k; for A^T @ B 2 words per row of A per 8 output rows,
// the head's dtok = dlogits^T @ x), B_F32 (A^T @ B and A @ B: 2 words per row per 8 columns, dW =
// X^T @ dY); OUT_BF16 writes a lane's 8 columns of a row as one word.
// TM (override) is the rows a workgroup of A @ B or A @ B^T owns: 32 as above, or 64, which loads
// each B word for twice the rows (8 words of A and 8 of B per lane and 8 k, for 4096
// multiply-adds): faster at 1024^3 on lavapipe, although the accumulators spill further.
// NB (override) is the column blocks of 4 a lane owns: 2 as above, or 1, where 64-column
// workgroups would leave lanes idle past N (N = 96: 2 workgroups for 1.5 of work, where 4-column
// lanes fill 3 of 32 exactly). A lane then loads half of each of B's words (or 4 rows of B^T).

struct Params { M: u32, N: u32, K: u32, has_bias: u32, accumulate: u32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> A: array<vec4<u32>>;     // [M, K/8] (A^T @ B: [K, M/8]; A_F32: /4)
@group(0) @binding(2) var<storage, read> B: array<vec4<u32>>;     // [K, N/8] (A @ B^T: [N, K/8]; B_F32: [K, N/4])
@group(0) @binding(3) var<storage, read> bias: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read_write> out: array<vec2<u32>>;   // float32 bits, or bf16 (OUT_BF16)

override A_F32: bool = false;
override B_F32: bool = false;
override OUT_BF16: bool = false;
override MR: u32 = 1u;     // matmul_rows: rows of A and out, 1 to 4
override NB: u32 = 2u;     // column blocks of 4 per lane: 2 or 1
override TM: u32 = 32u;    // rows per workgroup: 32 or 64
const LANES: u32 = 8u;    // a workgroup: one subgroup, or one SIMD vector of lavapipe's 256-bit width

fn f4(w: vec4<u32>) -> vec4<f32> { return bitcast<vec4<f32>>(w); }

// 8 values: k (or columns) 0-3 in lo, 4-7 in hi
struct V8 { lo: vec4<f32>, hi: vec4<f32> }

// 8 values from word index i of a float32 operand (i, i + 1) or a bf16 one (i / 2: one word)
fn a8(m: u32, k: u32) -> V8 {
  if (!A_F32) {
    let w = A[(m * p.K + k) / 8u];
    return V8(bf16_lo4(w.xy), bf16_lo4(w.zw));
  }
  let i = (m * p.K + k) / 4u;
  return V8(f4(A[i]), f4(A[i + 1u]));
}

// B's 8 values from element e on (8 consecutive, e a multiple of 8)
fn b8(e: u32) -> V8 {
  if (!B_F32) {
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
//#if sg

struct Acc { q0: mat4x4<f32>, q1: mat4x4<f32>, q2: mat4x4<f32>, q3: mat4x4<f32> }

fn row(r: u32) -> u32 { return min(r, p.M - 1u); }


// B's 4x4 blocks at k..k+7 for this lane's 8 columns: lo (columns 0-3) and hi (4-7), each for
// k 0-3 (a) and 4-7 (b); matrix columns are B's rows
struct BBlocks { lo_a: mat4x4<f32>, lo_b: mat4x4<f32>, hi_a: mat4x4<f32>, hi_b: mat4x4<f32> }

// 8 words of B from word i, `stride` words apart
struct W8 { w0: vec4<u32>, w1: vec4<u32>, w2: vec4<u32>, w3: vec4<u32>,
            w4: vec4<u32>, w5: vec4<u32>, w6: vec4<u32>, w7: vec4<u32> }

fn words8(i: u32, stride: u32) -> W8 {
  return W8(B[i], B[i + stride], B[i + 2u * stride], B[i + 3u * stride],
            B[i + 4u * stride], B[i + 5u * stride], B[i + 6u * stride], B[i + 7u * stride]);
}

// the 4x4 blocks of 4 words: their first (xy) or second (zw) 4 values as matrix columns
fn cols_xy(a: vec4<u32>, b: vec4<u32>, c: vec4<u32>, d: vec4<u32>) -> mat4x4<f32> {
  return mat4x4<f32>(bf16_lo4(a.xy), bf16_lo4(b.xy), bf16_lo4(c.xy), bf16_lo4(d.xy));
}

fn cols_zw(a: vec4<u32>, b: vec4<u32>, c: vec4<u32>, d: vec4<u32>) -> mat4x4<f32> {
  return mat4x4<f32>(bf16_lo4(a.zw), bf16_lo4(b.zw), bf16_lo4(c.zw), bf16_lo4(d.zw));
}

// B stored [K, N] (A @ B, A^T @ B): word j is B's row 8kk + j at these 8 columns
fn b_blocks(kk: u32, c8: u32) -> BBlocks {
  if (B_F32) {   // row k's 8 columns are words 2 c8 (columns 0-3) and 2 c8 + 1 (4-7) of its N/4
    let n4 = p.N / 4u;
    let i = 8u * kk * n4 + 2u * c8;
    return BBlocks(mat4x4<f32>(f4(B[i]), f4(B[i + n4]), f4(B[i + 2u * n4]), f4(B[i + 3u * n4])),
                   mat4x4<f32>(f4(B[i + 4u * n4]), f4(B[i + 5u * n4]), f4(B[i + 6u * n4]), f4(B[i + 7u * n4])),
                   mat4x4<f32>(f4(B[i + 1u]), f4(B[i + n4 + 1u]), f4(B[i + 2u * n4 + 1u]), f4(B[i + 3u * n4 + 1u])),
                   mat4x4<f32>(f4(B[i + 4u * n4 + 1u]), f4(B[i + 5u * n4 + 1u]), f4(B[i + 6u * n4 + 1u]),
                               f4(B[i + 7u * n4 + 1u])));
  }
  let n8 = p.N / 8u;
  let w = words8(8u * kk * n8 + c8, n8);
  return BBlocks(cols_xy(w.w0, w.w1, w.w2, w.w3), cols_xy(w.w4, w.w5, w.w6, w.w7),
                 cols_zw(w.w0, w.w1, w.w2, w.w3), cols_zw(w.w4, w.w5, w.w6, w.w7));
}

// B stored [N, K] (A @ B^T): word j is column 8 c8 + j's 8 k, so the blocks are transposed
fn b_blocks_t(kk: u32, c8: u32) -> BBlocks {
  let k8 = p.K / 8u;
  let w = words8(8u * c8 * k8 + kk, k8);
  return BBlocks(transpose(cols_xy(w.w0, w.w1, w.w2, w.w3)), transpose(cols_zw(w.w0, w.w1, w.w2, w.w3)),
                 transpose(cols_xy(w.w4, w.w5, w.w6, w.w7)), transpose(cols_zw(w.w4, w.w5, w.w6, w.w7)));
}

// NB = 1: the blocks of this lane's 4 columns c4 (lo_a, lo_b; hi unused)
fn b_blocks4(kk: u32, c4: u32, tb: bool) -> BBlocks {
  let z = mat4x4<f32>();
  if (tb) {        // B [N, K]: the 4 columns are 4 rows of B, a word (8 k) each
    let k8 = p.K / 8u;
    let i = 4u * c4 * k8 + kk;
    let w0 = B[i];
    let w1 = B[i + k8];
    let w2 = B[i + 2u * k8];
    let w3 = B[i + 3u * k8];
    return BBlocks(transpose(cols_xy(w0, w1, w2, w3)), transpose(cols_zw(w0, w1, w2, w3)), z, z);
  }
  if (B_F32) {     // row k's 4 columns are word c4 of its N/4
    let n4 = p.N / 4u;
    let i = 8u * kk * n4 + c4;
    return BBlocks(mat4x4<f32>(f4(B[i]), f4(B[i + n4]), f4(B[i + 2u * n4]), f4(B[i + 3u * n4])),
                   mat4x4<f32>(f4(B[i + 4u * n4]), f4(B[i + 5u * n4]), f4(B[i + 6u * n4]), f4(B[i + 7u * n4])), z, z);
  }
  let n8 = p.N / 8u;                     // half (c4 odd: the second) of word c4 / 2 of 8 rows
  let w = words8(8u * kk * n8 + c4 / 2u, n8);
  if ((c4 & 1u) == 1u) {
    return BBlocks(cols_zw(w.w0, w.w1, w.w2, w.w3), cols_zw(w.w4, w.w5, w.w6, w.w7), z, z);
  }
  return BBlocks(cols_xy(w.w0, w.w1, w.w2, w.w3), cols_xy(w.w4, w.w5, w.w6, w.w7), z, z);
}

// the B blocks of this lane's columns (block cc of 4 NB columns)
fn b_for(kk: u32, cc: u32, tb: bool) -> BBlocks {
  if (NB == 1u) { return b_blocks4(kk, cc, tb); }
  if (tb) { return b_blocks_t(kk, cc); }
  return b_blocks(kk, cc);
}

// four rows unpacked: a = their k 0-3, b = their k 4-7 (matrix columns are the rows)
struct Rows { a: mat4x4<f32>, b: mat4x4<f32> }

// rows 4q..4q+3 at this 8 k: a = their k 0-3, b = k 4-7, from the lanes' float32 halves (xa, xb).
// Each lane unpacks the bf16 rows it loaded before they are broadcast: 8 values of each of its
// rows, where unpacking after the broadcast would unpack every row in every lane, which
// measured slower on lavapipe (docs/results.md, bf16).
fn a_rows(x0a: vec4<f32>, x0b: vec4<f32>, x1a: vec4<f32>, x1b: vec4<f32>, q: u32) -> Rows {
  return Rows(rows_of(x0a, x1a, q), rows_of(x0b, x1b, q));
}

// lo, hi (one 16-row block, columns 0-3 and 4-7) += B x the 16 rows lanes hold: rows l in
// (x0a, x0b) and 8+l in (x1a, x1b), k 0-3 and 4-7
fn mac16(lo: ptr<function, Acc>, hi: ptr<function, Acc>, b: BBlocks, x0: vec4<f32>, y0: vec4<f32>,
         x1: vec4<f32>, y1: vec4<f32>) {
  let r0 = a_rows(x0, y0, x1, y1, 0u);
  (*lo).q0 += b.lo_a * r0.a + b.lo_b * r0.b;
  if (NB == 2u) { (*hi).q0 += b.hi_a * r0.a + b.hi_b * r0.b; }
  let r1 = a_rows(x0, y0, x1, y1, 1u);
  (*lo).q1 += b.lo_a * r1.a + b.lo_b * r1.b;
  if (NB == 2u) { (*hi).q1 += b.hi_a * r1.a + b.hi_b * r1.b; }
  let r2 = a_rows(x0, y0, x1, y1, 2u);
  (*lo).q2 += b.lo_a * r2.a + b.lo_b * r2.b;
  if (NB == 2u) { (*hi).q2 += b.hi_a * r2.a + b.hi_b * r2.b; }
  let r3 = a_rows(x0, y0, x1, y1, 3u);
  (*lo).q3 += b.lo_a * r3.a + b.lo_b * r3.b;
  if (NB == 2u) { (*hi).q3 += b.hi_a * r3.a + b.hi_b * r3.b; }
}

fn quarter(acc: Acc, q: u32) -> mat4x4<f32> {
  switch q { case 0u: { return acc.q0; } case 1u: { return acc.q1; } case 2u: { return acc.q2; } default: { return acc.q3; } }
}

// one 16-row, 4-column block (vec4 column c4) of out, bias added: float32 as two half words
// (added to what is there where accumulating), or bf16 as one half word (OUT_BF16)
fn bias_at(c4: u32) -> vec4<f32> {
  if (p.has_bias != 0u) { return bias[c4]; }
  return vec4<f32>();
}

fn store(acc: Acc, row0: u32, c4: u32, live: bool) {
  if (!live) { return; }
  let n4 = p.N / 4u;
  let b = bias_at(c4);
  for (var q = 0u; q < 4u; q++) {
    let m = quarter(acc, q);
    for (var c = 0u; c < 4u; c++) {
      let i = row0 + 4u * q + c;
      if (i >= p.M) { continue; }
      var v = m[c] + b;
      if (OUT_BF16) {
        out[i * n4 + c4] = vec2<u32>(bf16_pack(v.x, v.y), bf16_pack(v.z, v.w));
        continue;
      }
      let at = 2u * (i * n4 + c4);
      if (p.accumulate != 0u) { v += bitcast<vec4<f32>>(vec4<u32>(out[at], out[at + 1u])); }
      let w = bitcast<vec4<u32>>(v);
      out[at] = w.xy;
      out[at + 1u] = w.zw;
    }
  }
}

// 16 rows of this lane's column block cc: lo (its first 4 columns) and hi (the next 4, NB = 2)
fn store_block(lo: Acc, hi: Acc, row0: u32, cc: u32, live: bool) {
  store(lo, row0, NB * cc, live);
  if (NB == 2u) { store(hi, row0, NB * cc + 1u, live); }
}

// this lane's column block (4 NB columns), clamped, and whether it is inside N
struct Block { cc: u32, live: bool }

fn block_of(wid: vec3<u32>, lane: u32) -> Block {
  let nb = p.N / (4u * NB);
  let c = wid.x * LANES + lane;
  return Block(min(c, nb - 1u), c < nb);
}

// rows r0 + 8j + lane of A at this 8 k, j = 0..3, as float32: xj (k 0-3) and yj (k 4-7)
struct A4 { x0: vec4<f32>, y0: vec4<f32>, x1: vec4<f32>, y1: vec4<f32>,
            x2: vec4<f32>, y2: vec4<f32>, x3: vec4<f32>, y3: vec4<f32> }

fn a_words(r0: u32, lane: u32, kk: u32, ka: u32) -> A4 {
  let s = select(kk, 2u * kk, A_F32);
  let i0 = row(r0 + lane) * ka + s;
  let i1 = row(r0 + 8u + lane) * ka + s;
  let i2 = row(r0 + 16u + lane) * ka + s;
  let i3 = row(r0 + 24u + lane) * ka + s;
  if (A_F32) {
    return A4(f4(A[i0]), f4(A[i0 + 1u]), f4(A[i1]), f4(A[i1 + 1u]), f4(A[i2]), f4(A[i2 + 1u]), f4(A[i3]), f4(A[i3 + 1u]));
  }
  let w0 = A[i0];
  let w1 = A[i1];
  let w2 = A[i2];
  let w3 = A[i3];
  return A4(bf16_lo4(w0.xy), bf16_lo4(w0.zw), bf16_lo4(w1.xy), bf16_lo4(w1.zw),
            bf16_lo4(w2.xy), bf16_lo4(w2.zw), bf16_lo4(w3.xy), bf16_lo4(w3.zw));
}

fn a_times_b(wid: vec3<u32>, lane: u32, tb: bool) {
  let k8 = p.K / 8u;
  let blk = block_of(wid, lane);           // this lane's 4 NB columns
  let cc = blk.cc;
  let row0 = wid.y * TM;
  let ka = select(k8, 2u * k8, A_F32);    // words in a row of A
  var lo: Acc;     // rows 0-15, columns 0-3
  var hi: Acc;     // rows 0-15, columns 4-7 (NB = 2)
  var lo2: Acc;    // rows 16-31
  var hi2: Acc;
  var lo3: Acc;    // rows 32-47 (TM = 64)
  var hi3: Acc;
  var lo4: Acc;    // rows 48-63
  var hi4: Acc;
  for (var kk = 0u; kk < k8; kk++) {
    let b = b_for(kk, cc, tb);
    let w = a_words(row0, lane, kk, ka);
    mac16(&lo, &hi, b, w.x0, w.y0, w.x1, w.y1);
    mac16(&lo2, &hi2, b, w.x2, w.y2, w.x3, w.y3);
    if (TM == 64u) {
      let v = a_words(row0 + 32u, lane, kk, ka);
      mac16(&lo3, &hi3, b, v.x0, v.y0, v.x1, v.y1);
      mac16(&lo4, &hi4, b, v.x2, v.y2, v.x3, v.y3);
    }
  }
  store_block(lo, hi, row0, cc, blk.live);
  store_block(lo2, hi2, row0 + 16u, cc, blk.live);
  if (TM == 64u) {
    store_block(lo3, hi3, row0 + 32u, cc, blk.live);
    store_block(lo4, hi4, row0 + 48u, cc, blk.live);
  }
}

@compute @workgroup_size(LANES)
fn matmul_words_sg(@builtin(workgroup_id) wid: vec3<u32>, @builtin(subgroup_invocation_id) lane: u32) {
  a_times_b(wid, lane, false);
}

@compute @workgroup_size(LANES)
fn matmul_abt_words_sg(@builtin(workgroup_id) wid: vec3<u32>, @builtin(subgroup_invocation_id) lane: u32) {
  a_times_b(wid, lane, true);
}

// A^T @ B. Lane l loads A's row k = 8kk + l at the 32 output rows: 4 words x_j (rows 8j..8j+7).
// Rows 4q..4q+3 (q = 2j or 2j+1) at k = 0..7 are the .xy or .zw of lane k's word x_j; unpacked
// by lane k, broadcast and transposed, they are the blocks mac_pair multiplies (columns = rows,
// components = k).
struct Rows2 { even: Rows, odd: Rows }

// rows 8w .. 8w+7 (clamped to M) of A's row k as float32: lo rows 0-3, hi rows 4-7
struct Half2 { lo: vec4<f32>, hi: vec4<f32> }

fn a_row8(k: u32, w: u32, m8: u32) -> Half2 {
  let ww = min(w, m8 - 1u);
  if (A_F32) {
    let i = k * 2u * m8 + 2u * ww;
    return Half2(f4(A[i]), f4(A[i + 1u]));
  }
  let x = A[k * m8 + ww];
  return Half2(bf16_lo4(x.xy), bf16_lo4(x.zw));
}

fn atb_rows(h: Half2) -> Rows2 {
  let lo = h.lo;                           // rows 0-3 of the word at this lane's k
  let hi = h.hi;                           // rows 4-7
  let l0 = mat4x4<f32>(subgroupBroadcast(lo, 0u), subgroupBroadcast(lo, 1u), subgroupBroadcast(lo, 2u), subgroupBroadcast(lo, 3u));
  let l1 = mat4x4<f32>(subgroupBroadcast(lo, 4u), subgroupBroadcast(lo, 5u), subgroupBroadcast(lo, 6u), subgroupBroadcast(lo, 7u));
  let h0 = mat4x4<f32>(subgroupBroadcast(hi, 0u), subgroupBroadcast(hi, 1u), subgroupBroadcast(hi, 2u), subgroupBroadcast(hi, 3u));
  let h1 = mat4x4<f32>(subgroupBroadcast(hi, 4u), subgroupBroadcast(hi, 5u), subgroupBroadcast(hi, 6u), subgroupBroadcast(hi, 7u));
  return Rows2(Rows(transpose(l0), transpose(l1)), Rows(transpose(h0), transpose(h1)));
}

// (lo, hi) += B x the rows r, for columns 0-3 and 4-7
struct Pair { lo: mat4x4<f32>, hi: mat4x4<f32> }

fn mac_pair(acc: Pair, b: BBlocks, r: Rows) -> Pair {
  if (NB == 1u) { return Pair(acc.lo + b.lo_a * r.a + b.lo_b * r.b, acc.hi); }
  return Pair(acc.lo + b.lo_a * r.a + b.lo_b * r.b, acc.hi + b.hi_a * r.a + b.hi_b * r.b);
}

// 32 output rows from word w of lane-loaded rows of A (row k = 8kk + lane): pairs q..q+7 += B x them
struct P8 { p0: Pair, p1: Pair, p2: Pair, p3: Pair, p4: Pair, p5: Pair, p6: Pair, p7: Pair }

fn atb32(acc: P8, b: BBlocks, k: u32, w0: u32, m8: u32) -> P8 {
  var r = acc;
  let r0 = atb_rows(a_row8(k, w0, m8));
  r.p0 = mac_pair(r.p0, b, r0.even);
  r.p1 = mac_pair(r.p1, b, r0.odd);
  let r1 = atb_rows(a_row8(k, w0 + 1u, m8));
  r.p2 = mac_pair(r.p2, b, r1.even);
  r.p3 = mac_pair(r.p3, b, r1.odd);
  let r2 = atb_rows(a_row8(k, w0 + 2u, m8));
  r.p4 = mac_pair(r.p4, b, r2.even);
  r.p5 = mac_pair(r.p5, b, r2.odd);
  let r3 = atb_rows(a_row8(k, w0 + 3u, m8));
  r.p6 = mac_pair(r.p6, b, r3.even);
  r.p7 = mac_pair(r.p7, b, r3.odd);
  return r;
}

fn store32(r: P8, row0: u32, cc: u32, live: bool) {
  store_block(Acc(r.p0.lo, r.p1.lo, r.p2.lo, r.p3.lo), Acc(r.p0.hi, r.p1.hi, r.p2.hi, r.p3.hi), row0, cc, live);
  store_block(Acc(r.p4.lo, r.p5.lo, r.p6.lo, r.p7.lo), Acc(r.p4.hi, r.p5.hi, r.p6.hi, r.p7.hi), row0 + 16u, cc, live);
}

@compute @workgroup_size(LANES)
fn matmul_atb_words_sg(@builtin(workgroup_id) wid: vec3<u32>, @builtin(subgroup_invocation_id) lane: u32) {
  let k8 = p.K / 8u;
  let m8 = p.M / 8u;
  let blk = block_of(wid, lane);
  let cc = blk.cc;
  let row0 = wid.y * TM;
  let w0 = row0 / 8u;                      // the first word of the TM rows in a row of A
  var lo: P8;                              // rows 0-31: pairs of rows 4q.., q = 0..7
  var hi: P8;                              // rows 32-63 (TM = 64)
  for (var kk = 0u; kk < k8; kk++) {
    let b = b_for(kk, cc, false);
    let k = 8u * kk + lane;                // the row of A this lane loads
    lo = atb32(lo, b, k, w0, m8);
    if (TM == 64u) { hi = atb32(hi, b, k, w0 + 4u, m8); }
  }
  store32(lo, row0, cc, blk.live);
  if (TM == 64u) { store32(hi, row0 + 32u, cc, blk.live); }
}
//#endif
