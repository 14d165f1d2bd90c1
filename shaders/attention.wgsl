// Attention from stored weights: the naive score-matrix path, TinyGPT's
// attn_fused_sv, and the backward both share.
// q, k, v, dout, out are [B, T, C] with heads interleaved in C (head h owns
// channels h*hd .. h*hd+hd-1). The score/weight buffers hold the heads
// h0 .. h0+nh-1 as [B, nh, T, T], so the host can split the heads into chunks
// when B*H*T*T floats would exceed one binding. Causal: t2 <= t1; with a sliding
// window W (WINDOW > 0) also t1 - t2 < W: each query sees its last W positions,
// itself included, and every loop runs over those alone.
//   attn_scores    S = q.k^T * scale, MASKED above the diagonal       (one invocation per score)
//   attn_softmax   P = softmax(S) in place, row by row                  (one per row)
//   attn_value     out = P @ v                                          (one per output element)
//   attn_fused_sv  scores, max, exp, sum, P and P @ v in one kernel    (one per row, any T)
//   attn_dscores   dS = P * (dO.v^T - rowsum(P * dO.v^T)) * scale     (one per row, any T)
//   attn_dq        dq = dS @ k,  attn_dk  dk = dS^T @ q,  attn_dvalue  dv = P^T @ dO

struct Params { B: u32, T: u32, C: u32, hd: u32, h0: u32, nh: u32, scale: f32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x1: array<f32>;
@group(0) @binding(2) var<storage, read> x2: array<f32>;
@group(0) @binding(3) var<storage, read> x3: array<f32>;
@group(0) @binding(4) var<storage, read_write> o1: array<f32>;
@group(0) @binding(5) var<storage, read_write> o2: array<f32>;

const MASKED: f32 = -0x1.fffffep+127f;
// The per-row kernels hold a head's channels as vec4 in blocks of 8 (HD4 =
// ceil(hd/32)*8, zero-padded): CPU adapters (llvmpipe) silently stop an
// invocation's loops after 65,535 iterations in total, and the compiler unrolls
// these constant-trip channel loops, so a row costs about T iterations, not T*hd.
override HD4: u32 = 16u;
override WINDOW: u32 = 0u;               // sliding window W; 0: none (every earlier position)

fn win() -> u32 { return select(p.T, min(WINDOW, p.T), WINDOW > 0u); }
// Packed windows (DOCS): several records in a window, each attending only within itself. docs
// holds each row's position in its record, so row t's record starts at t - docs[row].
//#if DOCS
@group(0) @binding(6) var<storage, read> docs: array<u32>;   // [B*T]
fn first(b: u32, t: u32) -> u32 { return t - min(docs[b * p.T + t], t); }
//#else
fn first(b: u32, t: u32) -> u32 { return 0u; }
//#endif
// the oldest key query t1 of window b sees
fn oldest(b: u32, t1: u32) -> u32 { return max(t1 + 1u - min(win(), t1 + 1u), first(b, t1)); }
fn seen(b: u32, t1: u32, t2: u32) -> bool { return t2 <= t1 && t1 - t2 < win() && t2 >= first(b, t1); }

// index of (b, hh, t1, t2) in a [B, nh, T, T] buffer
fn sidx(b: u32, hh: u32, t1: u32, t2: u32) -> u32 {
  return ((b * p.nh + hh) * p.T + t1) * p.T + t2;
}

// x[b, t, head channel d]
fn at(b: u32, t: u32, h: u32, d: u32) -> u32 {
  return (b * p.T + t) * p.C + h * p.hd + d;
}

// channels 4c .. 4c+3 of x1 / x2 / x3 at (b, t, h), zeros past hd
fn ld4(x: u32, b: u32, t: u32, h: u32, c: u32) -> vec4<f32> {
  var r = vec4<f32>();
  for (var e = 0u; e < 4u; e++) {
    let d = 4u * c + e;
    if (d < p.hd) {
      let i = at(b, t, h, d);
      switch x { case 1u: { r[e] = x1[i]; } case 2u: { r[e] = x2[i]; } default: { r[e] = x3[i]; } }
    }
  }
  return r;
}

// dot of a row held in registers with row t of x2, block by block
fn dot_row(a: ptr<function, array<vec4<f32>, 32>>, b: u32, t: u32, h: u32) -> f32 {
  var s = 0.0;
  for (var cb = 0u; cb < HD4; cb += 8u) {
    for (var e = 0u; e < 8u; e++) { s += dot((*a)[cb + e], ld4(2u, b, t, h, cb + e)); }
  }
  return s;
}

@compute @workgroup_size(64)
fn attn_scores(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_id) lid: vec3<u32>) {
  let i = lin(wid, nwg, lid);
  if (i >= p.B * p.nh * p.T * p.T) { return; }
  let t2 = i % p.T;
  let t1 = (i / p.T) % p.T;
  let hh = (i / (p.T * p.T)) % p.nh;
  let b = i / (p.T * p.T * p.nh);
  if (!seen(b, t1, t2)) { o1[i] = MASKED; return; }
  let h = p.h0 + hh;
  var s = 0.0;
  for (var d = 0u; d < p.hd; d++) { s += x1[at(b, t1, h, d)] * x2[at(b, t2, h, d)]; }
  o1[i] = s * p.scale;
}

@compute @workgroup_size(64)
fn attn_softmax(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                @builtin(local_invocation_id) lid: vec3<u32>) {
  let r = lin(wid, nwg, lid);                     // row (b, hh, t1)
  if (r >= p.B * p.nh * p.T) { return; }
  let t1 = r % p.T;
  let b = r / (p.T * p.nh);
  let base = r * p.T;
  let lo = oldest(b, t1);
  var m = MASKED;
  for (var t2 = lo; t2 <= t1; t2++) { m = max(m, o1[base + t2]); }
  var s = 0.0;
  for (var t2 = lo; t2 <= t1; t2++) { let e = exp(o1[base + t2] - m); o1[base + t2] = e; s += e; }
  let inv = 1.0 / s;
  for (var t2 = 0u; t2 < p.T; t2++) {
    if (seen(b, t1, t2)) { o1[base + t2] *= inv; } else { o1[base + t2] = 0.0; }
  }
}

// The four products with a stored [B, nh, T, T] matrix X, one invocation per output element
// (b, t, head channel) of the head chunk:
//   causal_rows: out[b, t1] = sum_{t2 seen by t1} X[t1, t2] y[b, t2]     attn_value (P, v), attn_dq (dS, k)
//   causal_cols: out[b, t2] = sum_{t1 that see t2} X[t1, t2] y[b, t1]    attn_dk (dS, q), attn_dvalue (P, dO)
fn causal_product(i: u32, cols: bool) {
  let w = p.nh * p.hd;
  if (i >= p.B * p.T * w) { return; }
  let cc = i % w;
  let t = (i / w) % p.T;
  let b = i / (w * p.T);
  let hh = cc / p.hd;
  let h = p.h0 + hh;
  let d = cc % p.hd;
  var s = 0.0;
  if (cols) {
    let end = min(p.T, t + win());
    for (var t1 = t; t1 < end; t1++) { s += x1[sidx(b, hh, t1, t)] * x2[at(b, t1, h, d)]; }
  } else {
    for (var t2 = oldest(b, t); t2 <= t; t2++) { s += x1[sidx(b, hh, t, t2)] * x2[at(b, t2, h, d)]; }
  }
  o1[at(b, t, h, d)] = s;
}

// x1 = P, x2 = v -> o1 = out
@compute @workgroup_size(64)
fn attn_value(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
              @builtin(local_invocation_id) lid: vec3<u32>) {
  causal_product(lin(wid, nwg, lid), false);
}

// TinyGPT's fused kernel: x1 = q, x2 = k, x3 = v -> o1 = out, o2 = P. The row's scores are
// parked in its own row of P, which they become: no private array caps T (the original's
// 1024-entry one did, and compiled slowly on llvmpipe), as in attn_dscores.
@compute @workgroup_size(64)
fn attn_fused_sv(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                 @builtin(local_invocation_id) lid: vec3<u32>) {
  let r = lin(wid, nwg, lid);             // row (b, hh, t1) of the [B, nh, T, T] buffers
  if (r >= p.B * p.nh * p.T) { return; }
  let t1 = r % p.T;
  let b = r / (p.T * p.nh);
  let h = p.h0 + (r / p.T) % p.nh;
  let base = r * p.T;
  var qr: array<vec4<f32>, 32>;
  for (var c = 0u; c < HD4; c++) { qr[c] = ld4(1u, b, t1, h, c); }
  let lo = oldest(b, t1);
  // pass 1: scores and their max
  var m = MASKED;
  for (var t2 = lo; t2 <= t1; t2++) {
    let s = dot_row(&qr, b, t2, h) * p.scale;
    o2[base + t2] = s;
    m = max(m, s);
  }
  // pass 2: exponentials, their sum, the weights
  var sum = 0.0;
  for (var t2 = lo; t2 <= t1; t2++) { let e = exp(o2[base + t2] - m); o2[base + t2] = e; sum += e; }
  let inv = 1.0 / sum;
  for (var t2 = 0u; t2 < p.T; t2++) {
    if (seen(b, t1, t2)) { o2[base + t2] *= inv; } else { o2[base + t2] = 0.0; }
  }
  // pass 3: P @ v, all channels at once in registers
  var acc: array<vec4<f32>, 32>;
  for (var t2 = lo; t2 <= t1; t2++) {
    let w = vec4<f32>(o2[base + t2]);
    for (var cb = 0u; cb < HD4; cb += 8u) {
      for (var e = 0u; e < 8u; e++) { acc[cb + e] = fma(w, ld4(3u, b, t2, h, cb + e), acc[cb + e]); }
    }
  }
  for (var d = 0u; d < p.hd; d++) { o1[at(b, t1, h, d)] = acc[d / 4u][d % 4u]; }
}

// x1 = dout, x2 = v, x3 = P -> o1 = dS. dP is parked in o1 on the first pass,
// so no private array limits T (the original's 256-entry one did).
@compute @workgroup_size(64)
fn attn_dscores(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                @builtin(local_invocation_id) lid: vec3<u32>) {
  let r = lin(wid, nwg, lid);             // row (b, hh, t1) of the [B, nh, T, T] buffers
  if (r >= p.B * p.nh * p.T) { return; }
  let t1 = r % p.T;
  let b = r / (p.T * p.nh);
  let h = p.h0 + (r / p.T) % p.nh;
  let base = r * p.T;
  var dor: array<vec4<f32>, 32>;
  for (var c = 0u; c < HD4; c++) { dor[c] = ld4(1u, b, t1, h, c); }
  var sum = 0.0;
  for (var t2 = oldest(b, t1); t2 <= t1; t2++) {
    let dp = dot_row(&dor, b, t2, h);
    o1[base + t2] = dp;
    sum += x3[base + t2] * dp;
  }
  for (var t2 = 0u; t2 < p.T; t2++) {
    if (seen(b, t1, t2)) { o1[base + t2] = x3[base + t2] * (o1[base + t2] - sum) * p.scale; } else { o1[base + t2] = 0.0; }
  }
}

// x1 = dS, x2 = k -> o1 = dq
@compute @workgroup_size(64)
fn attn_dq(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
           @builtin(local_invocation_id) lid: vec3<u32>) {
  causal_product(lin(wid, nwg, lid), false);
}

// x1 = dS, x2 = q -> o1 = dk
@compute @workgroup_size(64)
fn attn_dk(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
           @builtin(local_invocation_id) lid: vec3<u32>) {
  causal_product(lin(wid, nwg, lid), true);
}

// x1 = P, x2 = dout -> o1 = dv
@compute @workgroup_size(64)
fn attn_dvalue(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_id) lid: vec3<u32>) {
  causal_product(lin(wid, nwg, lid), true);
}
