// Rotary position embedding (RoPE, Su et al. 2021) of q or k, in place, in the rotate-half layout
// that transformers (Llama, Qwen) and nanochat use: in each head of hd channels, channel i < hd/2
// pairs with channel i + hd/2, and the pair turns by the angle pos * theta^(-2i/hd):
//   rope_forward   (x1, x2) <- (x1 cos - x2 sin, x2 cos + x1 sin)
//   rope_backward  the transpose, a turn by minus the angle: d(out) in place becomes d(in)
//   qk_norm_rope   QK-norm and the turn in one pass, where the normed q or k is written: xr, the
//                  projection's float32 q or k, normed over each head (RMSNorm, times the gain g
//                  [hd]), turned and written to x as stored (rounded once); stats [2, heads] = 0 | rstd
//                  as layernorm_forward's RMSNorm writes them, which QK-norm's backward reads
//   qk_norm_rope_dx  its backward where the gain takes no gradient (nanochat's QK-norm has none; a
//                  LoRA run's is frozen): dy, the gradient of what qk_norm_rope wrote, turned back and
//                  taken through the RMSNorm, dx = rstd (dyt g - xhat mean(dyt g xhat)), float32
// x: [rows, C] with heads interleaved, bound as words: float32, or with BF16 | F16 16-bit values
// two to a word as a bf16 or f16 model stores q and k (online.wgsl's layout), rounded once after
// the turn. Row r is position r % T + offset (a decode step's rows: offset the cache's length).
// cs: (cos, sin) [positions, hd/2], made on the host in float32 as transformers makes its table:
// WGSL's sin and cos promise 2^-11 only on [-pi, pi], and a position's angle runs to thousands.
// One invocation per two neighbouring pairs (i even), so every word it writes is its own (hd a
// multiple of 4).

struct Params { rows: u32, T: u32, C: u32, hd: u32, offset: u32, eps: f32 }     // eps: qk_norm_rope's

override BF16: bool = false;         // x holds bf16
override F16: bool = false;          // x holds f16

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> cs: array<vec2<f32>>;      // (cos, sin) [positions, hd/2]
@group(0) @binding(2) var<storage, read_write> x: array<u32>;        // q or k [rows, C], as stored
@group(0) @binding(3) var<storage, read> xr: array<f32>;             // qk_norm_rope: float32 q or k [rows, C]
@group(0) @binding(4) var<storage, read> gain: array<f32>;           // qk_norm_rope: the gain [hd]
@group(0) @binding(5) var<storage, read_write> stats: array<f32>;    // qk_norm_rope: 0 | rstd [2, rows * C/hd]
@group(0) @binding(6) var<storage, read> dy: array<f32>;             // qk_norm_rope_dx: [rows, C]; x: its dx

// Row r's position: r % T + offset; in packed windows (DOCS) several records share a window and
// each one's positions restart at 0: docs holds each row's position in its record.
//#if DOCS
@group(0) @binding(7) var<storage, read> docs: array<u32>;           // [rows]
fn position(r: u32) -> u32 { return docs[r]; }
//#else
fn position(r: u32) -> u32 { return r % p.T + p.offset; }
//#endif

// elements e and e + 1 (e even) as stored
fn get2(e: u32) -> vec2<f32> {
  if (F16) { return unpack2x16float(x[e / 2u]); }
  if (BF16) { let w = x[e / 2u]; return bitcast<vec2<f32>>(vec2<u32>(w << 16u, w & 0xffff0000u)); }
  return bitcast<vec2<f32>>(vec2<u32>(x[e], x[e + 1u]));
}

fn put2(e: u32, v: vec2<f32>) {
  if (F16) { x[e / 2u] = pack2x16float(v); return; }
  if (BF16) { x[e / 2u] = bf16_pack(v.x, v.y); return; }
  x[e] = bitcast<u32>(v.x);
  x[e + 1u] = bitcast<u32>(v.y);
}

fn turn(g: u32, sign: f32) {
  let half = p.hd / 2u;
  let per_row = p.C / 4u;                  // two pairs an invocation: C / 2 pairs a row
  if (g >= p.rows * per_row) { return; }
  let r = g / per_row;
  let h = (2u * (g % per_row)) / half;
  let i = (2u * (g % per_row)) % half;     // even, < hd/2
  let e = r * p.C + h * p.hd + i;
  let t = position(r) * half + i;
  let c = vec2<f32>(cs[t].x, cs[t + 1u].x);
  let s = sign * vec2<f32>(cs[t].y, cs[t + 1u].y);
  let x1 = get2(e);
  let x2 = get2(e + half);
  put2(e, x1 * c - x2 * s);
  put2(e + half, x2 * c + x1 * s);
}

@compute @workgroup_size(64)
fn rope_forward(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                @builtin(local_invocation_id) lid: vec3<u32>) {
  turn(lin(wid, nwg, lid), 1.0);
}

@compute @workgroup_size(64)
fn rope_backward(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                 @builtin(local_invocation_id) lid: vec3<u32>) {
  turn(lin(wid, nwg, lid), -1.0);
}

// One invocation per head of a row: its rstd over hd channels, then two neighbouring pairs at a
// time normed, turned and written (hd a multiple of 4, as the turn's).
@compute @workgroup_size(64)
fn qk_norm_rope(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                @builtin(local_invocation_id) lid: vec3<u32>) {
  let j = lin(wid, nwg, lid);              // head j % (C / hd) of row j / (C / hd)
  let heads = p.rows * (p.C / p.hd);
  if (j >= heads) { return; }
  let base = j * p.hd;                     // its first channel: a row's heads lie side by side
  var ss = 0.0;
  for (var i = 0u; i < p.hd; i++) { ss += xr[base + i] * xr[base + i]; }
  let rstd = inverseSqrt(ss / f32(p.hd) + p.eps);
  stats[j] = 0.0;
  stats[heads + j] = rstd;
  let half = p.hd / 2u;
  let t0 = position(j / (p.C / p.hd)) * half;
  for (var i = 0u; i < half; i += 2u) {
    let c = vec2<f32>(cs[t0 + i].x, cs[t0 + i + 1u].x);
    let s = vec2<f32>(cs[t0 + i].y, cs[t0 + i + 1u].y);
    let k = base + half + i;               // the partner pair's first channel
    let x1 = vec2<f32>(xr[base + i], xr[base + i + 1u]) * rstd * vec2<f32>(gain[i], gain[i + 1u]);
    let x2 = vec2<f32>(xr[k], xr[k + 1u]) * rstd * vec2<f32>(gain[half + i], gain[half + i + 1u]);
    put2(base + i, x1 * c - x2 * s);
    put2(k, x2 * c + x1 * s);
  }
}

// channels i and i + hd/2 of head j's dy turned back (by minus the angle) and times the gain:
// RMSNorm's dxhat for the pair
fn dxhat(base: u32, t: u32, i: u32) -> vec2<f32> {
  let half = p.hd / 2u;
  let c = cs[t + i].x;
  let s = cs[t + i].y;
  let d1 = dy[base + i];
  let d2 = dy[base + half + i];
  return vec2<f32>(d1 * c + d2 * s, d2 * c - d1 * s) * vec2<f32>(gain[i], gain[half + i]);
}

// One invocation per head of a row, as qk_norm_rope's; dx float32 into x (as bits).
@compute @workgroup_size(64)
fn qk_norm_rope_dx(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                   @builtin(local_invocation_id) lid: vec3<u32>) {
  let j = lin(wid, nwg, lid);
  let heads = p.rows * (p.C / p.hd);
  if (j >= heads) { return; }
  let base = j * p.hd;
  let half = p.hd / 2u;
  let t0 = position(j / (p.C / p.hd)) * half;
  let rstd = stats[heads + j];
  var m = 0.0;                             // mean(dxhat * xhat) over the head
  for (var i = 0u; i < half; i++) {
    let d = dxhat(base, t0, i);
    m += d.x * xr[base + i] + d.y * xr[base + half + i];
  }
  m *= rstd / f32(p.hd);
  for (var i = 0u; i < half; i++) {
    let d = dxhat(base, t0, i);
    x[base + i] = bitcast<u32>(rstd * (d.x - xr[base + i] * rstd * m));
    x[base + half + i] = bitcast<u32>(rstd * (d.y - xr[base + half + i] * rstd * m));
  }
}
