// The gradient's global norm, the clip factor and the loss scaler: what wraps every optimizer.
//   grad_sumsq  partial[w] = sum of g^2 over the w-th chunk of CHUNK elements
//   grad_clip   the gate: stats = [norm, factor, scale, skip, clean, skipped, taken], where
//               factor = clip / (norm + 1e-6) if norm > clip else 1, skip = 0 and taken + 1
// The optimizers (optim.wgsl, muon.wgsl) read the gate and nothing else of this family: they
// multiply the gradient by `factor`, change nothing where `skip` is set, and count their bias
// corrections from `taken`, so that one optimizer's kernels hold no branch for clipping or the
// scaler. The slots: kernels.GATE. All sums run in a fixed order: the same inputs give the same bits.
//
// SCALED (an override constant): the loss scaler of a precision that needs one (core.precision),
// with PyTorch GradScaler's rules. The gradients arrive multiplied by the scale, which lives in
// the gate with its counters, so that no step reads anything back:
//   grad_sumsq  unscales as it squares (1 / scale, a power of two: exact); a chunk holding an
//               inf or NaN writes -1 (a sum of squares is never negative)
//   grad_clip   a -1 among the partials: skip this step, halve the scale, zero the clean count,
//               count the skip; else factor = clip factor / scale, and after `growth` clean
//               steps in a row the scale doubles
// An inf or NaN is found by its exponent bits: WGSL lets a compiler assume floats are finite,
// so a comparison might be folded away where a bit test cannot.

// first: where this chunk's partial sums start in the partials bound whole (a chunk need not
// start where the device's offset alignment allows a view of them)
struct Params { n: u32, clip: f32, first: u32, growth: u32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> g: array<V>;             // grads [n] (grad_sumsq)
@group(0) @binding(2) var<storage, read> aux: array<f32>;         // the gate (sumsq, SCALED) | partials (clip)
@group(0) @binding(3) var<storage, read_write> out: array<f32>;   // partials (sumsq) | the gate (clip)

const CHUNK: u32 = 4096u;
// the workgroup sums: wg_sum256, wg_sum64 (common.wgsl)

override SCALED: bool = false;
const NORM = 0u;  const FACTOR = 1u;  const SCALE = 2u;  const SKIP = 3u;  const CLEAN = 4u;  const SKIPPED = 5u;
const TAKEN = 6u;   // the slots of the gate: kernels.GATE

// grad_sumsq at the launcher's width (kernels.WIDTHS): V = f32, 256 lanes; or vec4<f32>, 64 lanes
// (the flat buffers hold whole 256-float blocks, so n is always a multiple of 4), each chunk then
// summed in another fixed order. Why vec4: lavapipe pays per lane for every load instruction
// whatever its width.
//#if vec4
const WG = 64u;
fn wg_sum(lid: u32, s: f32) -> f32 { return wg_sum64(lid, s); }
fn wg_max(lid: u32, s: f32) -> f32 { return wg_max64(lid, s); }
fn finite(x: V) -> bool { return all((bitcast<vec4<u32>>(x) & vec4<u32>(0x7f800000u)) != vec4<u32>(0x7f800000u)); }
//#else
const WG = 256u;
fn wg_sum(lid: u32, s: f32) -> f32 { return wg_sum256(lid, s); }
fn wg_max(lid: u32, s: f32) -> f32 { return wg_max256(lid, s); }
fn finite(x: V) -> bool { return (bitcast<u32>(x) & 0x7f800000u) != 0x7f800000u; }
//#endif

// a -1 from any lane's chunk part: the chunk holds an inf or NaN
fn mark(lid: u32, sum: f32, bad: f32) -> f32 {
  if (!SCALED) { return sum; }
  return select(sum, -1.0, wg_max(lid, bad) > 0.0);
}

// the skip, the new scale and the counters; factor: the clip factor of the unscaled gradients
fn update_scaler(found_inf: bool, norm: f32, factor: f32) {
  let scale = out[SCALE];
  if (found_inf) {            // NORM keeps the last step taken's (the host's divergence check reads it)
    out[FACTOR] = 0.0;
    out[SCALE] = scale * 0.5;
    out[SKIP] = 1.0;
    out[CLEAN] = 0.0;
    out[SKIPPED] += 1.0;
    return;
  }
  let clean = out[CLEAN] + 1.0;
  let grow = clean >= f32(p.growth);
  out[NORM] = norm;
  out[FACTOR] = factor / scale;
  out[SCALE] = select(scale, scale * 2.0, grow);
  out[SKIP] = 0.0;
  out[CLEAN] = select(clean, 0.0, grow);
  out[TAKEN] += 1.0;
}

@compute @workgroup_size(WG)
fn grad_sumsq{{VEC}}(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
              @builtin(local_invocation_id) lidv: vec3<u32>) {
  let wg = group_index(wid, nwg);
  let lid = lidv.x;
  let start = wg * (CHUNK / W);
  let end = min(start + CHUNK / W, p.n / W);
  var inv = 1.0;
  if (SCALED) { inv = 1.0 / aux[SCALE]; }
  var s = V(0.0);
  var bad = 0.0;
  for (var i = start + lid; i < end; i += WG) {
    let x = g[i] * inv;
    s += x * x;
    if (SCALED && !finite(g[i])) { bad = 1.0; }
  }
  let t = mark(lid, wg_sum(lid, hsum(s)), bad);
  if (lid == 0u) { out[p.first + wg] = t; }
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
      out[NORM] = norm;
      out[FACTOR] = factor;
      out[SKIP] = 0.0;
      out[TAKEN] += 1.0;
    }
  }
}
