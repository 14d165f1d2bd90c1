enable subgroups;
// layernorm.wgsl's layernorm_dgb for adapters with subgroups, for C a multiple of 4:
// one 8-lane subgroup per 4 channels; lane l sums rows l, l+8, ... as vec4 and
// subgroupAdd joins them (a fixed order: the same inputs give the same bits).
// Why: as elementwise_sg.wgsl's bias_grad, a quarter of the loads spread over
// 8x the lanes (one lane per channel left C = 96 to 96 lanes).
//   dg = sum_rows dy * xhat, db = sum_rows dy, xhat = (x - mean) * rstd

struct Params { rows: u32, C: u32, eps: f32, accumulate: u32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> a: array<vec4<f32>>;   // dy [rows, C]
@group(0) @binding(2) var<storage, read> b: array<vec4<f32>>;   // x [rows, C]
@group(0) @binding(3) var<storage, read> c: array<f32>;         // mean | rstd [2, rows]
@group(0) @binding(4) var<storage, read_write> o1: array<vec4<f32>>;  // dg | db [2, C]
@group(0) @binding(5) var<storage, read_write> o2: array<f32>;  // unused

const LANES: u32 = 8u;

@compute @workgroup_size(LANES)
fn layernorm_dgb_sg(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                    @builtin(subgroup_invocation_id) lane: u32) {
  let c4 = group_index(wid, nwg);
  let n4 = p.C / 4u;
  if (c4 >= n4) { return; }
  var dg = vec4<f32>();
  var db = vec4<f32>();
  for (var r = lane; r < p.rows; r += LANES) {
    let dy = a[r * n4 + c4];
    dg += dy * (b[r * n4 + c4] - c[r]) * c[p.rows + r];
    db += dy;
  }
  let tg = subgroupAdd(dg);
  let tb = subgroupAdd(db);
  if (lane == 0u) { o1[c4] = tg; o1[n4 + c4] = tb; }
}
