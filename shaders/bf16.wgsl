// float32 <-> bf16 storage (two values to a u32; common.wgsl's bf16_* helpers).
//   cast_bf16    out[i] = bf16(x[2i]) | bf16(x[2i+1]) << 16, round to nearest even
//   cast_f32     out[i] = the float32 value of bf16 element i of x
// The optimizer keeps float32 master weights and writes the bf16 copy the next step's matmuls
// read with cast_bf16; cast_f32 is the way back (tests, and tensors read on the host).

struct Params { n: u32 }   // elements (cast_bf16: an even count; the last word pads with zero)

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> xf: array<f32>;
@group(0) @binding(2) var<storage, read> xh: array<u32>;
@group(0) @binding(3) var<storage, read_write> outh: array<u32>;
@group(0) @binding(4) var<storage, read_write> outf: array<f32>;

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
