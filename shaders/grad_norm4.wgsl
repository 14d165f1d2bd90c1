// grad_norm.wgsl's grad_sumsq reading vec4 (the flat buffers hold whole 256-float blocks, so n
// is always a multiple of 4): the same bindings and rules, each chunk summed in another fixed order.
// Why: lavapipe pays per lane for every load instruction whatever its width.

struct Params { n: u32, clip: f32, first: u32, growth: u32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> g: array<vec4<f32>>;     // grads [n]
@group(0) @binding(2) var<storage, read> aux: array<f32>;         // the gate (SCALED)
@group(0) @binding(3) var<storage, read_write> out: array<f32>;   // partials

const CHUNK: u32 = 4096u;  // floats per partial, as grad_norm.wgsl

override SCALED: bool = false;
const SCALE = 2u;   // grad_norm.wgsl's slot

fn finite4(x: vec4<f32>) -> bool { return all((bitcast<vec4<u32>>(x) & vec4<u32>(0x7f800000u)) != vec4<u32>(0x7f800000u)); }

// 64 lanes; a chunk is 1024 vec4, 16 per lane
@compute @workgroup_size(64)
fn grad_sumsq4(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_id) lidv: vec3<u32>) {
  let wg = group_index(wid, nwg);
  let lid = lidv.x;
  let start = wg * (CHUNK / 4u);
  let end = min(start + CHUNK / 4u, p.n / 4u);
  var inv = 1.0;
  if (SCALED) { inv = 1.0 / aux[SCALE]; }
  var s = vec4<f32>();
  var bad = 0.0;
  for (var i = start + lid; i < end; i += 64u) {
    let x = g[i] * inv;
    s += x * x;
    if (SCALED && !finite4(g[i])) { bad = 1.0; }
  }
  var t = wg_sum64(lid, (s.x + s.y) + (s.z + s.w));     // common.wgsl
  if (SCALED && wg_max64(lid, bad) > 0.0) { t = -1.0; }
  if (lid == 0u) { out[p.first + wg] = t; }
}
