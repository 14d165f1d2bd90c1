// bf16.wgsl's casts eight values per invocation: two vec4 of float32 against one vec4<u32> of
// bf16, for n a multiple of 8 (device/kernels.py takes bf16.wgsl otherwise). Why: the casts are a bf16
// model's conversion passes, and lavapipe pays per load instruction whatever its width.
//   cast_bf16x8   out[i] = the 8 values 8i .. 8i+7 of x as bf16 (round to nearest even)
//   cast_f32x8    out[2i], out[2i+1] = the 8 bf16 of word group i of x as float32

struct Params { n: u32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> xf: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> xh: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read_write> outh: array<vec4<u32>>;
@group(0) @binding(4) var<storage, read_write> outf: array<vec4<f32>>;

@compute @workgroup_size(64)
fn cast_bf16x8(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_id) lid: vec3<u32>) {
  let i = lin(wid, nwg, lid);
  if (i >= p.n / 8u) { return; }
  let a = xf[2u * i];
  let b = xf[2u * i + 1u];
  outh[i] = vec4<u32>(bf16_pack(a.x, a.y), bf16_pack(a.z, a.w), bf16_pack(b.x, b.y), bf16_pack(b.z, b.w));
}

@compute @workgroup_size(64)
fn cast_f32x8(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
              @builtin(local_invocation_id) lid: vec3<u32>) {
  let i = lin(wid, nwg, lid);
  if (i >= p.n / 8u) { return; }
  let w = xh[i];
  outf[2u * i] = bf16_lo4(w.xy);
  outf[2u * i + 1u] = bf16_lo4(w.zw);
}
