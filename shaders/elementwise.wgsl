//#if f16
enable f16;
//#endif
//#if sg
enable subgroups;
//#endif
// Elementwise ops, one source for every width and stored type:
//   add{{VEC}}            out = x + y  (the residual stream)
//   accumulate{{VEC}}     out += x: gradient accumulation adds each micro-batch's gradients in place
//   gelu_forward{{VEC}}   out = gelu(x): x Phi(x), or GPT-2's tanh form (override TANH)
//   gelu_backward{{VEC}}  out = dy * gelu'(x), x the pre-activation, y = dy
//   relu2_forward{{VEC}}  out = relu(x)^2: nanochat's MLP activation (Primer's squared ReLU)
//   relu2_backward{{VEC}} out = dy * 2 relu(x), x the pre-activation, y = dy
//   scale                 out = x * SCALE: LoRA's alpha / rank on the [rows, rank] products
//   bias_grad             out[c] = sum over rows of x[row, c]; n = rows
//   bias_grad_sg          bias_grad by subgroups
//   gelu_forward_bf16 | _f16   GELU with its pre-activation stored as bf16 (two to a u32,
//   gelu_backward_bf16 | _f16  common.wgsl's bf16_* helpers) or f16; dy and d(x) float32
//   relu2_forward_bf16 | _f16  the squared ReLU, the same way
//   relu2_backward_bf16 | _f16
// 1-D grids are folded into (x, y) by the host, so the linear id is rebuilt from num_workgroups.
//
// The width is the launcher's (kernels.WIDTHS): V = f32 (one float an invocation) or vec4<f32>
// (W = 4: n a multiple of 4, 4 vec4 an invocation, 64 apart so that a workgroup covers one
// block). Why vec4: lavapipe pays per lane for each load instruction whatever its width, and a
// fixed cost per workgroup; one float per invocation paid both 16 times over (gelu_forward on
// 393,216 floats: see the commit that added the vec4 form). The half forms are of the vec4
// width and do their arithmetic in float32 (erf's polynomial would lose its accuracy in f16):
// what they save is bytes, and a vec4<u32> load brings 8 bf16 where a vec4<f32> brings 4.
//
// Why bias_grad differs by width: one invocation per column loops the rows in order
// (deterministic, no atomics) and reads one float per row; its vector form is bias_grad_sg (the
// sg section, for adapters with subgroups, cols a multiple of 4): one 8-lane subgroup per 4
// columns, lane l summing rows l, l+8, ... as vec4, subgroupAdd joining the 8 partial sums in a
// fixed order (the same inputs give the same bits): 8x the lanes read a quarter of the loads.

struct Params { n: u32, cols: u32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<V>;
@group(0) @binding(2) var<storage, read> y: array<V>;
@group(0) @binding(3) var<storage, read_write> out: array<V>;
// the half forms' bindings: the pre-activation, d(out), gelu(x) stored half, d(x)
@group(0) @binding(1) var<storage, read> xh: array<vec4<u32>>;         // 8 bf16 a word
@group(0) @binding(2) var<storage, read> dy: array<vec4<f32>>;         // backward: d(out) | unused
@group(0) @binding(3) var<storage, read_write> outh: array<vec4<u32>>; // forward: gelu(x) as bf16 | unused
@group(0) @binding(4) var<storage, read_write> outf: array<vec4<f32>>; // backward: d(x) | unused

const PER: u32 = W;   // V per invocation: 1 float, or 4 vec4

// gelu4, gelu_grad4: common.wgsl (erf by Abramowitz & Stegun 7.1.26, WGSL having no erf; or tanh).
override TANH: bool = false;   // GPT-2's tanh form of GELU, not the exact one

//#if vec4
fn gelu_v(v: V) -> V { return gelu4(v, TANH); }
fn gelu_grad_v(v: V) -> V { return gelu_grad4(v, TANH); }

// the half forms' activation (relu2 a constant at each call: the branch folds away)
fn act4(relu2: bool, v: vec4<f32>) -> vec4<f32> {
  if (relu2) { let r = max(v, vec4<f32>(0.0)); return r * r; }
  return gelu4(v, TANH);
}

fn act_grad4(relu2: bool, v: vec4<f32>) -> vec4<f32> {
  if (relu2) { return 2.0 * max(v, vec4<f32>(0.0)); }
  return gelu_grad4(v, TANH);
}
//#else
fn gelu_v(v: f32) -> f32 {
  if (TANH) { return gelu4(vec4<f32>(v), true).x; }
  return 0.5 * v * (1.0 + erf_approx(v * 0.70710678118654752));
}

fn gelu_grad_v(v: f32) -> f32 {
  if (TANH) { return gelu_grad4(vec4<f32>(v), true).x; }
  let cdf = 0.5 * (1.0 + erf_approx(v * 0.70710678118654752));
  let pdf = 0.3989422804014327 * exp(-0.5 * v * v);
  return cdf + v * pdf;
}
//#endif

const ADD: u32 = 0u;
const GELU_FORWARD: u32 = 1u;
const GELU_BACKWARD: u32 = 2u;
const ACCUMULATE: u32 = 3u;
const RELU2_FORWARD: u32 = 4u;
const RELU2_BACKWARD: u32 = 5u;

fn apply(op: u32, i: u32) -> V {
  let v = x[i];
  switch op {
    case ADD: { return v + y[i]; }
    case GELU_FORWARD: { return gelu_v(v); }
    case ACCUMULATE: { return out[i] + v; }
    case RELU2_FORWARD: { let r = max(v, V(0.0)); return r * r; }
    case RELU2_BACKWARD: { return y[i] * 2.0 * max(v, V(0.0)); }
    default: { return y[i] * gelu_grad_v(v); }
  }
}

// this invocation's PER values of V, 64 apart (op is a constant at each call: the switch in
// apply folds away)
fn each(op: u32, wid: vec3<u32>, nwg: vec3<u32>, lid: vec3<u32>) {
  let i0 = group_index(wid, nwg) * 64u * PER + lid.x;
  for (var j = 0u; j < PER; j++) {
    let i = i0 + 64u * j;
    if (i < p.n / W) { out[i] = apply(op, i); }
  }
}

@compute @workgroup_size(64)
fn add{{VEC}}(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_id) lid: vec3<u32>) {
  each(ADD, wid, nwg, lid);
}

@compute @workgroup_size(64)
fn gelu_forward{{VEC}}(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                 @builtin(local_invocation_id) lid: vec3<u32>) {
  each(GELU_FORWARD, wid, nwg, lid);
}

@compute @workgroup_size(64)
fn gelu_backward{{VEC}}(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                  @builtin(local_invocation_id) lid: vec3<u32>) {
  each(GELU_BACKWARD, wid, nwg, lid);
}

@compute @workgroup_size(64)
fn relu2_forward{{VEC}}(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                  @builtin(local_invocation_id) lid: vec3<u32>) {
  each(RELU2_FORWARD, wid, nwg, lid);
}

@compute @workgroup_size(64)
fn relu2_backward{{VEC}}(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                   @builtin(local_invocation_id) lid: vec3<u32>) {
  each(RELU2_BACKWARD, wid, nwg, lid);
}

@compute @workgroup_size(64)
fn accumulate{{VEC}}(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_id) lid: vec3<u32>) {
  each(ACCUMULATE, wid, nwg, lid);
}

//#if !vec4
// (one value a run, so a constant of the pipeline; y is unused)
override SCALE: f32 = 1.0;
@compute @workgroup_size(64)
fn scale(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
         @builtin(local_invocation_id) lid: vec3<u32>) {
  let i = lin(wid, nwg, lid);
  if (i < p.n) { out[i] = x[i] * SCALE; }
}

@compute @workgroup_size(64)
fn bias_grad(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
             @builtin(local_invocation_id) lid: vec3<u32>) {
  let c = lin(wid, nwg, lid);
  if (c >= p.cols) { return; }
  var s = 0.0;
  for (var r = 0u; r < p.n; r++) { s += x[r * p.cols + c]; }
  out[c] = s;
}
//#else

// 16 values (two words of 8) an invocation, 64 apart: a workgroup covers a block; n a multiple of 8
const WORDS: u32 = 2u;

fn word(wid: vec3<u32>, nwg: vec3<u32>, lid: vec3<u32>, j: u32) -> u32 {
  return group_index(wid, nwg) * 64u * WORDS + lid.x + 64u * j;
}

struct X8 { a: vec4<f32>, b: vec4<f32> }      // the 8 values of word w of x: 0-3 and 4-7

fn x8(w: u32) -> X8 {
  let v = xh[w];
  return X8(bf16_lo4(v.xy), bf16_lo4(v.zw));
}

fn forward_bf16(relu2: bool, wid: vec3<u32>, nwg: vec3<u32>, lid: vec3<u32>) {
  for (var j = 0u; j < WORDS; j++) {
    let w = word(wid, nwg, lid, j);
    if (w < p.n / 8u) {
      let v = x8(w);
      let a = act4(relu2, v.a);
      let b = act4(relu2, v.b);
      outh[w] = vec4<u32>(bf16_pack(a.x, a.y), bf16_pack(a.z, a.w), bf16_pack(b.x, b.y), bf16_pack(b.z, b.w));
    }
  }
}

fn backward_bf16(relu2: bool, wid: vec3<u32>, nwg: vec3<u32>, lid: vec3<u32>) {
  for (var j = 0u; j < WORDS; j++) {
    let w = word(wid, nwg, lid, j);
    if (w < p.n / 8u) {
      let v = x8(w);
      outf[2u * w] = dy[2u * w] * act_grad4(relu2, v.a);
      outf[2u * w + 1u] = dy[2u * w + 1u] * act_grad4(relu2, v.b);
    }
  }
}

@compute @workgroup_size(64)
fn gelu_forward_bf16(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                     @builtin(local_invocation_id) lid: vec3<u32>) {
  forward_bf16(false, wid, nwg, lid);
}

@compute @workgroup_size(64)
fn gelu_backward_bf16(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                      @builtin(local_invocation_id) lid: vec3<u32>) {
  backward_bf16(false, wid, nwg, lid);
}

@compute @workgroup_size(64)
fn relu2_forward_bf16(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                      @builtin(local_invocation_id) lid: vec3<u32>) {
  forward_bf16(true, wid, nwg, lid);
}

@compute @workgroup_size(64)
fn relu2_backward_bf16(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                       @builtin(local_invocation_id) lid: vec3<u32>) {
  backward_bf16(true, wid, nwg, lid);
}
//#endif
//#if f16

@group(0) @binding(1) var<storage, read> xf16: array<vec4<f16>>;
@group(0) @binding(3) var<storage, read_write> outf16: array<vec4<f16>>;

fn forward_f16(relu2: bool, wid: vec3<u32>, nwg: vec3<u32>, lid: vec3<u32>) {
  let i0 = group_index(wid, nwg) * 64u * PER + lid.x;
  for (var j = 0u; j < PER; j++) {
    let q = i0 + 64u * j;
    if (q < p.n / 4u) { outf16[q] = to_f16x4(act4(relu2, vec4<f32>(xf16[q]))); }
  }
}

fn backward_f16(relu2: bool, wid: vec3<u32>, nwg: vec3<u32>, lid: vec3<u32>) {
  let i0 = group_index(wid, nwg) * 64u * PER + lid.x;
  for (var j = 0u; j < PER; j++) {
    let q = i0 + 64u * j;
    if (q < p.n / 4u) { outf[q] = dy[q] * act_grad4(relu2, vec4<f32>(xf16[q])); }
  }
}

@compute @workgroup_size(64)
fn gelu_forward_f16(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                    @builtin(local_invocation_id) lid: vec3<u32>) {
  forward_f16(false, wid, nwg, lid);
}

@compute @workgroup_size(64)
fn gelu_backward_f16(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                     @builtin(local_invocation_id) lid: vec3<u32>) {
  backward_f16(false, wid, nwg, lid);
}

@compute @workgroup_size(64)
fn relu2_forward_f16(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                     @builtin(local_invocation_id) lid: vec3<u32>) {
  forward_f16(true, wid, nwg, lid);
}

@compute @workgroup_size(64)
fn relu2_backward_f16(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                      @builtin(local_invocation_id) lid: vec3<u32>) {
  backward_f16(true, wid, nwg, lid);
}
//#endif
//#if sg

const LANES: u32 = 8u;

@compute @workgroup_size(LANES)
fn bias_grad_sg(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                @builtin(subgroup_invocation_id) lane: u32) {
  let c4 = group_index(wid, nwg);       // uniform across the subgroup
  let n4 = p.cols / 4u;
  if (c4 >= n4) { return; }
  var s = vec4<f32>();
  for (var r = lane; r < p.n; r += LANES) { s += x[r * n4 + c4]; }
  let t = subgroupAdd(s);
  if (lane == 0u) { out[c4] = t; }
}
//#endif
