// Muon (Jordan et al., 2024) on one weight matrix, around the plan's matmuls:
//   muon_momentum   m = beta m + (1 - beta) g;  u = (1 - beta) g + beta m (Nesterov) or m
//   muon_normalize  x /= max(|x|_F, eps): one workgroup a matrix, the sum in a fixed order
//   ns_mix          out = a x + b y: the two linear steps of a quintic Newton-Schulz iteration
//   muon_update     w -= lr (ratio x + wd w): the orthogonalised update, scaled by the shape
// g is multiplied by the gate's factor, and a step the gate skips (grad_norm.wgsl) changes
// neither m nor w, as in optim.wgsl. The iterations themselves are matmuls of the plan's family
// (model.optim): A = X X^T, B = b A + c A A, X = a X + B X.
struct Params { n: u32, a: f32, b: f32, flag: u32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;           // g (momentum) | x (mix, update)
@group(0) @binding(2) var<storage, read> y: array<f32>;           // the gate (momentum, update) | y (mix)
@group(0) @binding(3) var<storage, read_write> out: array<f32>;   // m (momentum) | out (mix) | w (update) | x (normalize)
@group(0) @binding(4) var<storage, read_write> u: array<f32>;     // the momentum's update direction

const FACTOR = 1u;  const SKIP = 3u;    // the gate's slots: kernels.GATE

// p.a: beta; p.flag: Nesterov
@compute @workgroup_size(256)
fn muon_momentum(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                 @builtin(local_invocation_id) lidv: vec3<u32>) {
  let i = group_index(wid, nwg) * 256u + lidv.x;
  if (i >= p.n || y[SKIP] != 0.0) { return; }
  let grad = x[i] * y[FACTOR];
  let mi = p.a * out[i] + (1.0 - p.a) * grad;
  out[i] = mi;
  u[i] = select(mi, (1.0 - p.a) * grad + p.a * mi, p.flag != 0u);
}

// p.a: eps; p.n: one matrix's values. Workgroup z of 256 normalises the z-th of a batch of
// matrices p.flag floats apart in out (Muon batches the matrices of one shape).
@compute @workgroup_size(256)
fn muon_normalize(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lidv: vec3<u32>) {
  let lid = lidv.x;
  let o = wid.z * p.flag;
  var s = 0.0;
  for (var i = lid; i < p.n; i += 256u) { s += out[o + i] * out[o + i]; }
  let inv = 1.0 / max(sqrt(wg_sum256(lid, s)), p.a);
  for (var i = lid; i < p.n; i += 256u) { out[o + i] = out[o + i] * inv; }
}

// p.n: one matrix's values; grid row z: the z-th matrix of a batch, p.flag floats apart (the
// padding between them is left alone)
@compute @workgroup_size(256)
fn ns_mix(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
          @builtin(local_invocation_id) lidv: vec3<u32>) {
  let i = group_index(wid, nwg) * 256u + lidv.x;
  if (i >= p.n) { return; }
  let j = wid.z * p.flag + i;
  out[j] = p.a * x[j] + p.b * y[j];
}

// p.a: lr, p.b: wd (the step's uniform, one for every matrix); RATIO: the shape's scale
override RATIO: f32 = 1.0;
@compute @workgroup_size(256)
fn muon_update(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_id) lidv: vec3<u32>) {
  let i = group_index(wid, nwg) * 256u + lidv.x;
  if (i >= arrayLength(&out) || y[SKIP] != 0.0) { return; }
  out[i] = out[i] - p.a * (RATIO * x[i] + p.b * out[i]);
}
