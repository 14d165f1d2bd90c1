// The trainer's matmuls, read as vec4, for shapes where K and N (and M for
// matmul_atb) are multiples of 4; matmul.wgsl serves every other shape.
//   matmul_vec4      out[M,N] = A[M,K]   @ B[K,N] (+ bias)
//   matmul_abt_vec4  out[M,N] = A[M,K]   @ B[N,K]^T
//   matmul_atb_vec4  out[M,N] = A[K,M]^T @ B[K,N]
//
// A workgroup owns 16 whole rows; its WX invocations each own 4 columns, and
// keep the 16 x 4 block as four mat4x4 accumulators (column c of acc_q is
// output row 4q+c). K advances four at a time: one 4x4 block of B per
// invocation (4 vec4 loads) meets the 16 rows of A (16 vec4 loads) in four
// mat4x4 products, 256 multiply-adds.
// Why this shape: lavapipe runs invocations as SIMD lanes and pays per lane
// for a load whose address differs between lanes, but loads an address that
// depends only on the workgroup once for all lanes. A's addresses here depend
// on the workgroup only, so only B's loads are paid per lane, and each B value
// is used 16 times. No workgroup memory, no barriers (dear on lavapipe).
// Rows past M are clamped on load and skipped on store; columns past N are
// clamped likewise.

// batched: workgroup row z works on the z-th product, its A, B and out sa, sb, so floats on
struct Params { M: u32, N: u32, K: u32, has_bias: u32, accumulate: u32, batch: u32, sa: u32, sb: u32, so: u32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> A: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> B: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read> bias: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read_write> out: array<vec4<f32>>;

override WX: u32 = 16u;  // invocations per workgroup, 4 columns each
const TM: u32 = 16u;     // rows per workgroup

// this product's first vec4 of A, B and out (all 0 unbatched)
var<private> oa: u32;
var<private> ob: u32;
var<private> oo: u32;

fn batch_at(z: u32) {
  oa = z * (p.sa / 4u);
  ob = z * (p.sb / 4u);
  oo = z * (p.so / 4u);
}

struct Acc { q0: mat4x4<f32>, q1: mat4x4<f32>, q2: mat4x4<f32>, q3: mat4x4<f32> }

fn row(r: u32) -> u32 { return min(r, p.M - 1u); }

// where rows row0 .. row0+15 of a row-major [M, 4*k4] A start (clamped to the last row)
struct Rows16 { r0: u32, r1: u32, r2: u32, r3: u32, r4: u32, r5: u32, r6: u32, r7: u32,
                r8: u32, r9: u32, r10: u32, r11: u32, r12: u32, r13: u32, r14: u32, r15: u32 }

fn rows16(row0: u32, k4: u32) -> Rows16 {
  return Rows16(row(row0) * k4, row(row0 + 1u) * k4, row(row0 + 2u) * k4, row(row0 + 3u) * k4,
                row(row0 + 4u) * k4, row(row0 + 5u) * k4, row(row0 + 6u) * k4, row(row0 + 7u) * k4,
                row(row0 + 8u) * k4, row(row0 + 9u) * k4, row(row0 + 10u) * k4, row(row0 + 11u) * k4,
                row(row0 + 12u) * k4, row(row0 + 13u) * k4, row(row0 + 14u) * k4, row(row0 + 15u) * k4);
}

fn store(acc: Acc, row0: u32, c4: u32, live: bool) {
  if (!live) { return; }
  let n4 = p.N / 4u;
  var b = vec4<f32>();
  if (p.has_bias != 0u) { b = bias[c4]; }
  for (var q = 0u; q < 4u; q++) {
    var m: mat4x4<f32>;
    switch q { case 0u: { m = acc.q0; } case 1u: { m = acc.q1; } case 2u: { m = acc.q2; } default: { m = acc.q3; } }
    for (var c = 0u; c < 4u; c++) {
      let i = row0 + 4u * q + c;
      if (i < p.M) {
        var v = m[c] + b;
        if (p.accumulate != 0u) { v += out[oo + i * n4 + c4]; }
        out[oo + i * n4 + c4] = v;
      }
    }
  }
}

// A @ B (tb = false) or A @ B^T (tb = true): the same walk, only B's 4x4 block is read differently.
fn a_times_b(wid: vec3<u32>, lid: u32, tb: bool) {
  let n4 = p.N / 4u;
  let k4 = p.K / 4u;
  let cw = wid.x * WX + lid;
  let c4 = min(cw, n4 - 1u);
  let row0 = wid.y * TM;
  let a = rows16(row0, k4);
  let j = 4u * c4;
  var acc: Acc;
  for (var kk = 0u; kk < k4; kk++) {
    var bm: mat4x4<f32>;
    if (tb) {  // rows of bm: B rows j..j+3 (this invocation's output columns) at k..k+3
      bm = transpose(mat4x4<f32>(B[ob + j * k4 + kk], B[ob + (j + 1u) * k4 + kk], B[ob + (j + 2u) * k4 + kk], B[ob + (j + 3u) * k4 + kk]));
    } else {   // columns of bm: B rows k..k+3 at this invocation's 4 columns
      let k = 4u * kk;
      bm = mat4x4<f32>(B[ob + k * n4 + c4], B[ob + (k + 1u) * n4 + c4], B[ob + (k + 2u) * n4 + c4], B[ob + (k + 3u) * n4 + c4]);
    }
    acc.q0 += bm * mat4x4<f32>(A[oa + a.r0 + kk], A[oa + a.r1 + kk], A[oa + a.r2 + kk], A[oa + a.r3 + kk]);
    acc.q1 += bm * mat4x4<f32>(A[oa + a.r4 + kk], A[oa + a.r5 + kk], A[oa + a.r6 + kk], A[oa + a.r7 + kk]);
    acc.q2 += bm * mat4x4<f32>(A[oa + a.r8 + kk], A[oa + a.r9 + kk], A[oa + a.r10 + kk], A[oa + a.r11 + kk]);
    acc.q3 += bm * mat4x4<f32>(A[oa + a.r12 + kk], A[oa + a.r13 + kk], A[oa + a.r14 + kk], A[oa + a.r15 + kk]);
  }
  store(acc, row0, c4, cw < n4);
}

@compute @workgroup_size(WX)
fn matmul_vec4(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  batch_at(wid.z);
  a_times_b(wid, lid, false);
}

@compute @workgroup_size(WX)
fn matmul_abt_vec4(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  batch_at(wid.z);
  a_times_b(wid, lid, true);
}

@compute @workgroup_size(WX)
fn matmul_atb_vec4(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  batch_at(wid.z);
  let n4 = p.N / 4u;
  let m4 = p.M / 4u;
  let cw = wid.x * WX + lid;
  let c4 = min(cw, n4 - 1u);
  let row0 = wid.y * TM;
  let r0 = min(row0 / 4u, m4 - 1u);        // A's columns row0.. as vec4 groups
  let r1 = min(row0 / 4u + 1u, m4 - 1u);
  let r2 = min(row0 / 4u + 2u, m4 - 1u);
  let r3 = min(row0 / 4u + 3u, m4 - 1u);
  var acc: Acc;
  for (var k = 0u; k < p.K; k++) {
    let b = B[ob + k * n4 + c4];
    let s = oa + k * m4;
    // outer products: column c of acc_q gains b * A[k, 4q + c]
    let x0 = A[s + r0];
    acc.q0 += mat4x4<f32>(b * x0.x, b * x0.y, b * x0.z, b * x0.w);
    let x1 = A[s + r1];
    acc.q1 += mat4x4<f32>(b * x1.x, b * x1.y, b * x1.z, b * x1.w);
    let x2 = A[s + r2];
    acc.q2 += mat4x4<f32>(b * x2.x, b * x2.y, b * x2.z, b * x2.w);
    let x3 = A[s + r3];
    acc.q3 += mat4x4<f32>(b * x3.x, b * x3.y, b * x3.z, b * x3.w);
  }
  store(acc, row0, c4, cw < n4);
}
