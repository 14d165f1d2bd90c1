// The matmuls in the shape GPUs reward, in every precision: workgroup-memory tiles, a register
// block per invocation. A template, completed by products.wgsl (float32 products for f32 and
// bf16, its f16 section for f16) with the type T the products are taken in, as matmul.wgsl is.
//   matmul_tiled      out[M,N] = A[M,K]   @ B[K,N] (+ bias[N])
//   matmul_abt_tiled  out[M,N] = A[M,K]   @ B[N,K]^T
//   matmul_atb_tiled  out[M,N] = A[K,M]^T @ B[K,N]
// A workgroup of WX x WY invocations owns a BM x BN tile of out (BM = WY*TM rows, BN = WX*4*TV
// columns). For each slice of BK values of k it loads the A and B tiles it needs into workgroup
// memory once (in T: f16 tiles take half the memory and half the bytes), every invocation loading
// a share with vec4 reads, then each invocation multiplies its TM rows by its TV vec4 columns from
// there: every value read from memory is used BM or BN times instead of once. On a GPU that is what
// turns a memory-bound product into a compute-bound one (TinyGPT's own GPU matmul took the same two
// steps, tiles, then register blocks). Lavapipe reads workgroup memory a lane at a time and pays
// for each barrier, so there the subgroup kernels stay faster: `tinygpt tune` races them on every
// adapter.
// Shapes: N and K multiples of 4, and M too for A^T @ B (kernels.vec4_ok); any M, N, K otherwise:
// tile rows, columns and k past the edges are loaded as zeros and not stored.
// An operand is float32 (A, B) or, where an override constant says so, the precision's half type
// (AH4, BH4, OH4: the products file declares them; the bindings not used are bound to a dummy):
//   A_HALF, B_HALF  that operand is half: the tile loads read half the bytes.
//   OUT_HALF        out is written as half values, bias added first; no accumulate.

// batched: workgroup row z works on the z-th product, its A, B and out sa, sb, so values on
struct Params { M: u32, N: u32, K: u32, has_bias: u32, accumulate: u32, batch: u32, sa: u32, sb: u32, so: u32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> A: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> B: array<vec4<f32>>;
@group(0) @binding(5) var<storage, read> bias: array<vec4<f32>>;
@group(0) @binding(6) var<storage, read_write> out: array<vec4<f32>>;

override WX: u32 = 16u;   // invocations along N
override WY: u32 = 16u;   // invocations along M
override TM: u32 = 4u;    // rows per invocation, at most 8
override TV: u32 = 1u;    // vec4 columns per invocation, at most 2
override BK: u32 = 16u;   // k per tile, a multiple of 4
override A_HALF: bool = false;
override B_HALF: bool = false;
override OUT_HALF: bool = false;
const TM_MAX: u32 = 8u;
const TV_MAX: u32 = 2u;

// A tile k-major: as_[k * BM + i] = A(i0 + i, k0 + k); B tile k-major in vec4: bs[k * BN4 + j4]
var<workgroup> as_: array<T, BK * WY * TM>;
var<workgroup> bs: array<vec4<T>, BK * WX * TV>;

// this product's first vec4 (as if float32) of A, B and out: all 0 unbatched
var<private> oa: u32;
var<private> ob: u32;
var<private> oo: u32;

// 4 consecutive values of an operand by their vec4 index, as T
fn a4(at: u32) -> vec4<T> {
  if (A_HALF) { return a_half4(oa + at); }
  return wide4(A[oa + at]);
}

fn b4(at: u32) -> vec4<T> {
  if (B_HALF) { return b_half4(ob + at); }
  return wide4(B[ob + at]);
}

// Load the A and B tiles of the k-slice k0 (ta: A is stored [K, M]; tb: B is stored [N, K]).
fn load_tiles(li: u32, i0: u32, j0: u32, k0: u32, ta: bool, tb: bool) {
  let nt = WX * WY;
  let BM = WY * TM;
  let BN4 = WX * TV;
  let K4 = p.K / 4u;
  let N4 = p.N / 4u;
  let M4 = p.M / 4u;
  // A: BM * BK / 4 vec4, each 4 consecutive k of one row (or, ta, 4 consecutive rows of one k)
  for (var e = li; e < BM * BK / 4u; e += nt) {
    var v = vec4<T>();
    if (ta) {
      let k = e / (BM / 4u);
      let i4 = e % (BM / 4u);
      if (k0 + k < p.K && i0 / 4u + i4 < M4) { v = a4((k0 + k) * M4 + i0 / 4u + i4); }
      for (var c = 0u; c < 4u; c++) { as_[k * BM + 4u * i4 + c] = v[c]; }
    } else {
      let i = e / (BK / 4u);
      let k4 = e % (BK / 4u);
      if (i0 + i < p.M && k0 / 4u + k4 < K4) { v = a4((i0 + i) * K4 + k0 / 4u + k4); }
      for (var c = 0u; c < 4u; c++) { as_[(4u * k4 + c) * BM + i] = v[c]; }
    }
  }
  // B: BK * BN4 vec4, each 4 consecutive columns of one k (or, tb, 4 consecutive k of one column)
  for (var e = li; e < BK * BN4; e += nt) {
    if (tb) {
      let j = e / (BK / 4u);            // column within the tile, 0 .. 4*BN4
      let k4 = e % (BK / 4u);
      var v = vec4<T>();
      if (j0 + j < p.N && k0 / 4u + k4 < K4) { v = b4((j0 + j) * K4 + k0 / 4u + k4); }
      for (var c = 0u; c < 4u; c++) { bs[(4u * k4 + c) * BN4 + j / 4u][j % 4u] = v[c]; }
      // each e fills one column of 4 k; the 4*BN4 columns x BK/4 groups = BK * BN4 loads in all
    } else {
      let k = e / BN4;
      let j4 = e % BN4;
      var v = vec4<T>();
      if (k0 + k < p.K && j0 / 4u + j4 < N4) { v = b4((k0 + k) * N4 + j0 / 4u + j4); }
      bs[k * BN4 + j4] = v;
    }
  }
}

fn tiled(wid: vec3<u32>, lid: vec3<u32>, ta: bool, tb: bool) {
  oa = wid.z * (p.sa / 4u);
  ob = wid.z * (p.sb / 4u);
  oo = wid.z * (p.so / 4u);
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
      var b: array<vec4<T>, TV_MAX>;
      for (var v = 0u; v < TV; v++) { b[v] = bs[k * BN4 + v * WX + lid.x]; }
      for (var r = 0u; r < TM; r++) {
        let a = as_[k * BM + lid.y * TM + r];
        for (var v = 0u; v < TV; v++) { acc[r][v] = mac(a, b[v], acc[r][v]); }
      }
    }
    workgroupBarrier();
  }
  let N4 = p.N / 4u;
  for (var r = 0u; r < TM; r++) {
    let i = i0 + lid.y * TM + r;
    if (i >= p.M) { break; }
    for (var v = 0u; v < TV; v++) {
      let j4 = j0 / 4u + v * WX + lid.x;   // lanes side by side: neighbouring lanes, neighbouring vec4
      if (j4 >= N4) { continue; }
      var o = acc[r][v];
      if (p.has_bias != 0u) { o += bias[j4]; }
      let at = oo + i * N4 + j4;
      if (OUT_HALF) { store_half4(at, o); continue; }
      if (p.accumulate != 0u) { o += out[at]; }
      out[at] = o;
    }
  }
}

@compute @workgroup_size(WX, WY)
fn matmul_tiled(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
  tiled(wid, lid, false, false);
}

@compute @workgroup_size(WX, WY)
fn matmul_abt_tiled(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
  tiled(wid, lid, false, true);
}

@compute @workgroup_size(WX, WY)
fn matmul_atb_tiled(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
  tiled(wid, lid, true, false);
}
