// Helpers every shader may use, written once: device/gpu.py's loader puts this file in
// front of each shader's declarations (after its `enable` directives), and compile
// errors still name the right file and line. Functions, and the workgroup arrays of the
// reductions below; no bindings here.

// The workgroup's linear index in a 1-D grid that the host folded into (x, y)
// because one dimension holds at most 65,535 workgroups (gpu.grid1d).
fn group_index(wid: vec3<u32>, nwg: vec3<u32>) -> u32 {
  return wid.y * nwg.x + wid.x;
}

// The invocation's linear index in such a grid of 64-lane workgroups.
fn lin(wid: vec3<u32>, nwg: vec3<u32>, lid: vec3<u32>) -> u32 {
  return group_index(wid, nwg) * 64u + lid.x;
}

// RoPE's turn of four channels of a pair's halves: x1 in a head's first half, x2 the same channels
// of its second, each channel by its (cos, sin) e0..e3, as rope.wgsl turns: the turned matmuls'
// (matmul_vec4.wgsl, matmul_tiled.wgsl) store.
struct Turned { x1: vec4<f32>, x2: vec4<f32> }

fn turn4(x1: vec4<f32>, x2: vec4<f32>, e0: vec2<f32>, e1: vec2<f32>, e2: vec2<f32>, e3: vec2<f32>) -> Turned {
  let co = vec4<f32>(e0.x, e1.x, e2.x, e3.x);
  let si = vec4<f32>(e0.y, e1.y, e2.y, e3.y);
  return Turned(x1 * co - x2 * si, x2 * co + x1 * si);
}

// erf with |error| < 1.5e-7 (Abramowitz & Stegun 7.1.26): WGSL has no erf.
fn erf4(v: vec4<f32>) -> vec4<f32> {
  let a = abs(v);
  let t = 1.0 / (1.0 + 0.3275911 * a);
  let poly = ((((1.061405429 * t - 1.453152027) * t + 1.421413741) * t - 0.284496736) * t + 0.254829592) * t;
  return sign(v) * (1.0 - poly * exp(-a * a));
}

fn erf_approx(v: f32) -> f32 {
  return erf4(vec4<f32>(v)).x;
}

// GELU and its derivative on 4 lanes, in float32, in the two forms a checkpoint may name: the exact
// x Phi(x) (activation "gelu"), or GPT-2's tanh approximation 0.5 x (1 + tanh(u)),
// u = sqrt(2/pi) (x + 0.044715 x^3) (activation "gelu_tanh": Hugging Face's gelu_new, PyTorch's
// approximate="tanh"). The tanh form is computed as x sigmoid(2u), the same
// function: 1 + tanh(u) cancels where u is very negative (x = -5.3 gave 0, not -1.6e-7), the
// sigmoid does not. u is clamped to +-40 (exp(80) is finite in float32), so x^3 overflowing gives
// 0 or x, not an implementation's exp(inf).
fn cdf4(v: vec4<f32>) -> vec4<f32> { return 0.5 * (1.0 + erf4(v * 0.70710678118654752)); }  // Phi(v)

fn tanh_arg4(v: vec4<f32>) -> vec4<f32> {     // u, clamped
  return clamp(0.7978845608028654 * (v + 0.044715 * v * v * v), vec4<f32>(-40.0), vec4<f32>(40.0));
}

// Each form is a function of its own, not one with a bool: the exact forward taking the form as a
// literal argument ran slower on lavapipe than with the form fixed (docs/results.md, "The house").
fn gelu4(v: vec4<f32>) -> vec4<f32> { return v * cdf4(v); }

fn gelu_tanh4(v: vec4<f32>) -> vec4<f32> { return v / (1.0 + exp(-2.0 * tanh_arg4(v))); }

// d/dx x s(x), s = sigmoid(2u): s + 2 x u' s (1 - s), with s (1 - s) as (s e) s, e = exp(-2u): no
// cancellation, and nothing past float32's range.
fn gelu_tanh_grad4(v: vec4<f32>) -> vec4<f32> {
  let e = exp(-2.0 * tanh_arg4(v));
  let s = 1.0 / (1.0 + e);
  return s + 2.0 * v * 0.7978845608028654 * (1.0 + 0.134145 * v * v) * (s * e) * s;
}

fn gelu_grad4(v: vec4<f32>) -> vec4<f32> { return cdf4(v) + v * 0.3989422804014327 * exp(-0.5 * v * v); }

// Tree reductions across a 64- or 256-lane workgroup; every lane gets the result, so call them
// from uniform control flow (they hold barriers). WGSL passes no pointer to workgroup memory into
// a function, so each works in an array of its own, declared here once; an entry point that
// calls none of them allocates none of it. The sum order is fixed: results are reproducible.
var<workgroup> wg64: array<f32, 64>;
var<workgroup> wg256: array<f32, 256>;

// op: the sum (false) or the max (true) of the 64 or 256 lanes' values, by a fixed tree
fn combine(a: f32, b: f32, is_max: bool) -> f32 { return select(a + b, max(a, b), is_max); }

fn wg_reduce64(lid: u32, v: f32, is_max: bool) -> f32 {
  wg64[lid] = v;
  workgroupBarrier();
  for (var s = 32u; s > 0u; s >>= 1u) {
    if (lid < s) { wg64[lid] = combine(wg64[lid], wg64[lid + s], is_max); }
    workgroupBarrier();
  }
  let r = wg64[0];
  workgroupBarrier();
  return r;
}

fn wg_reduce256(lid: u32, v: f32, is_max: bool) -> f32 {
  wg256[lid] = v;
  workgroupBarrier();
  for (var s = 128u; s > 0u; s >>= 1u) {
    if (lid < s) { wg256[lid] = combine(wg256[lid], wg256[lid + s], is_max); }
    workgroupBarrier();
  }
  let r = wg256[0];
  workgroupBarrier();
  return r;
}

fn wg_sum64(lid: u32, v: f32) -> f32 { return wg_reduce64(lid, v, false); }
fn wg_max64(lid: u32, v: f32) -> f32 { return wg_reduce64(lid, v, true); }
fn wg_sum256(lid: u32, v: f32) -> f32 { return wg_reduce256(lid, v, false); }
fn wg_max256(lid: u32, v: f32) -> f32 { return wg_reduce256(lid, v, true); }

// bf16: the top 16 bits of a float32, two to a u32 (element 2i in the low half, 2i+1 in the high
// half). Unpacking is a shift or a mask; no extension is needed. Packing rounds to nearest even
// (NaN stays NaN: a quiet NaN's top bits survive the rounding).
fn bf16_lo4(w: vec2<u32>) -> vec4<f32> {     // 4 values from 2 words
  return bitcast<vec4<f32>>(vec4<u32>(w.x << 16u, w.x & 0xffff0000u, w.y << 16u, w.y & 0xffff0000u));
}

fn bf16_round(x: f32) -> u32 {               // the bf16 nearest x (ties to even), in the low 16 bits
  let b = bitcast<u32>(x);
  if ((b & 0x7f800000u) == 0x7f800000u && (b & 0x007fffffu) != 0u) { return (b >> 16u) | 0x40u; }  // NaN
  return (b + 0x7fffu + ((b >> 16u) & 1u)) >> 16u;
}

fn bf16_pack(a: f32, b: f32) -> u32 {
  return bf16_round(a) | (bf16_round(b) << 16u);
}

//#if f16
// The f16 helpers: kept (the loader's f16 section) for the shaders that `enable f16;` only, since
// the type f16 is unknown to the others.
// float32 -> f16, round to nearest even, and +-inf past f16's range (NaN stays NaN). WGSL leaves
// an out-of-range conversion's result to the implementation; a loss scaler must see the overflow
// (core.precision), so the infinity is made here: 65504 * 2 in f16 arithmetic.
fn to_f16(x: f32) -> f16 {
  if (abs(x) >= 65520.0) { return select(f16(-65504.0), f16(65504.0), x > 0.0) * f16(2.0); }
  return f16(x);
}

fn to_f16x4(v: vec4<f32>) -> vec4<f16> {
  return vec4<f16>(to_f16(v.x), to_f16(v.y), to_f16(v.z), to_f16(v.w));
}
//#endif

//#if sg
// The subgroup helpers: kept (the loader's sg section) for the shaders that `enable subgroups;`.

// rows 4q..4q+3 of a 16-row block as the columns of a mat4x4, from the 8 lanes that loaded them:
// lane l holds rows l (x0) and 8+l (x1), 4 k of each, as float32 (the subgroup matmuls,
// matmul_vec4.wgsl's and matmul_words.wgsl's)
fn rows_of(x0: vec4<f32>, x1: vec4<f32>, q: u32) -> mat4x4<f32> {
  switch q {
    case 0u: { return mat4x4<f32>(subgroupBroadcast(x0, 0u), subgroupBroadcast(x0, 1u), subgroupBroadcast(x0, 2u), subgroupBroadcast(x0, 3u)); }
    case 1u: { return mat4x4<f32>(subgroupBroadcast(x0, 4u), subgroupBroadcast(x0, 5u), subgroupBroadcast(x0, 6u), subgroupBroadcast(x0, 7u)); }
    case 2u: { return mat4x4<f32>(subgroupBroadcast(x1, 0u), subgroupBroadcast(x1, 1u), subgroupBroadcast(x1, 2u), subgroupBroadcast(x1, 3u)); }
    default: { return mat4x4<f32>(subgroupBroadcast(x1, 4u), subgroupBroadcast(x1, 5u), subgroupBroadcast(x1, 6u), subgroupBroadcast(x1, 7u)); }
  }
}
//#endif
