//#if f16
enable f16;
//#endif
//#if sg
enable subgroups;
//#endif
// Elementwise ops, one source for every width and stored type:
//   add{{VEC}}            out = x + y  (the residual stream)
//   accumulate{{VEC}}     out += x: gradient accumulation adds each micro-batch's gradients in place
//   scale                 out = x * SCALE: LoRA's alpha / rank on the [rows, rank] products
//   bias_grad             out[c] = sum over rows of x[row, c]; n = rows
//   bias_grad_sg          bias_grad by subgroups
//   {{ACT}}_forward       out = act(x): the MLP's activation, x and out stored alike
//   {{ACT}}_backward      dx = dy * act'(x), x the pre-activation as stored, dy and dx float32
// 1-D grids are folded into (x, y) by the host, so the linear id is rebuilt from num_workgroups.
//
// The width is the launcher's (kernels.WIDTH_WGSL): V = f32 (one float an invocation) or
// vec4<f32> (W = 4: n a multiple of 4, 4 vec4 an invocation, 64 apart so that a workgroup covers
// one block). Why vec4: lavapipe pays per lane for each load instruction whatever its width, and
// a fixed cost per workgroup; one float per invocation paid both 16 times over (gelu_forward on
// 393,216 floats: see the commit that added the vec4 form).
//
// The activation's entry points are completed from outside, by two things: the activation's
// room (core/activations.py), whose WGSL defines act4 and act_grad4 over 4 float32 values and
// whose name is ACT; and the stored type's section below (f32, bf16, f16: kept by its tag), which
// says how a unit of x is read and of out written. The 16-bit types are read at the vec4 width
// and computed in float32 (erf's polynomial would lose its accuracy in f16): what they save is
// bytes, and a vec4<u32> load brings 8 bf16 where a vec4<f32> brings 4.
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

const PER: u32 = W;   // V per invocation: 1 float, or 4 vec4

const ADD: u32 = 0u;
const ACCUMULATE: u32 = 1u;

fn apply(op: u32, i: u32) -> V {
  let v = x[i];
  switch op {
    case ADD: { return v + y[i]; }
    default: { return out[i] + v; }
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
//#if act

// ---- the MLP's activation: UNITS units of UNIT values an invocation, 64 apart ------------------
@group(0) @binding(4) var<storage, read_write> dx: array<V>;     // backward: d(x), float32

fn each_unit(backward: bool, wid: vec3<u32>, nwg: vec3<u32>, lid: vec3<u32>) {
  let u0 = group_index(wid, nwg) * 64u * UNITS + lid.x;
  for (var j = 0u; j < UNITS; j++) {
    let q = u0 + 64u * j;
    if (q < p.n / UNIT) {
      if (backward) { backward_at(q); } else { forward_at(q); }
    }
  }
}

@compute @workgroup_size(64)
fn {{ACT}}_forward(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                   @builtin(local_invocation_id) lid: vec3<u32>) {
  each_unit(false, wid, nwg, lid);
}

@compute @workgroup_size(64)
fn {{ACT}}_backward(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                    @builtin(local_invocation_id) lid: vec3<u32>) {
  each_unit(true, wid, nwg, lid);
}
//#endif
//#if f32

// float32: a unit is one V (to4, from4: the width's, kernels.WIDTH_WGSL)
const UNIT: u32 = W;
const UNITS: u32 = PER;
fn forward_at(q: u32) { out[q] = from4(act4(to4(x[q]))); }
fn backward_at(q: u32) { dx[q] = y[q] * from4(act_grad4(to4(x[q]))); }
//#endif
//#if bf16

// bf16 (two to a u32, common.wgsl's bf16_* helpers): a unit is a vec4<u32> word of 8 values, dy and
// dx two vec4 each
@group(0) @binding(1) var<storage, read> xh: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read_write> outh: array<vec4<u32>>;
const UNIT: u32 = 8u;
const UNITS: u32 = 2u;

fn forward_at(w: u32) {
  let v = xh[w];
  let a = act4(bf16_lo4(v.xy));
  let b = act4(bf16_lo4(v.zw));
  outh[w] = vec4<u32>(bf16_pack(a.x, a.y), bf16_pack(a.z, a.w), bf16_pack(b.x, b.y), bf16_pack(b.z, b.w));
}

fn backward_at(w: u32) {
  let v = xh[w];
  dx[2u * w] = y[2u * w] * act_grad4(bf16_lo4(v.xy));
  dx[2u * w + 1u] = y[2u * w + 1u] * act_grad4(bf16_lo4(v.zw));
}
//#endif
//#if f16

// f16 (WGSL's): a unit is a vec4<f16>
@group(0) @binding(1) var<storage, read> xf16: array<vec4<f16>>;
@group(0) @binding(3) var<storage, read_write> outf16: array<vec4<f16>>;
const UNIT: u32 = 4u;
const UNITS: u32 = 4u;
fn forward_at(q: u32) { outf16[q] = to_f16x4(act4(vec4<f32>(xf16[q]))); }
fn backward_at(q: u32) { dx[q] = y[q] * act_grad4(vec4<f32>(xf16[q])); }
//#endif
