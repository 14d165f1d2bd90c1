//#if sg
enable subgroups;
//#endif
// Matmuls of small register blocks, taken in the products' type: a template, completed by
// products.wgsl as matmul.wgsl and matmul_tiled.wgsl are (the type T of the products, how a
// stored half operand is read and a half result stored). The f16 precision's fast matmuls (its
// products: each one f16 multiply of 4 lanes, the packed rate GPUs double, widened to float32 and
// added, so the sums are float32, never f16), for shapes where N and K (M and N for
// matmul_atb_quad, which takes any K) are multiples of 4 (kernels.quad_ok); the scalar template
// takes the rest. With float32 products they read bf16 as the tiled template does.
//   matmul_quad_vec4      out[M,N] = A[M,K]   @ B[K,N] (+ bias[N])
//   matmul_abt_quad_vec4  out[M,N] = A[M,K]   @ B[N,K]^T
//   matmul_atb_quad_vec4  out[M,N] = A[K,M]^T @ B[K,N]
//   matmul_quad_sg, matmul_abt_quad_sg, matmul_atb_quad_sg: the same with subgroup broadcasts (the
//                        sg section), for adapters whose subgroups pass the plan's check
//                        (device/planner.py): the same products, bindings, overrides and shapes
// An operand is float32 (A, B: rounded to T as read, wide4) or, where an override constant says
// so, the precision's half type (AH4, BH4: the products file declares them; the bindings not used
// are bound to a dummy); out float32 (out) or half (OH4, OUT_HALF). Rows past M are clamped on
// load and skipped on store.
//
// vec4: each invocation owns a 4 x 4 block of out: 4 rows, one vec4 of columns. Per 4 steps of K
// it loads 4 vec4 of A and 4 of B and takes 16 vec4<T> products. 8 x 8 invocations a
// workgroup: 32 x 32 of out.
// sg: a workgroup is one subgroup of 8 lanes owning 16 rows x 32 columns of out; lane l owns the
// 4 columns 4(8 wid.x + l).. of all 16 rows. Why another algorithm: lavapipe loads one lane at a
// time whatever the address (matmul_vec4.wgsl says how that was measured), so the rows of A are
// loaded once, by one lane each, and handed to the others by broadcast. Per lane and 4 k (A @ B):
// 2 loads of A and 4 of B for 256 products; A^T @ B, per 8 k: 4 of A and 8 of B for 512. The
// broadcasts carry T.

struct Params { M: u32, N: u32, K: u32, has_bias: u32, accumulate: u32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> A: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> B: array<vec4<f32>>;
@group(0) @binding(5) var<storage, read> bias: array<vec4<f32>>;
@group(0) @binding(6) var<storage, read_write> out: array<vec4<f32>>;

override A_HALF: bool = false;
override B_HALF: bool = false;
override OUT_HALF: bool = false;

fn a4(i: u32) -> vec4<T> {            // vec4 i of A, row-major
  if (A_HALF) { return a_half4(i); }
  return wide4(A[i]);
}

fn b4(i: u32) -> vec4<T> {
  if (B_HALF) { return b_half4(i); }
  return wide4(B[i]);
}

fn row(r: u32) -> u32 { return min(r, p.M - 1u); }

// out row i at the 4 columns c4 (v: the products' sums plus the bias)
fn put(i: u32, c4: u32, v: vec4<f32>) {
  let o = i * (p.N / 4u) + c4;
  if (OUT_HALF) {
    store_half4(o, v);
  } else {
    var w = v;
    if (p.accumulate != 0u) { w += out[o]; }
    out[o] = w;
  }
}

fn bias4(c4: u32) -> vec4<f32> {
  if (p.has_bias != 0u) { return bias[c4]; }
  return vec4<f32>();
}

// B's rows 4kk .. 4kk + 3 at the 4 columns c4 (k4 = K / 4): A @ B reads them as they lie; for
// A @ B^T (tb) columns 4c4.. are B's rows, each a vec4 along k, transposed here
fn b_rows(c4: u32, kk: u32, k4: u32, tb: bool) -> array<vec4<T>, 4> {
  var bk: array<vec4<T>, 4>;
  if (tb) {
    let j = 4u * c4;
    let q0 = b4(j * k4 + kk);
    let q1 = b4((j + 1u) * k4 + kk);
    let q2 = b4((j + 2u) * k4 + kk);
    let q3 = b4((j + 3u) * k4 + kk);
    bk[0] = vec4<T>(q0.x, q1.x, q2.x, q3.x);
    bk[1] = vec4<T>(q0.y, q1.y, q2.y, q3.y);
    bk[2] = vec4<T>(q0.z, q1.z, q2.z, q3.z);
    bk[3] = vec4<T>(q0.w, q1.w, q2.w, q3.w);
  } else {
    for (var t = 0u; t < 4u; t++) { bk[t] = b4((4u * kk + t) * (p.N / 4u) + c4); }
  }
  return bk;
}

fn store(acc: array<vec4<f32>, 4>, row0: u32, c4: u32) {
  let b = bias4(c4);
  for (var r = 0u; r < 4u; r++) {
    if (row0 + r >= p.M) { return; }
    put(row0 + r, c4, acc[r] + b);
  }
}

// A @ B (tb false) or A @ B^T (tb true)
fn a_times_b(gid: vec3<u32>, tb: bool) {
  let n4 = p.N / 4u;
  let k4 = p.K / 4u;
  let c4 = gid.x;
  let row0 = gid.y * 4u;
  if (c4 >= n4 || row0 >= p.M) { return; }
  var acc: array<vec4<f32>, 4>;
  for (var kk = 0u; kk < k4; kk++) {
    let bk = b_rows(c4, kk, k4, tb);   // bk[t]: B's row 4kk + t at the 4 columns
    for (var r = 0u; r < 4u; r++) {
      let a = a4(row(row0 + r) * k4 + kk);
      acc[r] += vec4<f32>(a.x * bk[0]) + vec4<f32>(a.y * bk[1]) + vec4<f32>(a.z * bk[2]) + vec4<f32>(a.w * bk[3]);
    }
  }
  store(acc, row0, c4);
}

@compute @workgroup_size(64)
fn matmul_quad_vec4(@builtin(global_invocation_id) gid: vec3<u32>) { a_times_b(gid, false); }

@compute @workgroup_size(64)
fn matmul_abt_quad_vec4(@builtin(global_invocation_id) gid: vec3<u32>) { a_times_b(gid, true); }

// A^T @ B: per k, one vec4 of A's row k (out rows row0..) and one of B's (the 4 columns): an
// outer product of T lanes
@compute @workgroup_size(64)
fn matmul_atb_quad_vec4(@builtin(global_invocation_id) gid: vec3<u32>) {
  let n4 = p.N / 4u;
  let m4 = p.M / 4u;
  let c4 = gid.x;
  let row0 = gid.y * 4u;
  if (c4 >= n4 || row0 >= p.M) { return; }
  var acc: array<vec4<f32>, 4>;
  for (var k = 0u; k < p.K; k++) {
    let b = b4(k * n4 + c4);
    let a = a4(k * m4 + gid.y);
    acc[0] += vec4<f32>(a.x * b);
    acc[1] += vec4<f32>(a.y * b);
    acc[2] += vec4<f32>(a.z * b);
    acc[3] += vec4<f32>(a.w * b);
  }
  store(acc, row0, c4);
}
//#if sg

const LANES: u32 = 8u;

// out row r += a . (B's rows k..k+3 at the 4 columns): four T products per column, float32 sums
fn mac_row(acc: ptr<function, array<vec4<f32>, 16>>, r: u32, h: vec4<T>, b: array<vec4<T>, 4>) {
  (*acc)[r] += vec4<f32>(h.x * b[0]) + vec4<f32>(h.y * b[1]) + vec4<f32>(h.z * b[2]) + vec4<f32>(h.w * b[3]);
}

fn store16(acc: array<vec4<f32>, 16>, row0: u32, c4: u32, live: bool) {
  if (!live) { return; }
  let b = bias4(c4);
  for (var r = 0u; r < 16u; r++) {
    if (row0 + r >= p.M) { return; }
    put(row0 + r, c4, acc[r] + b);
  }
}

// A @ B (tb false) or A @ B^T (tb true). Lane l loads rows l and 8 + l of the workgroup's 16.
fn a_times_b_sg(wid: vec3<u32>, lane: u32, tb: bool) {
  let n4 = p.N / 4u;
  let k4 = p.K / 4u;
  let cw = wid.x * LANES + lane;
  let c4 = min(cw, n4 - 1u);
  let row0 = wid.y * 16u;
  let r0 = row(row0 + lane) * k4;
  let r1 = row(row0 + 8u + lane) * k4;
  var acc: array<vec4<f32>, 16>;
  for (var kk = 0u; kk < k4; kk++) {
    let b = b_rows(c4, kk, k4, tb);    // b[t]: B's row 4kk + t at the 4 columns
    let x0 = a4(r0 + kk);
    let x1 = a4(r1 + kk);
    mac_row(&acc, 0u, subgroupBroadcast(x0, 0u), b);
    mac_row(&acc, 1u, subgroupBroadcast(x0, 1u), b);
    mac_row(&acc, 2u, subgroupBroadcast(x0, 2u), b);
    mac_row(&acc, 3u, subgroupBroadcast(x0, 3u), b);
    mac_row(&acc, 4u, subgroupBroadcast(x0, 4u), b);
    mac_row(&acc, 5u, subgroupBroadcast(x0, 5u), b);
    mac_row(&acc, 6u, subgroupBroadcast(x0, 6u), b);
    mac_row(&acc, 7u, subgroupBroadcast(x0, 7u), b);
    mac_row(&acc, 8u, subgroupBroadcast(x1, 0u), b);
    mac_row(&acc, 9u, subgroupBroadcast(x1, 1u), b);
    mac_row(&acc, 10u, subgroupBroadcast(x1, 2u), b);
    mac_row(&acc, 11u, subgroupBroadcast(x1, 3u), b);
    mac_row(&acc, 12u, subgroupBroadcast(x1, 4u), b);
    mac_row(&acc, 13u, subgroupBroadcast(x1, 5u), b);
    mac_row(&acc, 14u, subgroupBroadcast(x1, 6u), b);
    mac_row(&acc, 15u, subgroupBroadcast(x1, 7u), b);
  }
  store16(acc, row0, c4, cw < n4);
}

@compute @workgroup_size(8)
fn matmul_quad_sg(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lane: u32) {
  a_times_b_sg(wid, lane, false);
}

@compute @workgroup_size(8)
fn matmul_abt_quad_sg(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lane: u32) {
  a_times_b_sg(wid, lane, true);
}

// the 16 values (4 vec4) of A's row k0 + t, from the lane t that loaded them
struct Row16 { y0: vec4<T>, y1: vec4<T>, y2: vec4<T>, y3: vec4<T> }

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

// out rows 4j..4j+3 += y (A's row k at those 4 output rows) times b (B's row k): T products
fn outer(acc: ptr<function, array<vec4<f32>, 16>>, j: u32, h: vec4<T>, b: vec4<T>) {
  (*acc)[4u * j] += vec4<f32>(h.x * b);
  (*acc)[4u * j + 1u] += vec4<f32>(h.y * b);
  (*acc)[4u * j + 2u] += vec4<f32>(h.z * b);
  (*acc)[4u * j + 3u] += vec4<f32>(h.w * b);
}

// A^T @ B: lane t loads A's row k0 + t at the 16 output rows (4 vec4); every lane then walks the
// 8 rows, each from its lane, with its own row of B.
@compute @workgroup_size(8)
fn matmul_atb_quad_sg(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lane: u32) {
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
  store16(acc, row0, c4, cw < n4);
}
//#endif
