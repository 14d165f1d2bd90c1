// layernorm.wgsl's forward and dx read and written as vec4, for C a multiple of 4
// (device/kernels.py takes layernorm.wgsl otherwise; layernorm_dgb stays there).
// Why: lavapipe pays per lane for each load instruction whatever its width, so
// a row read as C/4 vec4 costs a quarter of C floats.
// One invocation per row: no barriers, deterministic.

struct Params { rows: u32, C: u32, eps: f32, accumulate: u32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> a: array<vec4<f32>>;   // x (forward) or dy (dx)      [rows, C]
@group(0) @binding(2) var<storage, read> b: array<vec4<f32>>;   // g, b packed [2, C] (forward); x (dx)
@group(0) @binding(3) var<storage, read> c: array<vec4<f32>>;   // unused (forward); g [C] (dx)
@group(0) @binding(4) var<storage, read_write> o1: array<vec4<f32>>; // y (forward); dx (dx)
@group(0) @binding(5) var<storage, read_write> o2: array<f32>;  // mean|rstd [2, rows]: written (forward), read (dx)

fn hsum(v: vec4<f32>) -> f32 { return (v.x + v.y) + (v.z + v.w); }

@compute @workgroup_size(64)
fn layernorm_forward4(@builtin(global_invocation_id) gid: vec3<u32>) {
  let r = gid.x;
  if (r >= p.rows) { return; }
  let c4 = p.C / 4u;
  let base = r * c4;
  var s = vec4<f32>();
  for (var i = 0u; i < c4; i++) { s += a[base + i]; }
  let mean = hsum(s) / f32(p.C);
  var v = vec4<f32>();
  for (var i = 0u; i < c4; i++) { let d = a[base + i] - mean; v += d * d; }
  let rstd = inverseSqrt(hsum(v) / f32(p.C) + p.eps);
  for (var i = 0u; i < c4; i++) {
    o1[base + i] = (a[base + i] - mean) * rstd * b[i] + b[c4 + i];
  }
  o2[r] = mean;
  o2[p.rows + r] = rstd;
}

@compute @workgroup_size(64)
fn layernorm_dx4(@builtin(global_invocation_id) gid: vec3<u32>) {
  let r = gid.x;
  if (r >= p.rows) { return; }
  let c4 = p.C / 4u;
  let base = r * c4;
  let mean = o2[r];
  let rstd = o2[p.rows + r];
  var m1 = vec4<f32>();  // mean(dxhat), by lane of the vec4
  var m2 = vec4<f32>();  // mean(dxhat * xhat)
  for (var i = 0u; i < c4; i++) {
    let dxh = a[base + i] * c[i];
    m1 += dxh;
    m2 += dxh * (b[base + i] - mean) * rstd;
  }
  let n1 = hsum(m1) / f32(p.C);
  let n2 = hsum(m2) / f32(p.C);
  for (var i = 0u; i < c4; i++) {
    let xh = (b[base + i] - mean) * rstd;
    var d = rstd * (a[base + i] * c[i] - n1 - xh * n2);
    if (p.accumulate != 0u) { d += o1[base + i]; }
    o1[base + i] = d;
  }
}
