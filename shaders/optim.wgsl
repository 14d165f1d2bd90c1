// The elementwise optimizers over the flat parameter buffer, one invocation a parameter:
//   adamw   m, v, w updated; bias-corrected; decoupled decay
//   lion    the sign of an interpolation of the moment and the gradient (Chen et al., 2023):
//           w -= lr * (sign(beta1 m + (1 - beta1) g) + wd w), then m = beta2 m + (1 - beta2) g
// Each reads the gate that grad_norm.wgsl's grad_clip wrote (kernels.GATE): the gradient is
// multiplied by its factor (the clip, and the loss scale undone), a step it skips changes
// nothing, and AdamW's bias corrections count the steps it took. No optimizer knows whether a
// loss scaler or a clip is there.
//
// The decay table holds one value per 256-float block (tensors start on 256-float boundaries,
// so a block never straddles two tensors and padding stays zero); a negative value marks a
// block another optimizer updates (Muon's matrices), which this one leaves alone. first: this
// chunk's first block in the table, bound whole (a chunk need not start where the device's
// offset alignment allows a view of it).
struct Params { n: u32, lr: f32, beta1: f32, beta2: f32, eps: f32, first: u32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> g: array<f32>;           // grads [n]
@group(0) @binding(2) var<storage, read> wd_table: array<f32>;    // decay per 256-float block
@group(0) @binding(3) var<storage, read> gate: array<f32>;        // grad_clip's
@group(0) @binding(4) var<storage, read_write> w: array<f32>;     // params
@group(0) @binding(5) var<storage, read_write> m: array<f32>;
@group(0) @binding(6) var<storage, read_write> v: array<f32>;     // AdamW's (unused by lion)

const FACTOR = 1u;  const SKIP = 3u;  const TAKEN = 6u;    // the gate's slots: kernels.GATE

@compute @workgroup_size(256)
fn adamw(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
         @builtin(local_invocation_id) lidv: vec3<u32>) {
  let blk = group_index(wid, nwg);
  let i = blk * 256u + lidv.x;
  let wd = wd_table[p.first + blk];
  if (i >= p.n || wd < 0.0 || gate[SKIP] != 0.0) { return; }
  let t = gate[TAKEN];
  let grad = g[i] * gate[FACTOR];
  let mi = p.beta1 * m[i] + (1.0 - p.beta1) * grad;
  let vi = p.beta2 * v[i] + (1.0 - p.beta2) * grad * grad;
  m[i] = mi;
  v[i] = vi;
  let mhat = mi / (1.0 - pow(p.beta1, t));
  let vhat = vi / (1.0 - pow(p.beta2, t));
  w[i] = w[i] - p.lr * (mhat / (sqrt(vhat) + p.eps) + wd * w[i]);
}

@compute @workgroup_size(256)
fn lion(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_id) lidv: vec3<u32>) {
  let blk = group_index(wid, nwg);
  let i = blk * 256u + lidv.x;
  let wd = wd_table[p.first + blk];
  if (i >= p.n || wd < 0.0 || gate[SKIP] != 0.0) { return; }
  let grad = g[i] * gate[FACTOR];
  let mi = m[i];
  w[i] = w[i] - p.lr * (sign(p.beta1 * mi + (1.0 - p.beta1) * grad) + wd * w[i]);
  m[i] = p.beta2 * mi + (1.0 - p.beta2) * grad;
}
