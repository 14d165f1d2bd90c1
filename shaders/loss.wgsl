//#if sg
enable subgroups;
//#endif
// Cross-entropy over the vocabulary, fused with its softmax backward, and the
// deterministic mean of the per-row losses.
//   cross_entropy  losses[r] = logsumexp(logits[r]) - logits[r, target[r]]
//                  logits[r] <- (softmax(logits[r]) - onehot(target)) * scale   when write_grad
//                  (* the loss scale where SCALED)
//                  a target of UNSCORED (a chat file's prompt and padding) scores nothing: loss 0,
//                  gradient 0; its row is still read, so that no branch depends on a loaded value
//                  before the barriers
//   loss_reduce    loss[0] = sum(losses) * scale  (loss: binding 2, where cross_entropy has logits)
//   softcap        logits[r] <- SOFTCAP * tanh(logits[r] / SOFTCAP) in place (nanochat's logit soft-cap),
//                  and with SOFTCAP > 0 cross_entropy's gradient is the uncapped logits': the capped
//                  one times 1 - (y / SOFTCAP)^2, y the capped logit it reads, so that nothing more
//                  is kept for the backward
// One workgroup of 64 per row; the row max and sum go through workgroup
// memory so that large vocabularies (50257) stay parallel. Rows are split
// into chunks by the host when the logits exceed a binding (row0 offsets).
// Rows are `stride` >= V apart: the host pads the vocabulary to a multiple of 4 for
// the vec4 matmuls; the padding columns are skipped and their gradient written as 0.

struct Params { rows: u32, V: u32, scale: f32, write_grad: u32, row0: u32, stride: u32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> targets: array<u32>;      // [all rows]
@group(0) @binding(2) var<storage, read_write> logits: array<f32>; // [rows, stride], becomes dlogits
@group(0) @binding(3) var<storage, read_write> losses: array<f32>; // [all rows]
// loss_reduce's output: the same binding as logits, which cross_entropy uses (one entry point
// touches one of the two names; the host binds the 4-float loss buffer there for loss_reduce)
@group(0) @binding(2) var<storage, read_write> loss: array<f32>;   // [1]
// SCALED: dlogits also carry the loss scale, read from the scaler (optim.wgsl's stats, slot 2)
// on the device, where the optimizer changes it without the host knowing
@group(0) @binding(4) var<storage, read> scaler: array<f32>;
override SCALED: bool = false;
override SOFTCAP: f32 = 0.0;       // the logits were capped at +-SOFTCAP (softcap); 0: not capped
const UNSCORED: u32 = 0xffffffffu; // core/config.py's UNSCORED: a position whose next token is not scored

// d(capped)/d(uncapped) at the capped logit y
fn cap_grad(y: f32) -> f32 {
  let t = y / SOFTCAP;
  return 1.0 - t * t;
}

fn grad_scale() -> f32 {
  if (SCALED) { return p.scale * scaler[2]; }
  return p.scale;
}

// the row reductions: wg_max64 / wg_sum64 (common.wgsl)

@compute @workgroup_size(64)
fn cross_entropy(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                 @builtin(local_invocation_id) lidv: vec3<u32>) {
  let r = group_index(wid, nwg);       // uniform across the workgroup
  if (r >= p.rows) { return; }
  let lid = lidv.x;
  let base = r * p.stride;
  var m = -0x1.fffffep+127f;
  for (var j = lid; j < p.V; j += 64u) { m = max(m, logits[base + j]); }
  m = wg_max64(lid, m);
  var s = 0.0;
  for (var j = lid; j < p.V; j += 64u) { s += exp(logits[base + j] - m); }
  s = wg_sum64(lid, s);
  let scored = targets[p.row0 + r] != UNSCORED;
  let tgt = select(0u, targets[p.row0 + r], scored);
  if (lid == 0u) { losses[p.row0 + r] = select(0.0, m + log(s) - logits[base + tgt], scored); }
  if (p.write_grad != 0u) {
    workgroupBarrier();  // lane 0 read logits[tgt] above
    let inv = 1.0 / s;
    let scale = grad_scale();
    for (var j = lid; j < p.stride; j += 64u) {
      let y = logits[base + j];
      var g = exp(y - m) * inv;
      if (j == tgt) { g -= 1.0; }
      if (SOFTCAP > 0.0) { g *= cap_grad(y); }
      logits[base + j] = select(0.0, g * scale, j < p.V && scored);
    }
  }
}

@compute @workgroup_size(64)
fn loss_reduce(@builtin(local_invocation_id) lidv: vec3<u32>) {
  let lid = lidv.x;
  var s = 0.0;
  for (var j = lid; j < p.rows; j += 64u) { s += losses[j]; }
  s = wg_sum64(lid, s);
  if (lid == 0u) { loss[0] = s * p.scale; }
}

// logits [rows, stride] capped in place (the padding columns' 0 stays 0); one invocation a logit.
// tanh's argument clamped to +-9, where tanh is 1 within float32's rounding, so that no
// implementation's exp overflows inside it
@compute @workgroup_size(64)
fn softcap(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
           @builtin(local_invocation_id) lid: vec3<u32>) {
  let i = lin(wid, nwg, lid);
  if (i >= p.rows * p.stride) { return; }
  logits[i] = SOFTCAP * tanh(clamp(logits[i] / SOFTCAP, -9.0, 9.0));
}
//#if sg

// cross_entropy_sg: cross_entropy for adapters with subgroups (the sg section): one 8-lane
// subgroup per row, reductions by subgroupMax / subgroupAdd, logits read as vec4 (the host pads
// rows to a stride that is a multiple of 4; columns past V are skipped and their gradient written
// as 0). Same bindings and results as cross_entropy. Why another algorithm: lavapipe runs
// cross_entropy's 12 workgroup barriers per row as coroutine switches, and reads one float per
// load; here there are no barriers and a quarter of the loads (docs/results.md has the time).
@group(0) @binding(2) var<storage, read_write> logits4: array<vec4<f32>>; // [rows, stride / 4], becomes dlogits

const LANES: u32 = 8u;
const NEG: f32 = -0x1.fffffep+127f;

// which of the 4 columns from 4j are real (< V)
fn real(j: u32) -> vec4<bool> {
  let c = 4u * j;
  return vec4<bool>(c < p.V, c + 1u < p.V, c + 2u < p.V, c + 3u < p.V);
}

@compute @workgroup_size(LANES)
fn cross_entropy_sg(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                    @builtin(subgroup_invocation_id) lane: u32) {
  let r = group_index(wid, nwg);       // uniform across the subgroup
  if (r >= p.rows) { return; }
  let s4 = p.stride / 4u;
  let v4 = (p.V + 3u) / 4u;
  let base = r * s4;
  let scored = targets[p.row0 + r] != UNSCORED;
  let tgt = select(0u, targets[p.row0 + r], scored);
  var m4 = vec4<f32>(NEG);
  var t4 = vec4<f32>();                // the target's logit, in the lane and place that read it
  for (var j = lane; j < v4; j += LANES) {
    let x = logits4[base + j];
    m4 = max(m4, select(vec4<f32>(NEG), x, real(j)));
    let c = 4u * j;
    t4 += select(vec4<f32>(), x, vec4<bool>(c == tgt, c + 1u == tgt, c + 2u == tgt, c + 3u == tgt));
  }
  let m = subgroupMax(max(max(m4.x, m4.y), max(m4.z, m4.w)));
  // every lane's writes below depend on this sum of every lane's reads: no lane overwrites
  // the target's logit before it was read
  let lt = subgroupAdd((t4.x + t4.y) + (t4.z + t4.w));
  var s4v = vec4<f32>();
  for (var j = lane; j < v4; j += LANES) { s4v += select(vec4<f32>(), exp(logits4[base + j] - m), real(j)); }
  let s = subgroupAdd((s4v.x + s4v.y) + (s4v.z + s4v.w));
  if (lane == 0u) { losses[p.row0 + r] = select(0.0, m + log(s) - lt, scored); }
  if (p.write_grad != 0u) {
    let inv = 1.0 / s;
    var scale = p.scale;
    if (SCALED) { scale *= scaler[2]; }
    for (var j = lane; j < s4; j += LANES) {
      let y = logits4[base + j];
      var g = exp(y - m) * inv;
      let c = 4u * j;
      g -= vec4<f32>(select(0.0, 1.0, c == tgt), select(0.0, 1.0, c + 1u == tgt),
                     select(0.0, 1.0, c + 2u == tgt), select(0.0, 1.0, c + 3u == tgt));
      if (SOFTCAP > 0.0) { g *= vec4<f32>(cap_grad(y.x), cap_grad(y.y), cap_grad(y.z), cap_grad(y.w)); }
      logits4[base + j] = select(vec4<f32>(), g * scale, real(j) & vec4<bool>(scored));
    }
  }
}
//#endif
