// Helpers every shader may use, written once: gpu.py's loader puts this file in
// front of each shader's declarations (after its `enable` directives), and compile
// errors still name the right file and line. Functions only: no bindings here.

// The workgroup's linear index in a 1-D grid that the host folded into (x, y)
// because one dimension holds at most 65,535 workgroups (gpu.grid1d).
fn group_index(wid: vec3<u32>, nwg: vec3<u32>) -> u32 {
  return wid.y * nwg.x + wid.x;
}

// The invocation's linear index in such a grid of 64-lane workgroups.
fn lin(wid: vec3<u32>, nwg: vec3<u32>, lid: vec3<u32>) -> u32 {
  return group_index(wid, nwg) * 64u + lid.x;
}

// erf with |error| < 1.5e-7 (Abramowitz & Stegun 7.1.26): WGSL has no erf.
fn erf4(v: vec4<f32>) -> vec4<f32> {
  let a = abs(v);
  let t = 1.0 / (1.0 + 0.3275911 * a);
  let poly = ((((1.061405429 * t - 1.453152027) * t + 1.421413741) * t - 0.284496736) * t + 0.254829592) * t;
  return sign(v) * (1.0 - poly * exp(-a * a));
}

fn erf_approx(v: f32) -> f32 {
  return erf4(vec4<f32>(v)).x;
}
