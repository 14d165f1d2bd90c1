// Global gradient-norm clipping and AdamW over the flat parameter buffer.
//   grad_sumsq  partial[w] = sum of g^2 over the w-th chunk of CHUNK elements
//   grad_clip   stats = [norm, scale], scale = clip / (norm + 1e-6) if norm > clip else 1
//   adamw       m, v, p updated; decoupled decay wd_table[block] per 256-element
//               block (tensors start on 256-float boundaries, so a block never
//               straddles two tensors and padding stays zero)
// All sums run in a fixed order: the same inputs give the same bits.
//
// SCALED (an override constant): the loss scaler of a precision that needs one (core.precision),
// with PyTorch GradScaler's rules. The gradients arrive multiplied by the scale, which lives in
// stats (kernels.SCALER names the slots) with its counters, so that no step reads anything back:
//   grad_sumsq  unscales as it squares (1 / scale, a power of two: exact); a chunk holding an
//               inf or NaN writes -1 (a sum of squares is never negative)
//   grad_clip   a -1 among the partials: skip this step, halve the scale, zero the clean count,
//               count the skip; else factor = clip factor / scale, and after `growth` clean
//               steps in a row the scale doubles
//   adamw       a skipped step changes nothing; the bias corrections count the steps taken
// An inf or NaN is found by its exponent bits: WGSL lets a compiler assume floats are finite,
// so a comparison might be folded away where a bit test cannot.

// first: where this chunk's entries start in the table bound whole: its first partial sum
// (grad_sumsq) or its first decay block (adamw). The tables are bound whole, not as views at
// the chunk's offset, so that a chunk need not start where the device's offset alignment allows
// a view of them (with 256-byte alignment that would be every 1 MiB of parameters).
struct Params { n: u32, clip: f32, lr: f32, beta1: f32, beta2: f32, eps: f32, bc1: f32, bc2: f32, first: u32,
                growth: u32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> g: array<f32>;           // grads [n]
@group(0) @binding(2) var<storage, read> aux: array<f32>;         // scaler (sumsq) | partials (clip) | wd_table (adamw)
@group(0) @binding(3) var<storage, read_write> stats: array<f32>; // partials (sumsq) | [norm, factor, scaler...]
@group(0) @binding(4) var<storage, read_write> w: array<f32>;     // params (adamw)
@group(0) @binding(5) var<storage, read_write> m: array<f32>;
@group(0) @binding(6) var<storage, read_write> v: array<f32>;

const CHUNK: u32 = 4096u;
// the workgroup sums: wg_sum256 (common.wgsl)

override SCALED: bool = false;
const NORM = 0u;  const FACTOR = 1u;  const SCALE = 2u;  const SKIP = 3u;  const CLEAN = 4u;  const SKIPPED = 5u;
const TAKEN = 6u;   // the slots of stats: kernels.SCALER

fn finite(x: f32) -> bool { return (bitcast<u32>(x) & 0x7f800000u) != 0x7f800000u; }

// a -1 from any lane's chunk part: the chunk holds an inf or NaN
fn mark(lid: u32, sum: f32, bad: f32) -> f32 {
  if (!SCALED) { return sum; }
  return select(sum, -1.0, wg_max256(lid, bad) > 0.0);
}

// the skip, the new scale and the counters; factor: the clip factor of the unscaled gradients
fn update_scaler(found_inf: bool, norm: f32, factor: f32) {
  let scale = stats[SCALE];
  if (found_inf) {            // NORM keeps the last step taken's (the host's divergence check reads it)
    stats[FACTOR] = 0.0;
    stats[SCALE] = scale * 0.5;
    stats[SKIP] = 1.0;
    stats[CLEAN] = 0.0;
    stats[SKIPPED] += 1.0;
    return;
  }
  let clean = stats[CLEAN] + 1.0;
  let grow = clean >= f32(p.growth);
  stats[NORM] = norm;
  stats[FACTOR] = factor / scale;
  stats[SCALE] = select(scale, scale * 2.0, grow);
  stats[SKIP] = 0.0;
  stats[CLEAN] = select(clean, 0.0, grow);
  stats[TAKEN] += 1.0;
}

@compute @workgroup_size(256)
fn grad_sumsq(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
              @builtin(local_invocation_id) lidv: vec3<u32>) {
  let wg = group_index(wid, nwg);
  let lid = lidv.x;
  let start = wg * CHUNK;
  var inv = 1.0;
  if (SCALED) { inv = 1.0 / aux[SCALE]; }
  var s = 0.0;
  var bad = 0.0;
  for (var i = start + lid; i < min(start + CHUNK, p.n); i += 256u) {
    let x = g[i] * inv;
    s += x * x;
    if (SCALED && !finite(g[i])) { bad = 1.0; }
  }
  let t = mark(lid, wg_sum256(lid, s), bad);
  if (lid == 0u) { stats[p.first + wg] = t; }
}

// n = number of partials
@compute @workgroup_size(256)
fn grad_clip(@builtin(local_invocation_id) lidv: vec3<u32>) {
  let lid = lidv.x;
  var s = 0.0;
  var bad = 0.0;
  for (var i = lid; i < p.n; i += 256u) {
    let a = aux[i];
    if (SCALED && a < 0.0) { bad = 1.0; } else { s += a; }
  }
  let t = wg_sum256(lid, s);
  var found = false;
  if (SCALED) { found = wg_max256(lid, bad) > 0.0; }
  if (lid == 0u) {
    let norm = sqrt(t);
    let factor = select(1.0, p.clip / (norm + 1e-6), norm > p.clip);
    if (SCALED) {
      update_scaler(found, norm, factor);
    } else {
      stats[NORM] = norm;
      stats[FACTOR] = factor;
    }
  }
}

// 1 - beta^t: the host's (float64, then float32) unscaled; scaled, t is the steps the device
// took, which the host does not know without reading back
fn bias_corrections() -> vec2<f32> {
  if (!SCALED) { return vec2<f32>(p.bc1, p.bc2); }
  let t = stats[TAKEN];
  return vec2<f32>(1.0 - pow(p.beta1, t), 1.0 - pow(p.beta2, t));
}

@compute @workgroup_size(256)
fn adamw(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
         @builtin(local_invocation_id) lidv: vec3<u32>) {
  let blk = group_index(wid, nwg);
  let i = blk * 256u + lidv.x;
  if (i >= p.n || (SCALED && stats[SKIP] != 0.0)) { return; }
  let bc = bias_corrections();
  let grad = g[i] * stats[FACTOR];
  let mi = p.beta1 * m[i] + (1.0 - p.beta1) * grad;
  let vi = p.beta2 * v[i] + (1.0 - p.beta2) * grad * grad;
  m[i] = mi;
  v[i] = vi;
  let mhat = mi / bc.x;
  let vhat = vi / bc.y;
  w[i] = w[i] - p.lr * (mhat / (sqrt(vhat) + p.eps) + aux[p.first + blk] * w[i]);
}
