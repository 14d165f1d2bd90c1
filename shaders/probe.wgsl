//#if sg
enable subgroups;
//#endif
// Micro-kernels that measure what an adapter can do at all, for scripts/probe_adapter.py:
//   probe_fma        8 independent vec4 FMA chains in registers, no memory traffic: peak arithmetic
//   probe_load_lane  vec4 loads whose address differs per invocation (lane), summed
//   probe_load_wg    vec4 loads whose address depends on the workgroup only, summed
//   probe_broadcast  (the sg section, for adapters with subgroups) 8 vec4 FMA chains per lane, as
//                    probe_fma, and each chain's new value broadcast from lane k to the subgroup
//                    and summed: the cost of handing a value to the other lanes, against
//                    probe_load_* for loading it. One workgroup is one subgroup of 8 lanes (the sg
//                    kernels' shape).
// Each invocation loops `iters` times (kept under llvmpipe's 65,535-iteration cap).

struct Params { iters: u32, n4: u32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> src: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> out: array<vec4<f32>>;

@compute @workgroup_size(64)
fn probe_fma(@builtin(global_invocation_id) gid: vec3<u32>) {
  var a0 = vec4<f32>(f32(gid.x)); var a1 = a0 + 1.0; var a2 = a0 + 2.0; var a3 = a0 + 3.0;
  var a4 = a0 + 4.0; var a5 = a0 + 5.0; var a6 = a0 + 6.0; var a7 = a0 + 7.0;
  let m = vec4<f32>(0.999);
  let c = vec4<f32>(0.001);
  for (var i = 0u; i < p.iters; i++) {
    a0 = fma(a0, m, c); a1 = fma(a1, m, c); a2 = fma(a2, m, c); a3 = fma(a3, m, c);
    a4 = fma(a4, m, c); a5 = fma(a5, m, c); a6 = fma(a6, m, c); a7 = fma(a7, m, c);
  }
  out[gid.x] = a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7;
}

@compute @workgroup_size(64)
fn probe_load_lane(@builtin(global_invocation_id) gid: vec3<u32>) {
  var s = vec4<f32>();
  for (var i = 0u; i < p.iters; i++) { s += src[(gid.x + i * 64u) % p.n4]; }
  out[gid.x] = s;
}

@compute @workgroup_size(64)
fn probe_load_wg(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
  var s = vec4<f32>();
  for (var i = 0u; i < p.iters; i++) { s += src[(wid.x + i * 64u) % p.n4]; }
  out[gid.x] = s;
}

var<workgroup> tile: array<vec4<f32>, 1024>;

// vec4 loads from workgroup memory (filled once, one barrier), address per lane
@compute @workgroup_size(64)
fn probe_load_shared(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  for (var j = lid; j < 1024u; j += 64u) { tile[j] = src[j]; }
  workgroupBarrier();
  var s = vec4<f32>();
  for (var i = 0u; i < p.iters; i++) { s += tile[(lid + i * 7u) & 1023u]; }
  out[gid.x] = s;
}
//#if sg

@compute @workgroup_size(8)
fn probe_broadcast(@builtin(global_invocation_id) gid: vec3<u32>) {
  var a0 = vec4<f32>(f32(gid.x)); var a1 = a0 + 1.0; var a2 = a0 + 2.0; var a3 = a0 + 3.0;
  var a4 = a0 + 4.0; var a5 = a0 + 5.0; var a6 = a0 + 6.0; var a7 = a0 + 7.0;
  let m = vec4<f32>(0.999);
  let c = vec4<f32>(0.001);
  var s = vec4<f32>();
  for (var i = 0u; i < p.iters; i++) {
    a0 = fma(a0, m, c); a1 = fma(a1, m, c); a2 = fma(a2, m, c); a3 = fma(a3, m, c);
    a4 = fma(a4, m, c); a5 = fma(a5, m, c); a6 = fma(a6, m, c); a7 = fma(a7, m, c);
    s += subgroupBroadcast(a0, 0u) + subgroupBroadcast(a1, 1u) + subgroupBroadcast(a2, 2u) + subgroupBroadcast(a3, 3u)
       + subgroupBroadcast(a4, 4u) + subgroupBroadcast(a5, 5u) + subgroupBroadcast(a6, 6u) + subgroupBroadcast(a7, 7u);
  }
  out[gid.x] = s;
}
//#endif
