enable f16;
// The f16 products (products_f16.wgsl's) read as vec4<f16>, for shapes where N and K (M and N for
// matmul_atb, which takes any K) are multiples of 4 (kernels.f16_vec4_ok); the matmul.wgsl template
// takes the rest.
//   matmul_f16_vec4      out[M,N] = A[M,K]   @ B[K,N] (+ bias[N])
//   matmul_abt_f16_vec4  out[M,N] = A[M,K]   @ B[N,K]^T
//   matmul_atb_f16_vec4  out[M,N] = A[K,M]^T @ B[K,N]
// Each invocation owns a 4 x 4 block of out: 4 rows, one vec4 of columns. Per 4 steps of K it
// loads 4 vec4 of A and 4 of B and takes 16 vec4<f16> products, each one f16 multiply of 4 lanes
// (the packed rate GPUs double), then widens them to float32 and adds: the sums are float32,
// never f16. Operands and out: f16, or float32 (A32, B32: rounded to f16
// as read; A_F32, B_F32), out float32 (out32) or f16 (out16, OUT_F16). 8 x 8 invocations a
// workgroup: 32 x 32 of out; rows past M are clamped on load and skipped on store.

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

fn a4(i: u32) -> vec4<f16> {          // vec4 i of A, row-major
  if (A_F32) { return to_f16x4(A32[i]); }
  return A16[i];
}

fn b4(i: u32) -> vec4<f16> {
  if (B_F32) { return to_f16x4(B32[i]); }
  return B16[i];
}

fn row(r: u32) -> u32 { return min(r, p.M - 1u); }

fn store(acc: array<vec4<f32>, 4>, row0: u32, c4: u32) {
  let n4 = p.N / 4u;
  var b = vec4<f32>();
  if (p.has_bias != 0u) { b = bias[c4]; }
  for (var r = 0u; r < 4u; r++) {
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

// A @ B (tb false) or A @ B^T (tb true): B's 4 x 4 block at (k, column c4) is read differently
fn a_times_b(gid: vec3<u32>, tb: bool) {
  let n4 = p.N / 4u;
  let k4 = p.K / 4u;
  let c4 = gid.x;
  let row0 = gid.y * 4u;
  if (c4 >= n4 || row0 >= p.M) { return; }
  var acc: array<vec4<f32>, 4>;
  for (var kk = 0u; kk < k4; kk++) {
    var bk: array<vec4<f16>, 4>;       // bk[t]: B's row k + t at the 4 columns
    if (tb) {                          // B^T: columns 4c4.. are B's rows, each a vec4 along k
      let j = 4u * c4;
      let q0 = b4(j * k4 + kk);
      let q1 = b4((j + 1u) * k4 + kk);
      let q2 = b4((j + 2u) * k4 + kk);
      let q3 = b4((j + 3u) * k4 + kk);
      bk[0] = vec4<f16>(q0.x, q1.x, q2.x, q3.x);
      bk[1] = vec4<f16>(q0.y, q1.y, q2.y, q3.y);
      bk[2] = vec4<f16>(q0.z, q1.z, q2.z, q3.z);
      bk[3] = vec4<f16>(q0.w, q1.w, q2.w, q3.w);
    } else {
      for (var t = 0u; t < 4u; t++) { bk[t] = b4((4u * kk + t) * n4 + c4); }
    }
    for (var r = 0u; r < 4u; r++) {
      let a = a4(row(row0 + r) * k4 + kk);
      acc[r] += vec4<f32>(a.x * bk[0]) + vec4<f32>(a.y * bk[1]) + vec4<f32>(a.z * bk[2]) + vec4<f32>(a.w * bk[3]);
    }
  }
  store(acc, row0, c4);
}

@compute @workgroup_size(64)
fn matmul_f16_vec4(@builtin(global_invocation_id) gid: vec3<u32>) { a_times_b(gid, false); }

@compute @workgroup_size(64)
fn matmul_abt_f16_vec4(@builtin(global_invocation_id) gid: vec3<u32>) { a_times_b(gid, true); }

// A^T @ B: per k, one vec4 of A's row k (out rows row0..) and one of B's (the 4 columns): an
// outer product of f16 lanes
@compute @workgroup_size(64)
fn matmul_atb_f16_vec4(@builtin(global_invocation_id) gid: vec3<u32>) {
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
