// Token + position embedding and its two gradients, deterministic (no atomics).
//   embed_forward   out[b,t,:] = tok[tokens[b,t], :] + pos[t, :]
//   embed_tok_grad  dtok[v,:] (+)= sum of dout[i,:] over positions i holding token v
//   embed_pos_grad  dpos[t,:] = sum_b dout[b,t,:]
// A token table larger than one binding (GPT-2's 50257 x 768 floats against lavapipe's
// 134 MB) is bound n rows at a time from row v0: embed_forward then writes only the
// positions whose token lies in those rows (every position belongs to exactly one chunk),
// embed_tok_grad sums the rows v0 .. v0+n-1. The whole table is v0 = 0, n = V.
// The token gradient reads a bucket index built on the host with the batch
// (positions sorted by token, offsets[v]..offsets[v+1]), so each (v, c) sums
// its own positions in a fixed order: O(BT*C + V*C) work.
// A model whose positions are rotary (RoPE turns q and k instead) has no table: LEARNED = false,
// and embed_forward writes the token's row alone.
//
// The tied head's block copy, for a token table split over bindings:
//   copy_block   out[r, oc + c] = src[r, sc + c]   for r < rows, c < cols
// Where tok_emb exceeds one binding, the logits of one chunk of its rows are a column block
// of the [rows, VP] logits. The matmul kernels read and write whole rows, so the head
// computes a block into a dense scratch and copies it into place (forward), or copies the
// block of dlogits out before the two products that need it (backward). One invocation per
// element; src_stride and out_stride are the floats between rows. Its bindings are its own
// (bp, block_src, block_out).

struct Params { B: u32, T: u32, C: u32, V: u32, accumulate: u32, v0: u32, n: u32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> idx: array<u32>;    // tokens [B*T] | offsets [V+1] then positions [B*T]
@group(0) @binding(2) var<storage, read> src: array<f32>;    // tok rows v0.. [n,C] (forward) | dout [B*T, C]
@group(0) @binding(3) var<storage, read> src2: array<f32>;   // pos [ctx,C] (forward) | unused
@group(0) @binding(4) var<storage, read_write> out: array<f32>;

override LEARNED: bool = true;     // a learned position table is added (bound at src2)

// Row r's position: r % T; in packed windows (DOCS) several records share a window and each
// one's positions restart at 0: docs holds each row's position in its record.
//#if DOCS
@group(0) @binding(5) var<storage, read> docs: array<u32>;    // [B*T]
fn position(row: u32) -> u32 { return docs[row]; }
//#else
fn position(row: u32) -> u32 { return row % p.T; }
//#endif

@compute @workgroup_size(64)
fn embed_forward(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                 @builtin(local_invocation_id) lid: vec3<u32>) {
  let i = lin(wid, nwg, lid);
  if (i >= p.B * p.T * p.C) { return; }
  let row = i / p.C;
  let ch = i % p.C;
  let t = position(row);
  let v = idx[row];
  if (v < p.v0 || v - p.v0 >= p.n) { return; }      // another chunk's token
  var x = src[(v - p.v0) * p.C + ch];
  if (LEARNED) { x += src2[t * p.C + ch]; }
  out[i] = x;
}

@compute @workgroup_size(64)
fn embed_tok_grad(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                  @builtin(local_invocation_id) lid: vec3<u32>) {
  let i = lin(wid, nwg, lid);
  if (i >= p.n * p.C) { return; }                    // out holds rows v0 .. v0+n-1
  let v = p.v0 + i / p.C;
  let ch = i % p.C;
  var s = 0.0;
  for (var j = idx[v]; j < idx[v + 1u]; j++) {
    s += src[idx[p.V + 1u + j] * p.C + ch];
  }
  if (p.accumulate != 0u) { s += out[i]; }
  out[i] = s;
}

@compute @workgroup_size(64)
fn embed_pos_grad(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                  @builtin(local_invocation_id) lid: vec3<u32>) {
  let i = lin(wid, nwg, lid);
  if (i >= p.T * p.C) { return; }
  var s = 0.0;
  for (var b = 0u; b < p.B; b++) { s += src[b * p.T * p.C + i]; }
  out[i] = s;
}

struct BlockParams { rows: u32, cols: u32, src_stride: u32, src_col: u32, out_stride: u32, out_col: u32 }

@group(0) @binding(0) var<uniform> bp: BlockParams;
@group(0) @binding(1) var<storage, read> block_src: array<f32>;
@group(0) @binding(2) var<storage, read_write> block_out: array<f32>;

@compute @workgroup_size(64)
fn copy_block(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
              @builtin(local_invocation_id) lid: vec3<u32>) {
  let i = lin(wid, nwg, lid);
  if (i >= bp.rows * bp.cols) { return; }
  let r = i / bp.cols;
  let c = i % bp.cols;
  block_out[r * bp.out_stride + bp.out_col + c] = block_src[r * bp.src_stride + bp.src_col + c];
}
