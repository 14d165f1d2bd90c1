enable f16;
enable subgroups;
// matmul_f16_vec4.wgsl with subgroup broadcasts, for adapters whose subgroups pass the plan's
// check (device/planner.py): the same products (each one f16 multiply, summed in float32), the
// same bindings, overrides and shapes (N and K multiples of 4; M and N for matmul_atb, any K).
//   matmul_f16_sg      out[M,N] = A[M,K]   @ B[K,N] (+ bias[N])
//   matmul_abt_f16_sg  out[M,N] = A[M,K]   @ B[N,K]^T
//   matmul_atb_f16_sg  out[M,N] = A[K,M]^T @ B[K,N]
// A workgroup is one subgroup of 8 lanes owning 16 rows x 32 columns of out; lane l owns the
// 4 columns 4(8 wid.x + l).. of all 16 rows. Why: lavapipe loads one lane at a time whatever the
// address (matmul_sg.wgsl says how that was measured), so the rows of A are loaded once, by one
// lane each, and handed to the others by broadcast. Per lane and 4 k (A @ B): 2 loads of A and 4 of
// B for 256 products; A^T @ B, per 8 k: 4 of A and 8 of B for 512. The broadcasts carry f16.

struct Params { M: u32, N: u32, K: u32, has_bias: u32, accumulate: u32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> A16: array<vec4<f16>>;
@group(0) @binding(2) var<storage, read> B16: array<vec4<f16>>;
@group(0) @binding(3) var<storage, read> A32: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read> B32: array<vec4<f32>>;
@group(0) @binding(5) var<storage, read> bias: array<vec4<f32>>;
@group(0) @binding(6) var<storage, read_write> out32: array<vec4<f32>>;
@group(0) @binding(7) var<storage, read_write> out16: array<vec4<f16>>;

override A_F32: bool = false;
override B_F32: bool = false;
override OUT_F16: bool = false;
const LANES: u32 = 8u;

fn a4(i: u32) -> vec4<f16> {
  if (A_F32) { return to_f16x4(A32[i]); }
  return A16[i];
}

fn b4(i: u32) -> vec4<f16> {
  if (B_F32) { return to_f16x4(B32[i]); }
  return B16[i];
}

fn row(r: u32) -> u32 { return min(r, p.M - 1u); }

// out row r += a . (B's rows k..k+3 at the 4 columns): four f16 products per column, float32 sums
fn mac(acc: ptr<function, array<vec4<f32>, 16>>, r: u32, h: vec4<f16>, b: array<vec4<f16>, 4>) {
  (*acc)[r] += vec4<f32>(h.x * b[0]) + vec4<f32>(h.y * b[1]) + vec4<f32>(h.z * b[2]) + vec4<f32>(h.w * b[3]);
}

fn store(acc: array<vec4<f32>, 16>, row0: u32, c4: u32, live: bool) {
  if (!live) { return; }
  let n4 = p.N / 4u;
  var b = vec4<f32>();
  if (p.has_bias != 0u) { b = bias[c4]; }
  for (var r = 0u; r < 16u; r++) {
    let i = row0 + r;
    if (i >= p.M) { return; }
    var v = acc[r] + b;
    if (OUT_F16) {
      out16[i * n4 + c4] = to_f16x4(v);
    } else {
      if (p.accumulate != 0u) { v += out32[i * n4 + c4]; }
      out32[i * n4 + c4] = v;
    }
  }
}

// A @ B (tb false) or A @ B^T (tb true). Lane l loads rows l and 8 + l of the workgroup's 16.
fn a_times_b(wid: vec3<u32>, lane: u32, tb: bool) {
  let n4 = p.N / 4u;
  let k4 = p.K / 4u;
  let cw = wid.x * LANES + lane;
  let c4 = min(cw, n4 - 1u);
  let row0 = wid.y * 16u;
  let r0 = row(row0 + lane) * k4;
  let r1 = row(row0 + 8u + lane) * k4;
  var acc: array<vec4<f32>, 16>;
  for (var kk = 0u; kk < k4; kk++) {
    var b: array<vec4<f16>, 4>;        // b[t]: B's row 4kk + t at the 4 columns
    if (tb) {
      let j = 4u * c4;
      let q0 = b4(j * k4 + kk);
      let q1 = b4((j + 1u) * k4 + kk);
      let q2 = b4((j + 2u) * k4 + kk);
      let q3 = b4((j + 3u) * k4 + kk);
      b[0] = vec4<f16>(q0.x, q1.x, q2.x, q3.x);
      b[1] = vec4<f16>(q0.y, q1.y, q2.y, q3.y);
      b[2] = vec4<f16>(q0.z, q1.z, q2.z, q3.z);
      b[3] = vec4<f16>(q0.w, q1.w, q2.w, q3.w);
    } else {
      for (var t = 0u; t < 4u; t++) { b[t] = b4((4u * kk + t) * n4 + c4); }
    }
    let x0 = a4(r0 + kk);
    let x1 = a4(r1 + kk);
    mac(&acc, 0u, subgroupBroadcast(x0, 0u), b);
    mac(&acc, 1u, subgroupBroadcast(x0, 1u), b);
    mac(&acc, 2u, subgroupBroadcast(x0, 2u), b);
    mac(&acc, 3u, subgroupBroadcast(x0, 3u), b);
    mac(&acc, 4u, subgroupBroadcast(x0, 4u), b);
    mac(&acc, 5u, subgroupBroadcast(x0, 5u), b);
    mac(&acc, 6u, subgroupBroadcast(x0, 6u), b);
    mac(&acc, 7u, subgroupBroadcast(x0, 7u), b);
    mac(&acc, 8u, subgroupBroadcast(x1, 0u), b);
    mac(&acc, 9u, subgroupBroadcast(x1, 1u), b);
    mac(&acc, 10u, subgroupBroadcast(x1, 2u), b);
    mac(&acc, 11u, subgroupBroadcast(x1, 3u), b);
    mac(&acc, 12u, subgroupBroadcast(x1, 4u), b);
    mac(&acc, 13u, subgroupBroadcast(x1, 5u), b);
    mac(&acc, 14u, subgroupBroadcast(x1, 6u), b);
    mac(&acc, 15u, subgroupBroadcast(x1, 7u), b);
  }
  store(acc, row0, c4, cw < n4);
}

@compute @workgroup_size(8)
fn matmul_f16_sg(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lane: u32) {
  a_times_b(wid, lane, false);
}

@compute @workgroup_size(8)
fn matmul_abt_f16_sg(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lane: u32) {
  a_times_b(wid, lane, true);
}

// the 16 values (4 vec4) of A's row k0 + t, from the lane t that loaded them
struct Row16 { y0: vec4<f16>, y1: vec4<f16>, y2: vec4<f16>, y3: vec4<f16> }

fn from_lane(y: Row16, t: u32) -> Row16 {
  switch t {
    case 0u: { return Row16(subgroupBroadcast(y.y0, 0u), subgroupBroadcast(y.y1, 0u), subgroupBroadcast(y.y2, 0u), subgroupBroadcast(y.y3, 0u)); }
    case 1u: { return Row16(subgroupBroadcast(y.y0, 1u), subgroupBroadcast(y.y1, 1u), subgroupBroadcast(y.y2, 1u), subgroupBroadcast(y.y3, 1u)); }
    case 2u: { return Row16(subgroupBroadcast(y.y0, 2u), subgroupBroadcast(y.y1, 2u), subgroupBroadcast(y.y2, 2u), subgroupBroadcast(y.y3, 2u)); }
    case 3u: { return Row16(subgroupBroadcast(y.y0, 3u), subgroupBroadcast(y.y1, 3u), subgroupBroadcast(y.y2, 3u), subgroupBroadcast(y.y3, 3u)); }
    case 4u: { return Row16(subgroupBroadcast(y.y0, 4u), subgroupBroadcast(y.y1, 4u), subgroupBroadcast(y.y2, 4u), subgroupBroadcast(y.y3, 4u)); }
    case 5u: { return Row16(subgroupBroadcast(y.y0, 5u), subgroupBroadcast(y.y1, 5u), subgroupBroadcast(y.y2, 5u), subgroupBroadcast(y.y3, 5u)); }
    case 6u: { return Row16(subgroupBroadcast(y.y0, 6u), subgroupBroadcast(y.y1, 6u), subgroupBroadcast(y.y2, 6u), subgroupBroadcast(y.y3, 6u)); }
    default: { return Row16(subgroupBroadcast(y.y0, 7u), subgroupBroadcast(y.y1, 7u), subgroupBroadcast(y.y2, 7u), subgroupBroadcast(y.y3, 7u)); }
  }
}

// out rows 4j..4j+3 += y (A's row k at those 4 output rows) times b (B's row k): f16 products
fn outer(acc: ptr<function, array<vec4<f32>, 16>>, j: u32, h: vec4<f16>, b: vec4<f16>) {
  (*acc)[4u * j] += vec4<f32>(h.x * b);
  (*acc)[4u * j + 1u] += vec4<f32>(h.y * b);
  (*acc)[4u * j + 2u] += vec4<f32>(h.z * b);
  (*acc)[4u * j + 3u] += vec4<f32>(h.w * b);
}

// A^T @ B: lane t loads A's row k0 + t at the 16 output rows (4 vec4); every lane then walks the
// 8 rows, each from its lane, with its own row of B.
@compute @workgroup_size(8)
fn matmul_atb_f16_sg(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lane: u32) {
  let n4 = p.N / 4u;
  let m4 = p.M / 4u;
  let cw = wid.x * LANES + lane;
  let c4 = min(cw, n4 - 1u);
  let row0 = wid.y * 16u;
  let q = row0 / 4u;
  var acc: array<vec4<f32>, 16>;
  for (var k0 = 0u; k0 < p.K; k0 += 8u) {
    let kl = min(k0 + lane, p.K - 1u);
    let mine = Row16(a4(kl * m4 + min(q, m4 - 1u)), a4(kl * m4 + min(q + 1u, m4 - 1u)),
                     a4(kl * m4 + min(q + 2u, m4 - 1u)), a4(kl * m4 + min(q + 3u, m4 - 1u)));
    for (var t = 0u; t < 8u; t++) {
      let y = from_lane(mine, t);          // every lane, every t: the broadcasts need all 8
      if (k0 + t < p.K) {
        let b = b4((k0 + t) * n4 + c4);
        outer(&acc, 0u, y.y0, b);
        outer(&acc, 1u, y.y1, b);
        outer(&acc, 2u, y.y2, b);
        outer(&acc, 3u, y.y3, b);
      }
    }
  }
  store(acc, row0, c4, cw < n4);
}
