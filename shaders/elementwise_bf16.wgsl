// GELU with its pre-activation stored as bf16 (two to a u32, common.wgsl's bf16_* helpers):
//   gelu_forward_bf16   out = bf16(gelu(x)), x bf16                    (8 values per word pair)
//   gelu_backward_bf16  out = dy * gelu'(x), x bf16, dy and out float32
// Arithmetic in float32, as elementwise4.wgsl's. Why: these kernels are bound by loads on
// lavapipe (the elementwise kernels run near the streaming peak: docs/results.md), and a vec4<u32> load
// brings 8 bf16 where a vec4<f32> brings 4. n: a multiple of 8; 16 values per invocation.

struct Params { n: u32, cols: u32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> xh: array<vec4<u32>>;     // x, 8 bf16 a word
@group(0) @binding(2) var<storage, read> dy: array<vec4<f32>>;     // backward: d(out) | unused
@group(0) @binding(3) var<storage, read_write> outh: array<vec4<u32>>;  // forward: gelu(x) as bf16 | unused
@group(0) @binding(4) var<storage, read_write> outf: array<vec4<f32>>;  // backward: d(x) | unused

const PER: u32 = 2u;   // words (8 values each) per invocation

override TANH: bool = false;   // GPT-2's tanh form of GELU (gelu4, gelu_grad4: common.wgsl)

fn pack8(a: vec4<f32>, b: vec4<f32>) -> vec4<u32> {
  return vec4<u32>(bf16_pack(a.x, a.y), bf16_pack(a.z, a.w), bf16_pack(b.x, b.y), bf16_pack(b.z, b.w));
}

fn word(wid: vec3<u32>, nwg: vec3<u32>, lid: vec3<u32>, j: u32) -> u32 {   // 64 apart: a workgroup covers a block
  return group_index(wid, nwg) * 64u * PER + lid.x + 64u * j;
}

struct X8 { a: vec4<f32>, b: vec4<f32> }      // the 8 values of word w of x: 0-3 and 4-7

fn x8(w: u32) -> X8 {
  let v = xh[w];
  return X8(bf16_lo4(v.xy), bf16_lo4(v.zw));
}

@compute @workgroup_size(64)
fn gelu_forward_bf16(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                     @builtin(local_invocation_id) lid: vec3<u32>) {
  for (var j = 0u; j < PER; j++) {
    let w = word(wid, nwg, lid, j);
    if (w < p.n / 8u) {
      let x = x8(w);
      outh[w] = pack8(gelu4(x.a, TANH), gelu4(x.b, TANH));
    }
  }
}

@compute @workgroup_size(64)
fn gelu_backward_bf16(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                      @builtin(local_invocation_id) lid: vec3<u32>) {
  for (var j = 0u; j < PER; j++) {
    let w = word(wid, nwg, lid, j);
    if (w < p.n / 8u) {
      let x = x8(w);
      outf[2u * w] = dy[2u * w] * gelu_grad4(x.a, TANH);
      outf[2u * w + 1u] = dy[2u * w + 1u] * gelu_grad4(x.b, TANH);
    }
  }
}
