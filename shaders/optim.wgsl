// The frame of every elementwise optimizer over the flat parameter buffer: the bindings, the
// gate's slots and `element`, which finds an invocation's parameters, its gradient (multiplied
// by the gate's factor: the clip, and the loss scale undone), its block's decay and the updates
// taken, and the entry point that calls `update` on it. Each optimizer's own arithmetic is its
// `update(i, grad, wd, t)`, which its room writes (tinygpt/model/optimizers/: adamw.py's
// ADAMW_WGSL, ...), one source for both widths; the entry point takes the optimizer's name
// ({{NAME}}, so that its twin and its profile rows are named as it is). The launcher
// (Kernels.elementwise_optimizer) puts in front of the update the element type and how many
// invocations share a 256-float block:
//   alias V = f32;       const W = 1u; const WG = 256u;     one float an invocation
//   alias V = vec4<f32>; const W = 4u; const WG = 64u;      a vec4 (the flat buffers hold
//                                                           whole blocks: n is a multiple of 4)
// Why vec4: lavapipe pays per lane for every load instruction whatever its width; AdamW touches
// five floats and writes three per parameter (docs/results.md, "Kernels").
//
// Each reads the gate that grad_norm.wgsl's grad_clip wrote (kernels.GATE): a step it skips
// changes nothing, and bias corrections count the steps it took, so no optimizer knows whether
// a loss scaler or a clip is there. The decay table holds one value per 256-float block
// (tensors start on 256-float boundaries, so a block never straddles two tensors and padding
// stays zero); a negative value marks a block another optimizer updates (Muon's matrices),
// which this one leaves alone. first: this chunk's first block in the table, bound whole (a
// chunk need not start where the device's offset alignment allows a view of it). k0..k2: the
// optimizer's constants, which its room names (AdamW's beta1, beta2, eps).
struct Params { n: u32, lr: f32, k0: f32, k1: f32, k2: f32, first: u32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> g: array<V>;             // grads [n]
@group(0) @binding(2) var<storage, read> wd_table: array<f32>;    // decay per 256-float block
@group(0) @binding(3) var<storage, read> gate: array<f32>;        // grad_clip's
@group(0) @binding(4) var<storage, read_write> w: array<V>;       // params
@group(0) @binding(5) var<storage, read_write> m: array<V>;       // the first state row
@group(0) @binding(6) var<storage, read_write> v: array<V>;       // the second (a dummy where none)

const FACTOR = 1u;  const SKIP = 3u;  const TAKEN = 6u;    // the gate's slots: kernels.GATE

struct Element { i: u32, grad: V, wd: f32, t: f32, ok: bool }

// ok false: past the end, another optimizer's block, or a skipped step (nothing to do)
fn element(wid: vec3<u32>, nwg: vec3<u32>, lid: vec3<u32>) -> Element {
  let blk = group_index(wid, nwg);
  let i = blk * WG + lid.x;
  let wd = wd_table[p.first + blk];
  if (i >= p.n / W || wd < 0.0 || gate[SKIP] != 0.0) { return Element(i, V(0.0), wd, 0.0, false); }
  return Element(i, g[i] * gate[FACTOR], wd, gate[TAKEN], true);
}

@compute @workgroup_size(WG)
fn {{NAME}}(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
            @builtin(local_invocation_id) lid: vec3<u32>) {
  let e = element(wid, nwg, lid);
  if (e.ok) { update(e.i, e.grad, e.wd, e.t); }
}
