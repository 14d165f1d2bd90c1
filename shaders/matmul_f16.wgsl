enable f16;
// The f16 matmuls for any shape (matmul_f16_vec4.wgsl is the fast set): operands in WGSL's f16,
// each product taken in f16 and the products summed in float32.
//   matmul_f16      out[M,N] = A[M,K]   @ B[K,N] (+ bias[N])
//   matmul_abt_f16  out[M,N] = A[M,K]   @ B[N,K]^T
//   matmul_atb_f16  out[M,N] = A[K,M]^T @ B[K,N]
// An operand is f16 (A16, B16) or float32 (A32, B32: the backward's gradients, rounded to f16 as
// they are read, as PyTorch's autocast casts them; past f16's range they become inf, which the
// loss scaler sees); the override constants A_F32 and B_F32 say which binding holds it, the
// other being a dummy. out is float32 (out32, accumulate allowed) or f16 (out16, OUT_F16).
// Each invocation keeps a 4 x 4 block of out; rows and columns past the edges are clamped on
// load and skipped on store, so any M, N, K.

struct Params { M: u32, N: u32, K: u32, has_bias: u32, accumulate: u32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> A16: array<f16>;
@group(0) @binding(2) var<storage, read> B16: array<f16>;
@group(0) @binding(3) var<storage, read> A32: array<f32>;
@group(0) @binding(4) var<storage, read> B32: array<f32>;
@group(0) @binding(5) var<storage, read> bias: array<f32>;
@group(0) @binding(6) var<storage, read_write> out32: array<f32>;
@group(0) @binding(7) var<storage, read_write> out16: array<f16>;

override A_F32: bool = false;
override B_F32: bool = false;
override OUT_F16: bool = false;

fn a_at(i: u32, k: u32, trans: bool) -> f16 {
  var e = i * p.K + k;
  if (trans) { e = k * p.M + i; }
  if (A_F32) { return to_f16(A32[e]); }
  return A16[e];
}

fn b_at(k: u32, j: u32, trans: bool) -> f16 {
  var e = k * p.N + j;
  if (trans) { e = j * p.K + k; }
  if (B_F32) { return to_f16(B32[e]); }
  return B16[e];
}

fn block(gid: vec3<u32>, ta: bool, tb: bool) {
  let row0 = gid.y * 4u;
  let col0 = gid.x * 4u;
  if (row0 >= p.M || col0 >= p.N) { return; }
  var rows: array<u32, 4>;
  var cols: array<u32, 4>;
  for (var r = 0u; r < 4u; r++) { rows[r] = min(row0 + r, p.M - 1u); }
  for (var c = 0u; c < 4u; c++) { cols[c] = min(col0 + c, p.N - 1u); }
  var acc: array<vec4<f32>, 4>;
  for (var k = 0u; k < p.K; k++) {
    let b = vec4<f16>(b_at(k, cols[0], tb), b_at(k, cols[1], tb), b_at(k, cols[2], tb), b_at(k, cols[3], tb));
    for (var r = 0u; r < 4u; r++) { acc[r] += vec4<f32>(a_at(rows[r], k, ta) * b); }
  }
  for (var r = 0u; r < 4u; r++) {
    let i = row0 + r;
    if (i >= p.M) { break; }
    for (var c = 0u; c < 4u; c++) {
      let j = col0 + c;
      if (j >= p.N) { break; }
      var v = acc[r][c];
      if (p.has_bias != 0u) { v += bias[j]; }
      if (OUT_F16) {
        out16[i * p.N + j] = to_f16(v);
      } else {
        if (p.accumulate != 0u) { v += out32[i * p.N + j]; }
        out32[i * p.N + j] = v;
      }
    }
  }
}

@compute @workgroup_size(8, 8)
fn matmul_f16(@builtin(global_invocation_id) gid: vec3<u32>) { block(gid, false, false); }

@compute @workgroup_size(8, 8)
fn matmul_abt_f16(@builtin(global_invocation_id) gid: vec3<u32>) { block(gid, false, true); }

@compute @workgroup_size(8, 8)
fn matmul_atb_f16(@builtin(global_invocation_id) gid: vec3<u32>) { block(gid, true, false); }
