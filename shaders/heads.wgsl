// Grouped-query attention's two moves of keys and values between their heads (Ainslie et al. 2023;
// transformers' repeat_kv): G = H / KV query heads share each of the KV key/value heads, query head
// h reading kv head h / G (a kv head's G query heads are neighbours).
//   kv_expand   dst [rows, H * hd] <- src [rows, KV * hd]: each kv head's channels copied to its G
//               query heads. Bound as words, so that one kernel moves every stored dtype: float32,
//               or bf16 | f16 two to a word (w = hd / 2 words a head), bit for bit
//   kv_reduce   dstf [rows, KV * hd] = the sum over each kv head's G query heads of srcf
//               [rows, H * hd], in the heads' order: kv_expand's gradient, float32
// One invocation per word (expand) or float (reduce) written: deterministic, no atomics.

struct Params { rows: u32, H: u32, KV: u32, w: u32 }    // w: words (expand) or floats (reduce) a head

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> src: array<u32>;
@group(0) @binding(2) var<storage, read_write> dst: array<u32>;
@group(0) @binding(1) var<storage, read> srcf: array<f32>;
@group(0) @binding(2) var<storage, read_write> dstf: array<f32>;

@compute @workgroup_size(64)
fn kv_expand(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
             @builtin(local_invocation_id) lid: vec3<u32>) {
  let i = lin(wid, nwg, lid);
  let per_row = p.H * p.w;
  if (i >= p.rows * per_row) { return; }
  let r = i / per_row;
  let h = (i % per_row) / p.w;
  dst[i] = src[(r * p.KV + h / (p.H / p.KV)) * p.w + i % p.w];
}

@compute @workgroup_size(64)
fn kv_reduce(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
             @builtin(local_invocation_id) lid: vec3<u32>) {
  let i = lin(wid, nwg, lid);
  let per_row = p.KV * p.w;
  if (i >= p.rows * per_row) { return; }
  let r = i / per_row;
  let kv = (i % per_row) / p.w;
  let G = p.H / p.KV;
  var s = 0.0;
  for (var g = 0u; g < G; g++) { s += srcf[(r * p.H + kv * G + g) * p.w + i % p.w]; }
  dstf[i] = s;
}
