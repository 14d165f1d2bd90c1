// Matrix products of the trainer, row-major, weights stored [in, out].
//   matmul      out[M,N] = A[M,K]   @ B[K,N]   (+ bias[N])   forward  x @ W + b
//   matmul_abt  out[M,N] = A[M,K]   @ B[N,K]^T               backward dX = dY @ W^T, and the tied head
//   matmul_atb  out[M,N] = A[K,M]^T @ B[K,N]                 backward dW = X^T @ dY
// Each invocation keeps a TM x TN block of the output in registers and reads A
// and B straight from memory: no workgroup memory and no barriers, which is
// what a CPU adapter (lavapipe) rewards; out-of-range rows and columns are
// clamped on load and skipped on store, so any M, N, K works.
// `accumulate` adds into out (a weight used twice, like the tied embedding).
// Batched (Muon's Newton-Schulz over the matrices of one shape): workgroup row z
// of the grid works on the z-th product, its A, B and out starting sa, sb and so
// elements further on (batch counts the products, for the FLOP count alone).

struct Params { M: u32, N: u32, K: u32, has_bias: u32, accumulate: u32, batch: u32, sa: u32, sb: u32, so: u32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> A: array<f32>;
@group(0) @binding(2) var<storage, read> B: array<f32>;
@group(0) @binding(3) var<storage, read> bias: array<f32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;

override WG_X: u32 = 8u;   // invocations along N
override WG_Y: u32 = 8u;   // invocations along M
const TM: u32 = 4u;
const TN: u32 = 4u;

// this product's first element of A, B and out (all 0 unbatched)
var<private> oa: u32;
var<private> ob: u32;
var<private> oo: u32;

fn a_at(i: u32, k: u32, trans: bool) -> f32 {
  if (trans) { return A[oa + k * p.M + i]; }
  return A[oa + i * p.K + k];
}

fn b_at(k: u32, j: u32, trans: bool) -> f32 {
  if (trans) { return B[ob + j * p.K + k]; }
  return B[ob + k * p.N + j];
}

fn block(gid: vec3<u32>, ta: bool, tb: bool) {
  oa = gid.z * p.sa;
  ob = gid.z * p.sb;
  oo = gid.z * p.so;
  let row0 = gid.y * TM;
  let col0 = gid.x * TN;
  if (row0 >= p.M || col0 >= p.N) { return; }
  var rows: array<u32, 4>;
  var cols: array<u32, 4>;
  for (var r = 0u; r < TM; r++) { rows[r] = min(row0 + r, p.M - 1u); }
  for (var c = 0u; c < TN; c++) { cols[c] = min(col0 + c, p.N - 1u); }
  var acc: array<array<f32, 4>, 4>;
  for (var k = 0u; k < p.K; k++) {
    var a: array<f32, 4>;
    var b: array<f32, 4>;
    for (var r = 0u; r < TM; r++) { a[r] = a_at(rows[r], k, ta); }
    for (var c = 0u; c < TN; c++) { b[c] = b_at(k, cols[c], tb); }
    for (var r = 0u; r < TM; r++) {
      for (var c = 0u; c < TN; c++) { acc[r][c] = fma(a[r], b[c], acc[r][c]); }
    }
  }
  for (var r = 0u; r < TM; r++) {
    let i = row0 + r;
    if (i >= p.M) { break; }
    for (var c = 0u; c < TN; c++) {
      let j = col0 + c;
      if (j >= p.N) { break; }
      var v = acc[r][c];
      if (p.has_bias != 0u) { v += bias[j]; }
      if (p.accumulate != 0u) { v += out[oo + i * p.N + j]; }
      out[oo + i * p.N + j] = v;
    }
  }
}

@compute @workgroup_size(WG_X, WG_Y)
fn matmul(@builtin(global_invocation_id) gid: vec3<u32>) { block(gid, false, false); }

@compute @workgroup_size(WG_X, WG_Y)
fn matmul_abt(@builtin(global_invocation_id) gid: vec3<u32>) { block(gid, false, true); }

@compute @workgroup_size(WG_X, WG_Y)
fn matmul_atb(@builtin(global_invocation_id) gid: vec3<u32>) { block(gid, true, false); }
