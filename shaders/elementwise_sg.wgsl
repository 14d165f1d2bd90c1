enable subgroups;
// elementwise.wgsl's bias_grad for adapters with subgroups, for cols a multiple of 4:
// one 8-lane subgroup per 4 columns; lane l sums rows l, l+8, ... as vec4 and
// subgroupAdd joins the 8 partial sums (a fixed order: the same inputs give the same bits).
// Why: bias_grad's one lane per column leaves 96 columns 96 lanes, each reading
// every row one float at a time; here 8x the lanes read a quarter of the loads.

struct Params { n: u32, cols: u32 }  // n = rows

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<vec4<f32>>;   // dy [rows, cols]
@group(0) @binding(2) var<storage, read> y: array<vec4<f32>>;   // unused
@group(0) @binding(3) var<storage, read_write> out: array<vec4<f32>>;  // [cols]

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
