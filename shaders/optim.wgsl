// Global gradient-norm clipping and AdamW over the flat parameter buffer.
//   grad_sumsq  partial[w] = sum of g^2 over the w-th chunk of CHUNK elements
//   grad_clip   stats = [norm, scale], scale = clip / (norm + 1e-6) if norm > clip else 1
//   adamw       m, v, p updated; decoupled decay wd_table[block] per 256-element
//               block (tensors start on 256-float boundaries, so a block never
//               straddles two tensors and padding stays zero)
// All sums run in a fixed order: the same inputs give the same bits.

// first: where this chunk's entries start in the table bound whole: its first partial sum
// (grad_sumsq) or its first decay block (adamw). The tables are bound whole, not as views at
// the chunk's offset, so that a chunk need not start where the device's offset alignment allows
// a view of them (with 256-byte alignment that would be every 1 MiB of parameters).
struct Params { n: u32, clip: f32, lr: f32, beta1: f32, beta2: f32, eps: f32, bc1: f32, bc2: f32, first: u32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> g: array<f32>;           // grads [n]
@group(0) @binding(2) var<storage, read> aux: array<f32>;         // partials (clip) | wd_table (adamw)
@group(0) @binding(3) var<storage, read_write> stats: array<f32>; // partials (sumsq) | [norm, scale]
@group(0) @binding(4) var<storage, read_write> w: array<f32>;     // params (adamw)
@group(0) @binding(5) var<storage, read_write> m: array<f32>;
@group(0) @binding(6) var<storage, read_write> v: array<f32>;

const CHUNK: u32 = 4096u;
// the workgroup sums: wg_sum256 (common.wgsl)

@compute @workgroup_size(256)
fn grad_sumsq(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
              @builtin(local_invocation_id) lidv: vec3<u32>) {
  let wg = group_index(wid, nwg);
  let lid = lidv.x;
  let start = wg * CHUNK;
  var s = 0.0;
  for (var i = start + lid; i < min(start + CHUNK, p.n); i += 256u) { let x = g[i]; s += x * x; }
  let t = wg_sum256(lid, s);
  if (lid == 0u) { stats[p.first + wg] = t; }
}

// n = number of partials
@compute @workgroup_size(256)
fn grad_clip(@builtin(local_invocation_id) lidv: vec3<u32>) {
  let lid = lidv.x;
  var s = 0.0;
  for (var i = lid; i < p.n; i += 256u) { s += aux[i]; }
  let t = wg_sum256(lid, s);
  if (lid == 0u) {
    let norm = sqrt(t);
    stats[0] = norm;
    stats[1] = select(1.0, p.clip / (norm + 1e-6), norm > p.clip);
  }
}

@compute @workgroup_size(256)
fn adamw(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
         @builtin(local_invocation_id) lidv: vec3<u32>) {
  let blk = group_index(wid, nwg);
  let i = blk * 256u + lidv.x;
  if (i >= p.n) { return; }
  let grad = g[i] * stats[1];
  let mi = p.beta1 * m[i] + (1.0 - p.beta1) * grad;
  let vi = p.beta2 * v[i] + (1.0 - p.beta2) * grad * grad;
  m[i] = mi;
  v[i] = vi;
  let mhat = mi / p.bc1;
  let vhat = vi / p.bc2;
  w[i] = w[i] - p.lr * (mhat / (sqrt(vhat) + p.eps) + aux[p.first + blk] * w[i]);
}
