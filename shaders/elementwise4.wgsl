// elementwise.wgsl's add and GELU read and written as vec4, 4 vec4 per invocation,
// for n a multiple of 4 (kernels.py takes elementwise.wgsl otherwise).
// Why: lavapipe pays per lane for each load instruction whatever its width,
// and a fixed cost per workgroup; one float per invocation paid both 16 times
// over (gelu_forward on 393,216 floats: see the commit that added this file).

struct Params { n: u32, cols: u32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> y: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> out: array<vec4<f32>>;

const PER: u32 = 4u;  // vec4 per invocation

// the first of this invocation's PER vec4; they sit 64 apart so a workgroup covers one block
fn first(wid: vec3<u32>, nwg: vec3<u32>, lid: vec3<u32>) -> u32 {
  return (wid.y * nwg.x + wid.x) * 64u * PER + lid.x;
}

@compute @workgroup_size(64)
fn add4(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_id) lid: vec3<u32>) {
  let i0 = first(wid, nwg, lid);
  for (var j = 0u; j < PER; j++) {
    let i = i0 + 64u * j;
    if (i < p.n / 4u) { out[i] = x[i] + y[i]; }
  }
}

// erf with |error| < 1.5e-7 (Abramowitz & Stegun 7.1.26), as in elementwise.wgsl
fn erf4(v: vec4<f32>) -> vec4<f32> {
  let a = abs(v);
  let t = 1.0 / (1.0 + 0.3275911 * a);
  let poly = ((((1.061405429 * t - 1.453152027) * t + 1.421413741) * t - 0.284496736) * t + 0.254829592) * t;
  return sign(v) * (1.0 - poly * exp(-a * a));
}

fn cdf4(v: vec4<f32>) -> vec4<f32> { return 0.5 * (1.0 + erf4(v * 0.70710678118654752)); }  // Phi(v)

@compute @workgroup_size(64)
fn gelu_forward4(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                 @builtin(local_invocation_id) lid: vec3<u32>) {
  let i0 = first(wid, nwg, lid);
  for (var j = 0u; j < PER; j++) {
    let i = i0 + 64u * j;
    if (i < p.n / 4u) {
      let v = x[i];
      out[i] = v * cdf4(v);
    }
  }
}

// x = pre-activation, y = d(out); out = d(pre) = dy * (Phi(x) + x phi(x))
@compute @workgroup_size(64)
fn gelu_backward4(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                  @builtin(local_invocation_id) lid: vec3<u32>) {
  let i0 = first(wid, nwg, lid);
  for (var j = 0u; j < PER; j++) {
    let i = i0 + 64u * j;
    if (i < p.n / 4u) {
      let v = x[i];
      out[i] = y[i] * (cdf4(v) + v * 0.3989422804014327 * exp(-0.5 * v * v));
    }
  }
}
