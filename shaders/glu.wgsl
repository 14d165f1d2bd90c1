// The gated MLP's activation, SwiGLU (Shazeer 2020; Llama's, Qwen's): out = silu(gate) * up,
// silu(g) = g * sigmoid(g), gate and up being the MLP's two input projections.
//   swiglu_forward   out <- silu(gate) * up                     (gate, up, out as stored)
//   swiglu_backward  dgate <- dy * up * silu'(gate), dup <- dy * silu(gate)   (dy, dgate, dup float32)
// gate, up and out are bound as words: float32, or with BF16 | F16 16-bit values two to a word as
// a bf16 or f16 model stores them; arithmetic in float32, out rounded once. One invocation per
// two neighbouring elements (n even), so every word it writes is its own.

struct Params { n: u32 }

override BF16: bool = false;         // gate, up and out hold bf16
override F16: bool = false;          // ... f16

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> gate: array<u32>;
@group(0) @binding(2) var<storage, read> up: array<u32>;
@group(0) @binding(3) var<storage, read_write> out: array<u32>;       // forward: silu(gate) * up
@group(0) @binding(3) var<storage, read> dy: array<vec2<f32>>;        // backward: d(out)
@group(0) @binding(4) var<storage, read_write> dgate: array<vec2<f32>>;
@group(0) @binding(5) var<storage, read_write> dup: array<vec2<f32>>;

// word w of gate (t = 0) or up (t = 1)
fn word(t: u32, w: u32) -> u32 {
  if (t == 0u) { return gate[w]; }
  return up[w];
}

// elements 2i and 2i + 1 of gate (t = 0) or up (t = 1), as float32
fn pair(t: u32, i: u32) -> vec2<f32> {
  if (F16) { return unpack2x16float(word(t, i)); }
  if (BF16) { let w = word(t, i); return bitcast<vec2<f32>>(vec2<u32>(w << 16u, w & 0xffff0000u)); }
  return bitcast<vec2<f32>>(vec2<u32>(word(t, 2u * i), word(t, 2u * i + 1u)));
}

fn sigmoid(v: vec2<f32>) -> vec2<f32> { return 1.0 / (1.0 + exp(-v)); }

@compute @workgroup_size(64)
fn swiglu_forward(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                  @builtin(local_invocation_id) lid: vec3<u32>) {
  let i = lin(wid, nwg, lid);
  if (i >= p.n / 2u) { return; }
  let g = pair(0u, i);
  let y = g * sigmoid(g) * pair(1u, i);
  if (F16) { out[i] = pack2x16float(y); return; }
  if (BF16) { out[i] = bf16_pack(y.x, y.y); return; }
  out[2u * i] = bitcast<u32>(y.x);
  out[2u * i + 1u] = bitcast<u32>(y.y);
}

@compute @workgroup_size(64)
fn swiglu_backward(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                   @builtin(local_invocation_id) lid: vec3<u32>) {
  let i = lin(wid, nwg, lid);
  if (i >= p.n / 2u) { return; }
  let g = pair(0u, i);
  let s = sigmoid(g);
  let d = dy[i];
  dgate[i] = d * pair(1u, i) * s * (1.0 + g * (1.0 - s));
  dup[i] = d * g * s;
}
