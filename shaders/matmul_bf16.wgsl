// matmul.wgsl with bf16 operands (two to a u32, common.wgsl), float32 sums and output: the
// bf16 matmuls for adapters without working subgroups (matmul_bf16_sg.wgsl is the fast set).
//   matmul_bf16      out[M,N] = A[M,K]   @ B[K,N] (+ bias[N])
//   matmul_abt_bf16  out[M,N] = A[M,K]   @ B[N,K]^T
//   matmul_atb_bf16  out[M,N] = A[K,M]^T @ B[K,N]
// Each invocation keeps a 4 x 4 block of out, reading elements straight from memory; element e
// of a row-major operand is half (e & 1) of word e / 2, so any M, N, K (odd ones too): rows and
// columns past the edges are clamped on load and skipped on store. The override constants A_F32,
// B_F32 and OUT_BF16 mean what they mean in matmul_bf16_sg.wgsl: a float32 operand (its words
// bitcast), or out written as bf16 (N even; no accumulate).

struct Params { M: u32, N: u32, K: u32, has_bias: u32, accumulate: u32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> A: array<u32>;
@group(0) @binding(2) var<storage, read> B: array<u32>;
@group(0) @binding(3) var<storage, read> bias: array<f32>;
@group(0) @binding(4) var<storage, read_write> out: array<u32>;   // float32 bits, or bf16 (OUT_BF16)

override A_F32: bool = false;
override B_F32: bool = false;
override OUT_BF16: bool = false;

fn elem(w: u32, e: u32) -> f32 { return bitcast<f32>(select(w << 16u, w & 0xffff0000u, (e & 1u) == 1u)); }

fn a_at(i: u32, k: u32, trans: bool) -> f32 {
  var e = i * p.K + k;
  if (trans) { e = k * p.M + i; }
  if (A_F32) { return bitcast<f32>(A[e]); }
  return elem(A[e / 2u], e);
}

fn b_at(k: u32, j: u32, trans: bool) -> f32 {
  var e = k * p.N + j;
  if (trans) { e = j * p.K + k; }
  if (B_F32) { return bitcast<f32>(B[e]); }
  return elem(B[e / 2u], e);
}

fn block(gid: vec3<u32>, ta: bool, tb: bool) {
  let row0 = gid.y * 4u;
  let col0 = gid.x * 4u;
  if (row0 >= p.M || col0 >= p.N) { return; }
  var rows: array<u32, 4>;
  var cols: array<u32, 4>;
  for (var r = 0u; r < 4u; r++) { rows[r] = min(row0 + r, p.M - 1u); }
  for (var c = 0u; c < 4u; c++) { cols[c] = min(col0 + c, p.N - 1u); }
  var acc: array<array<f32, 4>, 4>;
  for (var k = 0u; k < p.K; k++) {
    var a: array<f32, 4>;
    var b: array<f32, 4>;
    for (var r = 0u; r < 4u; r++) { a[r] = a_at(rows[r], k, ta); }
    for (var c = 0u; c < 4u; c++) { b[c] = b_at(k, cols[c], tb); }
    for (var r = 0u; r < 4u; r++) {
      for (var c = 0u; c < 4u; c++) { acc[r][c] = fma(a[r], b[c], acc[r][c]); }
    }
  }
  for (var r = 0u; r < 4u; r++) {
    let i = row0 + r;
    if (i >= p.M) { break; }
    var v: array<f32, 4>;
    for (var c = 0u; c < 4u; c++) {
      v[c] = acc[r][c];
      if (p.has_bias != 0u) { v[c] += bias[min(col0 + c, p.N - 1u)]; }
    }
    if (OUT_BF16) {          // columns col0.. in pairs: N even, so a pair is whole or past N
      for (var c = 0u; c < 4u; c += 2u) {
        let j = col0 + c;
        if (j >= p.N) { break; }
        out[(i * p.N + j) / 2u] = bf16_pack(v[c], v[c + 1u]);
      }
      continue;
    }
    for (var c = 0u; c < 4u; c++) {
      let j = col0 + c;
      if (j >= p.N) { break; }
      var w = v[c];
      if (p.accumulate != 0u) { w += bitcast<f32>(out[i * p.N + j]); }
      out[i * p.N + j] = bitcast<u32>(w);
    }
  }
}

@compute @workgroup_size(8, 8)
fn matmul_bf16(@builtin(global_invocation_id) gid: vec3<u32>) { block(gid, false, false); }

@compute @workgroup_size(8, 8)
fn matmul_abt_bf16(@builtin(global_invocation_id) gid: vec3<u32>) { block(gid, false, true); }

@compute @workgroup_size(8, 8)
fn matmul_atb_bf16(@builtin(global_invocation_id) gid: vec3<u32>) { block(gid, true, false); }
