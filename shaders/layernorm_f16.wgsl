enable f16;
// layernorm4.wgsl's forward writing its output as f16, statistics and arithmetic in float32:
// the LayerNorms of an f16 model, whose outputs only feed matmuls.
//   layernorm_forward_f16  y = f16((x - mean) * rstd * g + b), mean|rstd [2, rows]
// C a multiple of 4. One invocation per row.

struct Params { rows: u32, C: u32, eps: f32, accumulate: u32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<vec4<f32>>;         // [rows, C]
@group(0) @binding(2) var<storage, read> gb: array<vec4<f32>>;        // g, b packed [2, C]
@group(0) @binding(3) var<storage, read_write> y: array<vec4<f16>>;   // [rows, C] in f16
@group(0) @binding(4) var<storage, read_write> stats: array<f32>;     // mean | rstd [2, rows]

fn hsum(v: vec4<f32>) -> f32 { return (v.x + v.y) + (v.z + v.w); }

@compute @workgroup_size(64)
fn layernorm_forward_f16(@builtin(global_invocation_id) gid: vec3<u32>) {
  let r = gid.x;
  if (r >= p.rows) { return; }
  let c4 = p.C / 4u;
  let base = r * c4;
  var s = vec4<f32>();
  for (var i = 0u; i < c4; i++) { s += x[base + i]; }
  let mean = hsum(s) / f32(p.C);
  var v = vec4<f32>();
  for (var i = 0u; i < c4; i++) { let d = x[base + i] - mean; v += d * d; }
  let rstd = inverseSqrt(hsum(v) / f32(p.C) + p.eps);
  for (var i = 0u; i < c4; i++) { y[base + i] = to_f16x4((x[base + i] - mean) * rstd * gb[i] + gb[c4 + i]); }
  stats[r] = mean;
  stats[p.rows + r] = rstd;
}
