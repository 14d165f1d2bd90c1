// Direct Preference Optimization (DPO) on the device: the loss of a micro-batch of preference pairs
// and the factor it puts on each completion's rows of dlogits, after cross_entropy (loss.wgsl) has
// written each row's loss (0 where the target is not scored) and its gradient at scale 1.
//   dpo         the micro-batch's windows are pairs, the chosen completion in window 2i and the
//               rejected one in 2i+1, of T rows each. A window's log-probability is minus the sum of
//               its rows' losses; with the reference model's (refs[2i], refs[2i+1], float32 bits in
//               the batch buffer), z = beta ((lc - rc) - (lr - rr)) and the pair's loss is
//               softplus(-z) = -log sigmoid(z). d loss / d (a row's cross-entropy) is
//               beta (1 - sigmoid(z)) on the chosen rows and its negative on the rejected ones:
//               weights[2i] and weights[2i+1], times wscale (1 / the step's pairs); loss[0] is the
//               sum of the pairs' losses times lscale (1 / the micro-batch's pairs).
//   scale_rows  dlogits[r, :] *= weights[(row0 + r) / T] over a chunk of rows (row0 its first).
// One workgroup of 64 for dpo (a micro-batch holds few pairs; each window's T losses are summed by
// one invocation, in order); one invocation a logit for scale_rows.

struct Params { pairs: u32, T: u32, beta: f32, wscale: f32, lscale: f32 }
struct RowParams { rows: u32, stride: u32, T: u32, row0: u32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> refs: array<u32>;          // [2 pairs] float32 bits
@group(0) @binding(2) var<storage, read> losses: array<f32>;        // [2 pairs * T]
@group(0) @binding(3) var<storage, read_write> weights: array<f32>; // [2 pairs]
@group(0) @binding(4) var<storage, read_write> loss: array<f32>;    // [1]

// scale_rows' bindings (the entry points share the file, not a binding)
@group(0) @binding(0) var<uniform> q: RowParams;
@group(0) @binding(1) var<storage, read> row_weights: array<f32>;   // [windows]
@group(0) @binding(2) var<storage, read_write> logits: array<f32>;  // [rows, stride], dlogits

fn logprob(w: u32) -> f32 {
  var s = 0.0;
  for (var t = 0u; t < p.T; t++) { s += losses[w * p.T + t]; }
  return -s;
}

// -log sigmoid(z), without overflow at either end
fn softplus_neg(z: f32) -> f32 {
  return max(-z, 0.0) + log(1.0 + exp(-abs(z)));
}

@compute @workgroup_size(64)
fn dpo(@builtin(local_invocation_id) lidv: vec3<u32>) {
  let lid = lidv.x;
  var total = 0.0;
  for (var i = lid; i < p.pairs; i += 64u) {
    let margin = (logprob(2u * i) - bitcast<f32>(refs[2u * i])) - (logprob(2u * i + 1u) - bitcast<f32>(refs[2u * i + 1u]));
    let z = p.beta * margin;
    let g = p.beta * (1.0 - 1.0 / (1.0 + exp(-z))) * p.wscale;
    weights[2u * i] = g;
    weights[2u * i + 1u] = -g;
    total += softplus_neg(z);
  }
  total = wg_sum64(lid, total);
  if (lid == 0u) { loss[0] = total * p.lscale; }
}

@compute @workgroup_size(64)
fn scale_rows(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
              @builtin(local_invocation_id) lid: vec3<u32>) {
  let i = lin(wid, nwg, lid);
  if (i >= q.rows * q.stride) { return; }
  logits[i] *= row_weights[(q.row0 + i / q.stride) / q.T];
}
