// optim.wgsl's grad_sumsq and adamw reading and writing vec4 (the flat buffers hold
// whole 256-float blocks, so n is always a multiple of 4). Same bindings, same
// arithmetic per element: adamw4 gives adamw's bits; grad_sumsq4 sums each chunk
// in another fixed order.
// Why: lavapipe pays per lane for every load instruction whatever its width;
// AdamW touches 5 floats and writes 3 per parameter.

// first: as optim.wgsl (the chunk's place in the partial sums or the decay table, bound whole);
// SCALED: optim.wgsl's loss scaler, the same slots and rules
struct Params { n: u32, clip: f32, lr: f32, beta1: f32, beta2: f32, eps: f32, bc1: f32, bc2: f32, first: u32,
                growth: u32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> g: array<vec4<f32>>;     // grads [n]
@group(0) @binding(2) var<storage, read> aux: array<f32>;         // scaler (sumsq4) | wd_table (adamw4)
@group(0) @binding(3) var<storage, read_write> stats: array<f32>; // partials (sumsq4) | [norm, scale]
@group(0) @binding(4) var<storage, read_write> w: array<vec4<f32>>;  // params (adamw4)
@group(0) @binding(5) var<storage, read_write> m: array<vec4<f32>>;
@group(0) @binding(6) var<storage, read_write> v: array<vec4<f32>>;

const CHUNK: u32 = 4096u;  // floats per partial, as optim.wgsl

override SCALED: bool = false;
const FACTOR = 1u;  const SCALE = 2u;  const SKIP = 3u;  const TAKEN = 6u;   // optim.wgsl's slots

fn finite4(x: vec4<f32>) -> bool { return all((bitcast<vec4<u32>>(x) & vec4<u32>(0x7f800000u)) != vec4<u32>(0x7f800000u)); }

fn bias_corrections() -> vec2<f32> {
  if (!SCALED) { return vec2<f32>(p.bc1, p.bc2); }
  let t = stats[TAKEN];
  return vec2<f32>(1.0 - pow(p.beta1, t), 1.0 - pow(p.beta2, t));
}

// 64 lanes; a chunk is 1024 vec4, 16 per lane
@compute @workgroup_size(64)
fn grad_sumsq4(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_id) lidv: vec3<u32>) {
  let wg = group_index(wid, nwg);
  let lid = lidv.x;
  let start = wg * (CHUNK / 4u);
  let end = min(start + CHUNK / 4u, p.n / 4u);
  var inv = 1.0;
  if (SCALED) { inv = 1.0 / aux[SCALE]; }
  var s = vec4<f32>();
  var bad = 0.0;
  for (var i = start + lid; i < end; i += 64u) {
    let x = g[i] * inv;
    s += x * x;
    if (SCALED && !finite4(g[i])) { bad = 1.0; }
  }
  var t = wg_sum64(lid, (s.x + s.y) + (s.z + s.w));     // common.wgsl
  if (SCALED && wg_max64(lid, bad) > 0.0) { t = -1.0; }
  if (lid == 0u) { stats[p.first + wg] = t; }
}

// one workgroup per 256-float block (64 vec4): the block's weight decay is aux[first + blk]
@compute @workgroup_size(64)
fn adamw4(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
          @builtin(local_invocation_id) lidv: vec3<u32>) {
  let blk = group_index(wid, nwg);
  let i = blk * 64u + lidv.x;
  if (i >= p.n / 4u || (SCALED && stats[SKIP] != 0.0)) { return; }
  let bc = bias_corrections();
  let grad = g[i] * stats[FACTOR];
  let mi = p.beta1 * m[i] + (1.0 - p.beta1) * grad;
  let vi = p.beta2 * v[i] + (1.0 - p.beta2) * grad * grad;
  m[i] = mi;
  v[i] = vi;
  let mhat = mi / bc.x;
  let vhat = vi / bc.y;
  let wi = w[i];
  w[i] = wi - p.lr * (mhat / (sqrt(vhat) + p.eps) + aux[p.first + blk] * wi);
}
