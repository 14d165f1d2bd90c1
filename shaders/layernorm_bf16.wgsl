// layernorm4.wgsl's forward writing its output as bf16 (two to a u32, common.wgsl), statistics
// and arithmetic in float32: the LayerNorms of a bf16 model, whose outputs only feed matmuls.
//   layernorm_forward_bf16  y = bf16((x - mean) * rstd * g + b), mean|rstd [2, rows]
// C a multiple of 8 (each row ends on a whole word pair). One invocation per row.

struct Params { rows: u32, C: u32, eps: f32, accumulate: u32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<vec4<f32>>;         // [rows, C]
@group(0) @binding(2) var<storage, read> gb: array<vec4<f32>>;        // g, b packed [2, C]
@group(0) @binding(3) var<storage, read_write> y: array<vec4<u32>>;   // [rows, C/8] words of 8 bf16
@group(0) @binding(4) var<storage, read_write> stats: array<f32>;     // mean | rstd [2, rows]

fn hsum(v: vec4<f32>) -> f32 { return (v.x + v.y) + (v.z + v.w); }

@compute @workgroup_size(64)
fn layernorm_forward_bf16(@builtin(global_invocation_id) gid: vec3<u32>) {
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
  for (var i = 0u; i < c4; i += 2u) {
    let lo = (x[base + i] - mean) * rstd * gb[i] + gb[c4 + i];
    let hi = (x[base + i + 1u] - mean) * rstd * gb[i + 1u] + gb[c4 + i + 1u];
    y[(base + i) / 2u] = vec4<u32>(bf16_pack(lo.x, lo.y), bf16_pack(lo.z, lo.w), bf16_pack(hi.x, hi.y),
                                   bf16_pack(hi.z, hi.w));
  }
  stats[r] = mean;
  stats[p.rows + r] = rstd;
}
