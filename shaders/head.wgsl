// The tied head's block copy, for a token table split over bindings.
//   copy_block   out[r, oc + c] = src[r, sc + c]   for r < rows, c < cols
// Where tok_emb exceeds one binding, the logits of one chunk of its rows are a column block
// of the [rows, VP] logits. The matmul kernels read and write whole rows, so the head
// computes a block into a dense scratch and copies it into place (forward), or copies the
// block of dlogits out before the two products that need it (backward). One invocation per
// element; src_stride and out_stride are the floats between rows.

struct Params { rows: u32, cols: u32, src_stride: u32, src_col: u32, out_stride: u32, out_col: u32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> src: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(64)
fn copy_block(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
              @builtin(local_invocation_id) lid: vec3<u32>) {
  let i = lin(wid, nwg, lid);
  if (i >= p.rows * p.cols) { return; }
  let r = i / p.cols;
  let c = i % p.cols;
  out[r * p.out_stride + p.out_col + c] = src[r * p.src_stride + p.src_col + c];
}
