enable f16;
// matmul_tiled.wgsl's workgroup tiles and register blocks with f16 products: the GPU default
// family (plan.matmul "tiled") in half precision.
//   matmul_f16_tiled      out[M,N] = A[M,K]   @ B[K,N] (+ bias[N])
//   matmul_abt_f16_tiled  out[M,N] = A[M,K]   @ B[N,K]^T
//   matmul_atb_f16_tiled  out[M,N] = A[K,M]^T @ B[K,N]
// The tiles hold f16, so a k-slice takes half the workgroup memory of the float32 tiles and each
// load moves half the bytes; each invocation multiplies one f16 of its A rows by a vec4<f16> of its
// B columns (4 f16 products in one packed multiply), widens the product to float32 and adds it to
// a float32 accumulator: the sums are never f16, as in matmul_f16_vec4.wgsl.
// Tile shape (WX, WY, TM, TV, BK) as matmul_tiled.wgsl's, from the plan; shapes as kernels.f16_vec4_ok
// (N and K multiples of 4; M and N for A^T @ B, which takes any K); tile rows, columns and k past
// the edges load as zeros and are not stored. Operands and out as matmul_f16.wgsl's: f16, or float32
// rounded to f16 as it is read (A32, B32; A_F32, B_F32), out float32 (out32) or f16 (out16, OUT_F16).

struct Params { M: u32, N: u32, K: u32, has_bias: u32, accumulate: u32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> A16: array<vec4<f16>>;
@group(0) @binding(2) var<storage, read> B16: array<vec4<f16>>;
@group(0) @binding(3) var<storage, read> A32: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read> B32: array<vec4<f32>>;
@group(0) @binding(5) var<storage, read> bias: array<vec4<f32>>;
@group(0) @binding(6) var<storage, read_write> out32: array<vec4<f32>>;
@group(0) @binding(7) var<storage, read_write> out16: array<vec4<f16>>;

override WX: u32 = 16u;   // invocations along N
override WY: u32 = 16u;   // invocations along M
override TM: u32 = 4u;    // rows per invocation, at most 8
override TV: u32 = 1u;    // vec4 columns per invocation, at most 2
override BK: u32 = 16u;   // k per tile, a multiple of 4
override A_F32: bool = false;
override B_F32: bool = false;
override OUT_F16: bool = false;
const TM_MAX: u32 = 8u;
const TV_MAX: u32 = 2u;

// A tile k-major: as_[k * BM + i] = A(i0 + i, k0 + k); B tile k-major in vec4: bs[k * BN4 + j4]
var<workgroup> as_: array<f16, BK * WY * TM>;
var<workgroup> bs: array<vec4<f16>, BK * WX * TV>;

fn a4(i: u32) -> vec4<f16> {          // vec4 i of A as stored
  if (A_F32) { return to_f16x4(A32[i]); }
  return A16[i];
}

fn b4(i: u32) -> vec4<f16> {
  if (B_F32) { return to_f16x4(B32[i]); }
  return B16[i];
}

// Load the A and B tiles of the k-slice k0 (ta: A is stored [K, M]; tb: B is stored [N, K]).
fn load_tiles(li: u32, i0: u32, j0: u32, k0: u32, ta: bool, tb: bool) {
  let nt = WX * WY;
  let BM = WY * TM;
  let BN4 = WX * TV;
  let K4 = p.K / 4u;
  let N4 = p.N / 4u;
  let M4 = p.M / 4u;
  for (var e = li; e < BM * BK / 4u; e += nt) {
    var v = vec4<f16>();
    if (ta) {          // 4 consecutive rows of one k
      let k = e / (BM / 4u);
      let i4 = e % (BM / 4u);
      if (k0 + k < p.K && i0 / 4u + i4 < M4) { v = a4((k0 + k) * M4 + i0 / 4u + i4); }
      for (var c = 0u; c < 4u; c++) { as_[k * BM + 4u * i4 + c] = v[c]; }
    } else {           // 4 consecutive k of one row
      let i = e / (BK / 4u);
      let k4 = e % (BK / 4u);
      if (i0 + i < p.M && k0 / 4u + k4 < K4) { v = a4((i0 + i) * K4 + k0 / 4u + k4); }
      for (var c = 0u; c < 4u; c++) { as_[(4u * k4 + c) * BM + i] = v[c]; }
    }
  }
  for (var e = li; e < BK * BN4; e += nt) {
    var v = vec4<f16>();
    if (tb) {          // 4 consecutive k of one column, spread over 4 rows of the tile
      let j = e / (BK / 4u);
      let k4 = e % (BK / 4u);
      if (j0 + j < p.N && k0 / 4u + k4 < K4) { v = b4((j0 + j) * K4 + k0 / 4u + k4); }
      for (var c = 0u; c < 4u; c++) { bs[(4u * k4 + c) * BN4 + j / 4u][j % 4u] = v[c]; }
    } else {           // 4 consecutive columns of one k
      let k = e / BN4;
      let j4 = e % BN4;
      if (k0 + k < p.K && j0 / 4u + j4 < N4) { v = b4((k0 + k) * N4 + j0 / 4u + j4); }
      bs[k * BN4 + j4] = v;
    }
  }
}

fn tiled(wid: vec3<u32>, lid: vec3<u32>, ta: bool, tb: bool) {
  let BM = WY * TM;
  let BN4 = WX * TV;
  let i0 = wid.y * BM;
  let j0 = wid.x * BN4 * 4u;
  let li = lid.y * WX + lid.x;
  var acc: array<array<vec4<f32>, TV_MAX>, TM_MAX>;
  for (var k0 = 0u; k0 < p.K; k0 += BK) {
    load_tiles(li, i0, j0, k0, ta, tb);
    workgroupBarrier();
    for (var k = 0u; k < BK; k++) {
      var b: array<vec4<f16>, TV_MAX>;
      for (var v = 0u; v < TV; v++) { b[v] = bs[k * BN4 + v * WX + lid.x]; }
      for (var r = 0u; r < TM; r++) {
        let a = as_[k * BM + lid.y * TM + r];
        for (var v = 0u; v < TV; v++) { acc[r][v] += vec4<f32>(a * b[v]); }
      }
    }
    workgroupBarrier();
  }
  let N4 = p.N / 4u;
  for (var r = 0u; r < TM; r++) {
    let i = i0 + lid.y * TM + r;
    if (i >= p.M) { break; }
    for (var v = 0u; v < TV; v++) {
      let j4 = j0 / 4u + v * WX + lid.x;
      if (j4 >= N4) { continue; }
      var o = acc[r][v];
      if (p.has_bias != 0u) { o += bias[j4]; }
      if (OUT_F16) { out16[i * N4 + j4] = to_f16x4(o); continue; }
      if (p.accumulate != 0u) { o += out32[i * N4 + j4]; }
      out32[i * N4 + j4] = o;
    }
  }
}

@compute @workgroup_size(WX, WY)
fn matmul_f16_tiled(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
  tiled(wid, lid, false, false);
}

@compute @workgroup_size(WX, WY)
fn matmul_abt_f16_tiled(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
  tiled(wid, lid, false, true);
}

@compute @workgroup_size(WX, WY)
fn matmul_atb_f16_tiled(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
  tiled(wid, lid, true, false);
}
