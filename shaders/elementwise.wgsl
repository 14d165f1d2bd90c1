// Elementwise ops: residual add, exact GELU and its backward, bias gradient, scaling.
// One invocation per element (bias_grad: per column); 1-D grids are folded
// into (x, y) by the host, so the linear id is rebuilt from num_workgroups.

struct Params { n: u32, cols: u32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> y: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

// out = x + y  (the residual stream)
@compute @workgroup_size(64)
fn add(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
       @builtin(local_invocation_id) lid: vec3<u32>) {
  let i = lin(wid, nwg, lid);
  if (i < p.n) { out[i] = x[i] + y[i]; }
}

// out[i] += x[i]: gradient accumulation adds each micro-batch's gradients in place
@compute @workgroup_size(64)
fn accumulate(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
              @builtin(local_invocation_id) lid: vec3<u32>) {
  let i = lin(wid, nwg, lid);
  if (i < p.n) { out[i] = out[i] + x[i]; }
}

// out = x * SCALE: LoRA's alpha / rank on the [rows, rank] products (one value a run, so a
// constant of the pipeline; y is unused)
override SCALE: f32 = 1.0;
@compute @workgroup_size(64)
fn scale(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
         @builtin(local_invocation_id) lid: vec3<u32>) {
  let i = lin(wid, nwg, lid);
  if (i < p.n) { out[i] = x[i] * SCALE; }
}

// erf_approx, gelu4, gelu_grad4: common.wgsl (erf by Abramowitz & Stegun 7.1.26: WGSL has no erf).
override TANH: bool = false;   // GPT-2's tanh form of GELU, not the exact one

// out = 0.5 x (1 + erf(x / sqrt 2)), or the tanh form; y is unused (bound to keep one layout).
@compute @workgroup_size(64)
fn gelu_forward(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                @builtin(local_invocation_id) lid: vec3<u32>) {
  let i = lin(wid, nwg, lid);
  if (i < p.n) {
    let v = x[i];
    if (TANH) { out[i] = gelu4(vec4<f32>(v), true).x; return; }
    out[i] = 0.5 * v * (1.0 + erf_approx(v * 0.70710678118654752));
  }
}

// x = pre-activation, y = d(out); out = d(pre) = dy * (Phi(x) + x phi(x)), or the tanh form's
@compute @workgroup_size(64)
fn gelu_backward(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                 @builtin(local_invocation_id) lid: vec3<u32>) {
  let i = lin(wid, nwg, lid);
  if (i < p.n) {
    let v = x[i];
    if (TANH) { out[i] = y[i] * gelu_grad4(vec4<f32>(v), true).x; return; }
    let cdf = 0.5 * (1.0 + erf_approx(v * 0.70710678118654752));
    let pdf = 0.3989422804014327 * exp(-0.5 * v * v);
    out[i] = y[i] * (cdf + v * pdf);
  }
}

// out[c] = sum over rows of x[row, c]; n = rows. y is unused.
// One invocation per column looping rows in order: deterministic, no atomics.
@compute @workgroup_size(64)
fn bias_grad(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
             @builtin(local_invocation_id) lid: vec3<u32>) {
  let c = lin(wid, nwg, lid);
  if (c >= p.cols) { return; }
  var s = 0.0;
  for (var r = 0u; r < p.n; r++) { s += x[r * p.cols + c]; }
  out[c] = s;
}
