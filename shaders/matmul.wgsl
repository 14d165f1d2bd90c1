// The matmuls for any shape, in every precision: a template that products.wgsl (float32 products
// for f32 and bf16, its f16 section for f16) completes with the type T the products are taken in
// and how a stored word becomes T (gpu.kernel's fill "f32" | "f16"). Row-major, weights stored [in, out].
//   matmul      out[M,N] = A[M,K]   @ B[K,N]   (+ bias[N])   forward  x @ W + b
//   matmul_abt  out[M,N] = A[M,K]   @ B[N,K]^T               backward dX = dY @ W^T, and the tied head
//   matmul_atb  out[M,N] = A[K,M]^T @ B[K,N]                 backward dW = X^T @ dY
// Each invocation keeps a 4 x 4 block of the output in registers and reads A and B straight from
// memory: no workgroup memory and no barriers, which is what a CPU adapter (lavapipe) rewards;
// rows and columns past the edges are clamped on load and skipped on store, so any M, N, K works.
// The vec4, subgroup and tiled kernels are the fast sets; this one takes the shapes they cannot.
// An operand is float32 (A, B) or, where A_HALF or B_HALF says so, the precision's half type
// (AH1, BH1: the products file declares them); out is float32 (out) or half (OH1, OUT_HALF: N
// even, so a pair of columns is whole or past N; no accumulate). The bindings not used are bound
// to a dummy. `accumulate` adds into a float32 out (a weight used twice, like the tied embedding).
// Batched (Muon's Newton-Schulz over the matrices of one shape): workgroup row z of the grid works
// on the z-th product, its A, B and out starting sa, sb and so elements further on (batch counts
// the products, for the FLOP count alone).

struct Params { M: u32, N: u32, K: u32, has_bias: u32, accumulate: u32, batch: u32, sa: u32, sb: u32, so: u32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> A: array<f32>;
@group(0) @binding(2) var<storage, read> B: array<f32>;
@group(0) @binding(5) var<storage, read> bias: array<f32>;
@group(0) @binding(6) var<storage, read_write> out: array<f32>;

override A_HALF: bool = false;
override B_HALF: bool = false;
override OUT_HALF: bool = false;

// this product's first element of A, B and out (all 0 unbatched)
var<private> oa: u32;
var<private> ob: u32;
var<private> oo: u32;

fn a_at(i: u32, k: u32, trans: bool) -> T {
  let e = oa + select(i * p.K + k, k * p.M + i, trans);
  if (A_HALF) { return a_half(e); }
  return wide(A[e]);
}

fn b_at(k: u32, j: u32, trans: bool) -> T {
  let e = ob + select(k * p.N + j, j * p.K + k, trans);
  if (B_HALF) { return b_half(e); }
  return wide(B[e]);
}

fn block(gid: vec3<u32>, ta: bool, tb: bool) {
  oa = gid.z * p.sa;
  ob = gid.z * p.sb;
  oo = gid.z * p.so;
  let row0 = gid.y * 4u;
  let col0 = gid.x * 4u;
  if (row0 >= p.M || col0 >= p.N) { return; }
  var rows: array<u32, 4>;
  var cols: array<u32, 4>;
  for (var r = 0u; r < 4u; r++) { rows[r] = min(row0 + r, p.M - 1u); }
  for (var c = 0u; c < 4u; c++) { cols[c] = min(col0 + c, p.N - 1u); }
  var acc: array<vec4<f32>, 4>;
  for (var k = 0u; k < p.K; k++) {
    let b = vec4<T>(b_at(k, cols[0], tb), b_at(k, cols[1], tb), b_at(k, cols[2], tb), b_at(k, cols[3], tb));
    for (var r = 0u; r < 4u; r++) { acc[r] = mac(a_at(rows[r], k, ta), b, acc[r]); }
  }
  for (var r = 0u; r < 4u; r++) {
    let i = row0 + r;
    if (i >= p.M) { break; }
    var v = acc[r];
    if (p.has_bias != 0u) {
      for (var c = 0u; c < 4u; c++) { v[c] += bias[cols[c]]; }
    }
    let at = oo + i * p.N + col0;
    if (OUT_HALF) {
      for (var c = 0u; c < 4u && col0 + c < p.N; c += 2u) { store_half2(at + c, v[c], v[c + 1u]); }
      continue;
    }
    for (var c = 0u; c < 4u && col0 + c < p.N; c++) {
      var w = v[c];
      if (p.accumulate != 0u) { w += out[at + c]; }
      out[at + c] = w;
    }
  }
}

@compute @workgroup_size(8, 8)
fn matmul(@builtin(global_invocation_id) gid: vec3<u32>) { block(gid, false, false); }

@compute @workgroup_size(8, 8)
fn matmul_abt(@builtin(global_invocation_id) gid: vec3<u32>) { block(gid, false, true); }

@compute @workgroup_size(8, 8)
fn matmul_atb(@builtin(global_invocation_id) gid: vec3<u32>) { block(gid, true, false); }
