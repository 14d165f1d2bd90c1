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
//
// The turned matmuls (matmul_vec4.wgsl says why): the projections that write a rotary model's
// float32 q and k, turned by RoPE where out is stored. TV = 2 and HALF4 = hd / 8: the tile's
// first WX vec4 columns are the first halves of WX RoPE pairs, its last WX the second halves, so
// an invocation's two columns are one pair's halves.
//   matmul_rope_tiled, matmul_abt_rope_tiled

// batched: workgroup row z works on the z-th product, its A, B and out sa, sb, so values on;
// T, offset: the turned matmuls' positions (row i at i % T + offset)
struct Params { M: u32, N: u32, K: u32, has_bias: u32, accumulate: u32, batch: u32, sa: u32, sb: u32, so: u32,
                T: u32, offset: u32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> A: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> B: array<vec4<f32>>;
@group(0) @binding(5) var<storage, read> bias: array<vec4<f32>>;
@group(0) @binding(6) var<storage, read_write> out: array<vec4<f32>>;
@group(0) @binding(8) var<storage, read> cs: array<vec2<f32>>;   // the turned matmuls': (cos, sin) [positions, hd/2]

override WX: u32 = 16u;   // invocations along N
override WY: u32 = 16u;   // invocations along M
override TM: u32 = 4u;    // rows per invocation, at most 8
override TV: u32 = 1u;    // vec4 columns per invocation, at most 2
override BK: u32 = 16u;   // k per tile, a multiple of 4
override A_HALF: bool = false;
override B_HALF: bool = false;
override OUT_HALF: bool = false;
override HALF4: u32 = 0u;   // the turned matmuls': hd / 8 (0: not turned)
override H4: u32 = max(HALF4, 1u);   // as a divisor (matmul_vec4.wgsl's H4 says why)
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

// The global vec4 column of the tile's vec4 column jv (tile at column j0), and whether it is real.
// Turned: pair q = j0 / 8 + jv % WX is vec4 column q % HALF4 of head q / HALF4's first half; jv <
// WX takes it, jv >= WX the same column of the head's second half.
fn tile_col4(j0: u32, jv: u32) -> u32 {
  if (HALF4 == 0u) { return j0 / 4u + jv; }
  let q = j0 / 8u + jv % WX;
  return (q / H4) * 2u * H4 + q % H4 + (jv / WX) * HALF4;
}

fn tile_live4(j0: u32, jv: u32) -> bool {
  if (HALF4 == 0u) { return j0 / 4u + jv < p.N / 4u; }
  return j0 / 8u + jv % WX < p.N / 8u;
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
      let col = 4u * tile_col4(j0, j / 4u) + j % 4u;
      if (tile_live4(j0, j / 4u) && k0 / 4u + k4 < K4) { v = b4(col * K4 + k0 / 4u + k4); }
      for (var c = 0u; c < 4u; c++) { bs[(4u * k4 + c) * BN4 + j / 4u][j % 4u] = v[c]; }
      // each e fills one column of 4 k; the 4*BN4 columns x BK/4 groups = BK * BN4 loads in all
    } else {
      let k = e / BN4;
      let j4 = e % BN4;
      var v = vec4<T>();
      if (k0 + k < p.K && tile_live4(j0, j4)) { v = b4((k0 + k) * N4 + tile_col4(j0, j4)); }
      bs[k * BN4 + j4] = v;
    }
  }
}

// each invocation's block: TM rows by TV vec4 columns
alias Block = array<array<vec4<f32>, TV_MAX>, TM_MAX>;

fn tiled(wid: vec3<u32>, lid: vec3<u32>, ta: bool, tb: bool) -> Block {
  oa = wid.z * (p.sa / 4u);
  ob = wid.z * (p.sb / 4u);
  oo = wid.z * (p.so / 4u);
  let BM = WY * TM;
  let BN4 = WX * TV;
  let i0 = wid.y * BM;
  let j0 = wid.x * BN4 * 4u;
  let li = lid.y * WX + lid.x;
  var acc: Block;
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
  return acc;
}

fn store_block(wid: vec3<u32>, lid: vec3<u32>, acc: Block) {
  let i0 = wid.y * WY * TM;
  let j0 = wid.x * WX * TV * 4u;
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

// The turned matmuls' store (TV = 2): the invocation's columns v = 0 and 1 are the halves of a
// pair, x1 and x2, bias (and what out holds) added, then (x1 cos - x2 sin, x2 cos + x1 sin) at
// each row's position, as rope_forward turns, stored (float32 operands and out).
fn turn_block(wid: vec3<u32>, lid: vec3<u32>, acc: Block) {
  let j0 = wid.x * WX * TV * 4u;
  if (!tile_live4(j0, lid.x)) { return; }
  let N4 = p.N / 4u;
  let ca = tile_col4(j0, lid.x);
  let cb = ca + HALF4;
  var b1 = vec4<f32>();
  var b2 = vec4<f32>();
  if (p.has_bias != 0u) { b1 = bias[ca]; b2 = bias[cb]; }
  let c0 = 4u * (ca % (2u * H4));          // the pair's first channel in its head, < hd/2
  for (var r = 0u; r < TM; r++) {
    let i = wid.y * WY * TM + lid.y * TM + r;
    if (i >= p.M) { break; }
    var x1 = acc[r][0] + b1;
    var x2 = acc[r][1] + b2;
    if (p.accumulate != 0u) { x1 += out[oo + i * N4 + ca]; x2 += out[oo + i * N4 + cb]; }
    let t = (i % p.T + p.offset) * (4u * HALF4) + c0;      // the table's row: position * hd/2
    let y = turn4(x1, x2, cs[t], cs[t + 1u], cs[t + 2u], cs[t + 3u]);
    out[oo + i * N4 + ca] = y.x1;
    out[oo + i * N4 + cb] = y.x2;
  }
}

@compute @workgroup_size(WX, WY)
fn matmul_tiled(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
  store_block(wid, lid, tiled(wid, lid, false, false));
}

@compute @workgroup_size(WX, WY)
fn matmul_abt_tiled(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
  store_block(wid, lid, tiled(wid, lid, false, true));
}

@compute @workgroup_size(WX, WY)
fn matmul_atb_tiled(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
  store_block(wid, lid, tiled(wid, lid, true, false));
}

@compute @workgroup_size(WX, WY)
fn matmul_rope_tiled(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
  turn_block(wid, lid, tiled(wid, lid, false, false));
}

@compute @workgroup_size(WX, WY)
fn matmul_abt_rope_tiled(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
  turn_block(wid, lid, tiled(wid, lid, false, true));
}
