enable subgroups;
// probe.wgsl's companion for adapters with subgroups (scripts/probe_adapter.py):
//   probe_broadcast  8 vec4 FMA chains per lane, as probe_fma, and each chain's new value
//                    broadcast from lane k to the subgroup and summed: the cost of handing
//                    a value to the other lanes, against probe_load_* for loading it.
// One workgroup is one subgroup of 8 lanes (the sg kernels' shape).

struct Params { iters: u32, n4: u32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> src: array<vec4<f32>>;   // unused
@group(0) @binding(2) var<storage, read_write> out: array<vec4<f32>>;

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
