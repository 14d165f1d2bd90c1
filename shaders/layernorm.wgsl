//#if f16
enable f16;
//#endif
//#if sg
enable subgroups;
//#endif
// LayerNorm over the last dim C, eps from Params, forward beside backward, one source for every
// width and stored type; with Params.rms = 1 each entry is RMSNorm's (Llama's, nanochat's): no
// centring and no bias, y = g * x * rstd with rstd = 1 / sqrt(mean(x^2) + eps). Its mean is stored
// as 0, so that dgb (dg = sum_rows dy * x * rstd; no db written) and dx read RMSNorm's statistics
// as LayerNorm's, dx dropping only the mean(dxhat) term that centring puts there. A norm without
// weights (nanochat's) is g = 1.
//   layernorm_forward{{VEC}}  y = g * (x - mean) * rstd + b; caches mean, rstd per row. y is stored
//                           as the fill's stored type says (its section below: f32; bf16 or f16, two
//                           to a u32, for a 16-bit model's norms, whose outputs only feed matmuls;
//                           statistics and arithmetic in float32 either way)
//   layernorm_dx{{VEC}}       dx (+)= rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)), dxhat = dy * g
//   layernorm_dgb           dg = sum_rows dy * xhat, db = sum_rows dy
//   layernorm_dgb_sg        layernorm_dgb by subgroups
// One invocation per row (per channel for dgb): no barriers, deterministic.
//
// The width is the launcher's (kernels.WIDTHS): V = f32 (W empty: any C) or vec4<f32> (W = 4:
// C a multiple of 4, rows read as C/4 vec4; a 16-bit y is written at this width). Why vec4:
// lavapipe pays per lane for each load instruction whatever its width, so a row read as C/4
// vec4 costs a quarter of C floats. hsum: the sum of a V's lanes.
//
// Why dgb differs by width: one invocation per channel reads one float per row (the scalar
// width's); its vector form is layernorm_dgb_sg (the sg section, for adapters with subgroups, C a
// multiple of 4): one 8-lane subgroup per 4 channels, lane l summing rows l, l+8, ... as vec4 and
// subgroupAdd joining them (a fixed order: the same inputs give the same bits); a quarter of the
// loads spread over 8x the lanes (one lane per channel left C = 96 to 96 lanes).

struct Params { rows: u32, C: u32, eps: f32, accumulate: u32, rms: u32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> a: array<V>;       // x (forward) or dy (backward)   [rows, C]
@group(0) @binding(2) var<storage, read> b: array<V>;       // g, b packed [2, C] (forward); x (backward)
@group(0) @binding(3) var<storage, read> c: array<V>;       // unused (forward); g [C] (dx)
@group(0) @binding(3) var<storage, read> cs: array<f32>;    // mean|rstd [2, rows] (dgb, dgb_sg)
@group(0) @binding(4) var<storage, read_write> o1: array<V>; // y [rows, C]; dx [rows, C]; dg|db [2, C]
@group(0) @binding(5) var<storage, read_write> o2: array<f32>; // mean|rstd [2, rows] (forward); for dx: mean|rstd input

// (mean, rstd) of the n values of V from a[base]; RMSNorm's mean is 0
fn row_stats(base: u32, n: u32) -> vec2<f32> {
  var mean = 0.0;
  if (p.rms == 0u) {
    var s = V(0.0);
    for (var i = 0u; i < n; i++) { s += a[base + i]; }
    mean = hsum(s) / f32(p.C);
  }
  var v = V(0.0);
  for (var i = 0u; i < n; i++) { let d = a[base + i] - mean; v += d * d; }
  return vec2<f32>(mean, inverseSqrt(hsum(v) / f32(p.C) + p.eps));
}

// the bias of channel group j (b holds g | b as [2, n]); RMSNorm has none
fn shift(j: u32) -> V {
  if (p.rms != 0u) { return V(0.0); }
  return b[j];
}

@compute @workgroup_size(64)
fn layernorm_forward{{VEC}}(@builtin(global_invocation_id) gid: vec3<u32>) {
  let r = gid.x;
  if (r >= p.rows) { return; }
  let n = p.C / W;
  let base = r * n;
  let ms = row_stats(base, n);
  for (var i = 0u; i < n; i++) {
    store_y(base + i, (a[base + i] - ms.x) * ms.y * b[i] + shift(n + i));
  }
  o2[r] = ms.x;
  o2[p.rows + r] = ms.y;
}

@compute @workgroup_size(64)
fn layernorm_dx{{VEC}}(@builtin(global_invocation_id) gid: vec3<u32>) {
  let r = gid.x;
  if (r >= p.rows) { return; }
  let n = p.C / W;
  let base = r * n;
  let mean = o2[r];
  let rstd = o2[p.rows + r];
  var m1 = V(0.0);  // mean(dxhat), by lane
  var m2 = V(0.0);  // mean(dxhat * xhat)
  for (var i = 0u; i < n; i++) {
    let dxh = a[base + i] * c[i];
    m1 += dxh;
    m2 += dxh * (b[base + i] - mean) * rstd;
  }
  let n1 = select(hsum(m1) / f32(p.C), 0.0, p.rms != 0u);      // RMSNorm: no centring, no mean term
  let n2 = hsum(m2) / f32(p.C);
  for (var i = 0u; i < n; i++) {
    let xh = (b[base + i] - mean) * rstd;
    var d = rstd * (a[base + i] * c[i] - n1 - xh * n2);
    if (p.accumulate != 0u) { d += o1[base + i]; }
    o1[base + i] = d;
  }
}

//#if !vec4
@compute @workgroup_size(64)
fn layernorm_dgb(@builtin(global_invocation_id) gid: vec3<u32>) {
  let ch = gid.x;
  if (ch >= p.C) { return; }
  var dg = 0.0;
  var db = 0.0;
  for (var r = 0u; r < p.rows; r++) {
    let dy = a[r * p.C + ch];
    dg += dy * (b[r * p.C + ch] - cs[r]) * cs[p.rows + r];
    db += dy;
  }
  o1[ch] = dg;
  if (p.rms == 0u) { o1[p.C + ch] = db; }         // RMSNorm's gradient is g's alone: [C]
}
//#endif
//#if f32

// y as float32: V at a time
fn store_y(j: u32, v: V) { o1[j] = v; }
//#endif
//#if bf16

// y as bf16 (common.wgsl's bf16_pack): a vec4 as two words
@group(0) @binding(4) var<storage, read_write> yb: array<vec2<u32>>;   // [rows, C/4]
fn store_y(j: u32, v: V) { yb[j] = vec2<u32>(bf16_pack(v.x, v.y), bf16_pack(v.z, v.w)); }
//#endif
//#if f16

// y as f16 (WGSL's)
@group(0) @binding(4) var<storage, read_write> yh: array<vec4<f16>>;   // [rows, C/4]
fn store_y(j: u32, v: V) { yh[j] = to_f16x4(v); }
//#endif
//#if sg

const LANES: u32 = 8u;

@compute @workgroup_size(LANES)
fn layernorm_dgb_sg(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                    @builtin(subgroup_invocation_id) lane: u32) {
  let c4 = group_index(wid, nwg);
  let n4 = p.C / 4u;
  if (c4 >= n4) { return; }
  var dg = vec4<f32>();
  var db = vec4<f32>();
  for (var r = lane; r < p.rows; r += LANES) {
    let dy = a[r * n4 + c4];
    dg += dy * (b[r * n4 + c4] - cs[r]) * cs[p.rows + r];
    db += dy;
  }
  let tg = subgroupAdd(dg);
  let tb = subgroupAdd(db);
  if (lane == 0u) {
    o1[c4] = tg;
    if (p.rms == 0u) { o1[n4 + c4] = tb; }
  }
}
//#endif
