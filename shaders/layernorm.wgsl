// LayerNorm over the last dim C, eps from Params, forward beside backward.
//   layernorm_forward  y = g * (x - mean) * rstd + b; caches mean, rstd per row
//   layernorm_dx       dx (+)= rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)), dxhat = dy * g
//   layernorm_dgb      dg = sum_rows dy * xhat, db = sum_rows dy
// One invocation per row (per channel for dgb): no barriers, deterministic.

struct Params { rows: u32, C: u32, eps: f32, accumulate: u32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> a: array<f32>;       // x (forward) or dy (backward)   [rows, C]
@group(0) @binding(2) var<storage, read> b: array<f32>;       // g, b packed [2, C] (forward); x (backward)
@group(0) @binding(3) var<storage, read> c: array<f32>;       // unused (forward); g [C] (dx); mean|rstd (dgb)
@group(0) @binding(4) var<storage, read_write> o1: array<f32>; // y [rows, C]; dx [rows, C]; dg|db [2, C]
@group(0) @binding(5) var<storage, read_write> o2: array<f32>; // mean|rstd [2, rows] (forward); for dx: mean|rstd input

@compute @workgroup_size(64)
fn layernorm_forward(@builtin(global_invocation_id) gid: vec3<u32>) {
  let r = gid.x;
  if (r >= p.rows) { return; }
  let base = r * p.C;
  var mean = 0.0;
  for (var i = 0u; i < p.C; i++) { mean += a[base + i]; }
  mean /= f32(p.C);
  var v = 0.0;
  for (var i = 0u; i < p.C; i++) { let d = a[base + i] - mean; v += d * d; }
  let rstd = inverseSqrt(v / f32(p.C) + p.eps);
  for (var i = 0u; i < p.C; i++) {
    o1[base + i] = (a[base + i] - mean) * rstd * b[i] + b[p.C + i];
  }
  o2[r] = mean;
  o2[p.rows + r] = rstd;
}

@compute @workgroup_size(64)
fn layernorm_dx(@builtin(global_invocation_id) gid: vec3<u32>) {
  let r = gid.x;
  if (r >= p.rows) { return; }
  let base = r * p.C;
  let mean = o2[r];
  let rstd = o2[p.rows + r];
  var m1 = 0.0;  // mean(dxhat)
  var m2 = 0.0;  // mean(dxhat * xhat)
  for (var i = 0u; i < p.C; i++) {
    let dxh = a[base + i] * c[i];
    m1 += dxh;
    m2 += dxh * (b[base + i] - mean) * rstd;
  }
  m1 /= f32(p.C);
  m2 /= f32(p.C);
  for (var i = 0u; i < p.C; i++) {
    let xh = (b[base + i] - mean) * rstd;
    var d = rstd * (a[base + i] * c[i] - m1 - xh * m2);
    if (p.accumulate != 0u) { d += o1[base + i]; }
    o1[base + i] = d;
  }
}

@compute @workgroup_size(64)
fn layernorm_dgb(@builtin(global_invocation_id) gid: vec3<u32>) {
  let ch = gid.x;
  if (ch >= p.C) { return; }
  var dg = 0.0;
  var db = 0.0;
  for (var r = 0u; r < p.rows; r++) {
    let dy = a[r * p.C + ch];
    dg += dy * (b[r * p.C + ch] - c[r]) * c[p.rows + r];
    db += dy;
  }
  o1[ch] = dg;
  o1[p.C + ch] = db;
}
