enable f16;
// GELU with its pre-activation stored as f16:
//   gelu_forward_f16   out = f16(gelu(x)), x f16
//   gelu_backward_f16  out = dy * gelu'(x), x f16, dy and out float32
// Arithmetic in float32, as elementwise4.wgsl's (erf's polynomial would lose its accuracy in
// f16); what f16 saves here is bytes. n: a multiple of 4; 16 values per invocation.

struct Params { n: u32, cols: u32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> xh: array<vec4<f16>>;
@group(0) @binding(2) var<storage, read> dy: array<vec4<f32>>;          // backward: d(out) | unused
@group(0) @binding(3) var<storage, read_write> outh: array<vec4<f16>>;  // forward: gelu(x) | unused
@group(0) @binding(4) var<storage, read_write> outf: array<vec4<f32>>;  // backward: d(x) | unused

const PER: u32 = 4u;   // vec4 per invocation

override TANH: bool = false;   // GPT-2's tanh form of GELU (gelu4, gelu_grad4: common.wgsl)

fn quad(wid: vec3<u32>, nwg: vec3<u32>, lid: vec3<u32>, j: u32) -> u32 {   // 64 apart: a workgroup covers a block
  return group_index(wid, nwg) * 64u * PER + lid.x + 64u * j;
}

@compute @workgroup_size(64)
fn gelu_forward_f16(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                    @builtin(local_invocation_id) lid: vec3<u32>) {
  for (var j = 0u; j < PER; j++) {
    let q = quad(wid, nwg, lid, j);
    if (q < p.n / 4u) {
      let x = vec4<f32>(xh[q]);
      outh[q] = to_f16x4(gelu4(x, TANH));
    }
  }
}

@compute @workgroup_size(64)
fn gelu_backward_f16(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                     @builtin(local_invocation_id) lid: vec3<u32>) {
  for (var j = 0u; j < PER; j++) {
    let q = quad(wid, nwg, lid, j);
    if (q < p.n / 4u) { outf[q] = dy[q] * gelu_grad4(vec4<f32>(xh[q]), TANH); }
  }
}
