//#if f16
enable f16;
//#endif
// float32 <-> the stored half types: bf16 (two values to a u32; common.wgsl's bf16_* helpers) and,
// in the f16 section (adapters with shader-f16), WGSL's own f16 (two to a 4-byte word, element 2i
// in the low half).
//   cast_bf16        out[i] = bf16(x[2i]) | bf16(x[2i+1]) << 16, round to nearest even
//   cast_f32         out[i] = the float32 value of bf16 element i of x
//   cast_bf16x8      the same casts eight values an invocation: two vec4 of float32 against one
//   cast_f32x8       vec4<u32> of bf16, for n a multiple of 8 (the launcher takes the scalar ones
//                    otherwise). Why: the casts are a bf16 model's conversion passes, and lavapipe
//                    pays per load instruction whatever its width.
//   cast_f16         outh[i] = f16(x[i]), round to nearest even, +-inf past f16's range
//                    (common.wgsl's to_f16)
//   cast_f16_to_f32  outf[i] = f32(xh[i]), exact
// The optimizer keeps float32 master weights and writes the half copy the next step's matmuls
// read with cast_bf16 or cast_f16; cast_f32 is bf16's way back (tests, and tensors read on the
// host), cast_f16_to_f32 fills the float32 copies the attention kernels read.

struct Params { n: u32 }   // elements (an odd count: the last word's high half is 0)

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> xf: array<f32>;
@group(0) @binding(2) var<storage, read> xh: array<u32>;
@group(0) @binding(3) var<storage, read_write> outh: array<u32>;
@group(0) @binding(4) var<storage, read_write> outf: array<f32>;
// the same bindings, 8 values at a time
@group(0) @binding(1) var<storage, read> xf8: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> xh8: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read_write> outh8: array<vec4<u32>>;
@group(0) @binding(4) var<storage, read_write> outf8: array<vec4<f32>>;

@compute @workgroup_size(64)
fn cast_bf16(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
             @builtin(local_invocation_id) lid: vec3<u32>) {
  let i = lin(wid, nwg, lid);
  if (2u * i >= p.n) { return; }
  var hi = 0.0;
  if (2u * i + 1u < p.n) { hi = xf[2u * i + 1u]; }
  outh[i] = bf16_pack(xf[2u * i], hi);
}

@compute @workgroup_size(64)
fn cast_f32(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
            @builtin(local_invocation_id) lid: vec3<u32>) {
  let i = lin(wid, nwg, lid);
  if (i >= p.n) { return; }
  let w = xh[i / 2u];
  outf[i] = bitcast<f32>(select(w << 16u, w & 0xffff0000u, (i & 1u) == 1u));
}

@compute @workgroup_size(64)
fn cast_bf16x8(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_id) lid: vec3<u32>) {
  let i = lin(wid, nwg, lid);
  if (i >= p.n / 8u) { return; }
  let a = xf8[2u * i];
  let b = xf8[2u * i + 1u];
  outh8[i] = vec4<u32>(bf16_pack(a.x, a.y), bf16_pack(a.z, a.w), bf16_pack(b.x, b.y), bf16_pack(b.z, b.w));
}

@compute @workgroup_size(64)
fn cast_f32x8(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
              @builtin(local_invocation_id) lid: vec3<u32>) {
  let i = lin(wid, nwg, lid);
  if (i >= p.n / 8u) { return; }
  let w = xh8[i];
  outf8[2u * i] = bf16_lo4(w.xy);
  outf8[2u * i + 1u] = bf16_lo4(w.zw);
}
//#if f16

@group(0) @binding(2) var<storage, read> xh16: array<f16>;
@group(0) @binding(3) var<storage, read_write> outh16: array<f16>;

@compute @workgroup_size(64)
fn cast_f16(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
            @builtin(local_invocation_id) lid: vec3<u32>) {
  let i = lin(wid, nwg, lid);
  if (i >= p.n + (p.n & 1u)) { return; }
  outh16[i] = select(f16(0.0), to_f16(xf[min(i, p.n - 1u)]), i < p.n);
}

@compute @workgroup_size(64)
fn cast_f16_to_f32(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                   @builtin(local_invocation_id) lid: vec3<u32>) {
  let i = lin(wid, nwg, lid);
  if (i >= p.n) { return; }
  outf[i] = f32(xh16[i]);
}
//#endif
