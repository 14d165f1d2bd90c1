enable f16;
// float32 <-> f16 storage: WGSL's own half type, two to a 4-byte word (element 2i in the low half).
//   cast_f16          outh[i] = f16(x[i]), round to nearest even, +-inf past
//                     f16's range (common_f16.wgsl's to_f16)
//   cast_f16_to_f32   outf[i] = f32(xh[i]), exact
// The optimizer keeps float32 master weights and writes the f16 copy the next step's matmuls
// read with cast_f16; cast_f16_to_f32 fills the float32 copies the attention kernels read.

struct Params { n: u32 }   // elements (cast_f16 of an odd count: the last word's high half is 0)

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> xf: array<f32>;
@group(0) @binding(2) var<storage, read> xh: array<f16>;
@group(0) @binding(3) var<storage, read_write> outh: array<f16>;
@group(0) @binding(4) var<storage, read_write> outf: array<f32>;

@compute @workgroup_size(64)
fn cast_f16(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
            @builtin(local_invocation_id) lid: vec3<u32>) {
  let i = lin(wid, nwg, lid);
  if (i >= p.n + (p.n & 1u)) { return; }
  outh[i] = select(f16(0.0), to_f16(xf[min(i, p.n - 1u)]), i < p.n);
}

@compute @workgroup_size(64)
fn cast_f16_to_f32(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                   @builtin(local_invocation_id) lid: vec3<u32>) {
  let i = lin(wid, nwg, lid);
  if (i >= p.n) { return; }
  outf[i] = f32(xh[i]);
}
