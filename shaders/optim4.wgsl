// optim.wgsl's optimizers reading and writing vec4 (the flat buffers hold whole 256-float
// blocks, so n is always a multiple of 4). Same bindings, same arithmetic per element: adamw4
// gives adamw's bits, lion4 lion's.
// Why: lavapipe pays per lane for every load instruction whatever its width;
// AdamW touches 5 floats and writes 3 per parameter.
struct Params { n: u32, lr: f32, beta1: f32, beta2: f32, eps: f32, first: u32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> g: array<vec4<f32>>;        // grads [n]
@group(0) @binding(2) var<storage, read> wd_table: array<f32>;       // decay per 256-float block (< 0: not ours)
@group(0) @binding(3) var<storage, read> gate: array<f32>;           // grad_clip's
@group(0) @binding(4) var<storage, read_write> w: array<vec4<f32>>;  // params
@group(0) @binding(5) var<storage, read_write> m: array<vec4<f32>>;
@group(0) @binding(6) var<storage, read_write> v: array<vec4<f32>>;

const FACTOR = 1u;  const SKIP = 3u;  const TAKEN = 6u;    // optim.wgsl's slots

// one workgroup per 256-float block (64 vec4)
@compute @workgroup_size(64)
fn adamw4(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
          @builtin(local_invocation_id) lidv: vec3<u32>) {
  let blk = group_index(wid, nwg);
  let i = blk * 64u + lidv.x;
  let wd = wd_table[p.first + blk];
  if (i >= p.n / 4u || wd < 0.0 || gate[SKIP] != 0.0) { return; }
  let t = gate[TAKEN];
  let grad = g[i] * gate[FACTOR];
  let mi = p.beta1 * m[i] + (1.0 - p.beta1) * grad;
  let vi = p.beta2 * v[i] + (1.0 - p.beta2) * grad * grad;
  m[i] = mi;
  v[i] = vi;
  let mhat = mi / (1.0 - pow(p.beta1, t));
  let vhat = vi / (1.0 - pow(p.beta2, t));
  let wi = w[i];
  w[i] = wi - p.lr * (mhat / (sqrt(vhat) + p.eps) + wd * wi);
}

@compute @workgroup_size(64)
fn lion4(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
         @builtin(local_invocation_id) lidv: vec3<u32>) {
  let blk = group_index(wid, nwg);
  let i = blk * 64u + lidv.x;
  let wd = wd_table[p.first + blk];
  if (i >= p.n / 4u || wd < 0.0 || gate[SKIP] != 0.0) { return; }
  let grad = g[i] * gate[FACTOR];
  let mi = m[i];
  let wi = w[i];
  w[i] = wi - p.lr * (sign(p.beta1 * mi + (1.0 - p.beta1) * grad) + wd * wi);
  m[i] = p.beta2 * mi + (1.0 - p.beta2) * grad;
}
