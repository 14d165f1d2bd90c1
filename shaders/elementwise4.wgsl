// elementwise.wgsl's add and GELU read and written as vec4, 4 vec4 per invocation,
// for n a multiple of 4 (device/kernels.py takes elementwise.wgsl otherwise).
// Why: lavapipe pays per lane for each load instruction whatever its width,
// and a fixed cost per workgroup; one float per invocation paid both 16 times
// over (gelu_forward on 393,216 floats: see the commit that added this file).

struct Params { n: u32, cols: u32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> y: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> out: array<vec4<f32>>;

const PER: u32 = 4u;  // vec4 per invocation

// gelu4, gelu_grad4: common.wgsl (erf by Abramowitz & Stegun 7.1.26, WGSL having no erf; or tanh).
override TANH: bool = false;   // the GELU kernels: GPT-2's tanh form, not the exact one

const ADD: u32 = 0u;
const GELU_FORWARD: u32 = 1u;
const GELU_BACKWARD: u32 = 2u;
const ACCUMULATE: u32 = 3u;

// out[i] for op at vec4 i: x + y; gelu(x) (x Phi(x), or the tanh form); with x the pre-activation
// and y = d(out), d(pre) = dy * gelu'(x); or out + x (accumulate: gradient accumulation's sum in place)
fn apply(op: u32, i: u32) -> vec4<f32> {
  let v = x[i];
  switch op {
    case ADD: { return v + y[i]; }
    case GELU_FORWARD: { return gelu4(v, TANH); }
    case ACCUMULATE: { return out[i] + v; }
    default: { return y[i] * gelu_grad4(v, TANH); }
  }
}

// this invocation's PER vec4, 64 apart so that a workgroup covers one block (op is a
// constant at each call: the switch in apply folds away)
fn each(op: u32, wid: vec3<u32>, nwg: vec3<u32>, lid: vec3<u32>) {
  let i0 = group_index(wid, nwg) * 64u * PER + lid.x;
  for (var j = 0u; j < PER; j++) {
    let i = i0 + 64u * j;
    if (i < p.n / 4u) { out[i] = apply(op, i); }
  }
}

@compute @workgroup_size(64)
fn add4(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_id) lid: vec3<u32>) {
  each(ADD, wid, nwg, lid);
}

@compute @workgroup_size(64)
fn gelu_forward4(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                 @builtin(local_invocation_id) lid: vec3<u32>) {
  each(GELU_FORWARD, wid, nwg, lid);
}

@compute @workgroup_size(64)
fn gelu_backward4(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                  @builtin(local_invocation_id) lid: vec3<u32>) {
  each(GELU_BACKWARD, wid, nwg, lid);
}

@compute @workgroup_size(64)
fn accumulate4(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_id) lid: vec3<u32>) {
  each(ACCUMULATE, wid, nwg, lid);
}
