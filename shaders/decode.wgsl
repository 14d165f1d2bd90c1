// Decoding one token per sequence from a key/value cache, and choosing it on the device.
//   embed_decode   x[n, :] = tok[ids[n], :] + pos[p.pos, :]
//   kv_append      kc[n, p.pos, :] = k[n, :];  vc[n, p.pos, :] = v[n, :]
//   attn_decode    out[n, h*hd + d] = sum_{t <= pos} softmax_t(q[n,h,:] . kc[n,t,j,:] * scale) vc[n,t,j*hd + d],
//                  j = h / (H / KV) the key/value head of query head h (j = h without grouped-query attention)
//                  (with a sliding window W, over the last W positions alone: pos - W < t <= pos)
//   sample_tokens  ids[n] = the next token of sequence n, from its row of logits (see there)
// The caches are [N, T, KV * hd] per layer (KV = H, width C, without grouped-query attention): the
// prefill's own key and value activations as projected, before any head is copied to the query heads
// it serves, so a prefill fills them without a copy and a grouped model's cache is H / KV times smaller.
// p.pos and p.step change with every token: these kernels read one uniform buffer that the host
// rewrites before each submit, so the bind groups are built once.

struct Params {
  N: u32, T: u32, C: u32, H: u32,              // sequences, cache rows per sequence (ctx), width, heads
  pos: u32, step: u32, V: u32, VP: u32,        // position decoded, tokens drawn before, vocab, logits row stride
  top_k: u32, row0: u32, row_stride: u32, seed_lo: u32,   // logits row of sequence n: row0 + n * row_stride
  seed_hi: u32, temperature: f32, top_p: f32, scale: f32, // scale = 1 / sqrt(head dim)
  v0: u32, vn: u32,                            // embed_decode: a bound at token rows v0 .. v0+vn-1
  KV: u32,                                     // key/value heads (H without grouped-query attention)
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> a: array<f32>;
@group(0) @binding(2) var<storage, read> b: array<f32>;
@group(0) @binding(3) var<storage, read> c: array<f32>;
@group(0) @binding(4) var<storage, read> ids_in: array<u32>;          // [N] the tokens decoded now
@group(0) @binding(5) var<storage, read_write> o1: array<f32>;
@group(0) @binding(6) var<storage, read_write> o2: array<f32>;
@group(0) @binding(7) var<storage, read_write> ids_out: array<u32>;   // [N] next tokens, then history [steps, N]

override WINDOW: u32 = 0u;                // sliding window W of the attention; 0: none
override LEARNED: bool = true;            // embed_decode adds a learned position table (false: RoPE's model)

// channels of a cache row: the key/value heads'
fn kv_width() -> u32 { return p.C / p.H * p.KV; }

// the first channel of query head h's key/value head in a cache row
fn kv_col(h: u32) -> u32 { return h / (p.H / p.KV) * (p.C / p.H); }

// the oldest cached row position p.pos attends to
fn oldest_row() -> u32 { return p.pos + 1u - min(select(p.pos + 1u, WINDOW, WINDOW > 0u), p.pos + 1u); }

// a = tok rows v0 .. v0+vn-1 [vn, C], b = pos [T, C], ids_in -> o1 = x [N, C]. A token table
// over one binding is bound in chunks, one dispatch (and uniform) each: a sequence's row is
// written by the chunk holding its token, as in embed.wgsl.
@compute @workgroup_size(64)
fn embed_decode(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                @builtin(local_invocation_id) lid: vec3<u32>) {
  let i = lin(wid, nwg, lid);
  if (i >= p.N * p.C) { return; }
  let ch = i % p.C;
  let v = ids_in[i / p.C];
  if (v < p.v0 || v - p.v0 >= p.vn) { return; }
  var x = a[(v - p.v0) * p.C + ch];
  if (LEARNED) { x += b[p.pos * p.C + ch]; }
  o1[i] = x;
}


// The same bindings read as words: kv_append's, and a bf16 or f16 model's attention's (its k, v,
// the prefill's and the step's, are stored two to a word, as the model stores them, and so are the
// caches).
@group(0) @binding(1) var<storage, read> ah: array<u32>;
@group(0) @binding(2) var<storage, read> bh: array<u32>;
@group(0) @binding(3) var<storage, read> ch: array<u32>;
@group(0) @binding(5) var<storage, read_write> o1h: array<u32>;
@group(0) @binding(6) var<storage, read_write> o2h: array<u32>;

// a = k [N, W], b = v [N, W] -> o1 = kc [N, T, W], o2 = vc [N, T, W] (W = kv_width()), row pos of
// each sequence, copied as words whatever they hold: PER_WORD values a word (1 float32, 2 for a
// bf16 or f16 model's cache, W even), so one entry point serves every stored type
override PER_WORD: u32 = 1u;

@compute @workgroup_size(64)
fn kv_append(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
             @builtin(local_invocation_id) lid: vec3<u32>) {
  let i = lin(wid, nwg, lid);
  let w = kv_width() / PER_WORD;
  if (i >= p.N * w) { return; }
  let dst = ((i / w) * p.T + p.pos) * w + i % w;
  o1h[dst] = ah[i];
  o2h[dst] = bh[i];
}

// One workgroup per (n, h): a = q [N, C], b = kc [N, T, W], c = vc [N, T, W] (W = kv_width()),
// each stored as the model stores them (the section of its type, below, says how a value is
// read) -> o1 = out [N, C] float32 (the block converts it to what it stores, as in training),
// o2 = scratch [N, H, T] (the scores, then their exponentials).
// Three passes over the cached rows it sees (pos + 1, or the window's last W): scores and their
// max (a lane a row), exp and sum, weighted values (a lane a channel). attn_decode4, for a head
// dim that is a multiple of UNIT, reads q, k and v a vector load at a time (a unit: a vec4 of
// float32, or a vec4 of words, 8 bf16 or f16): on lavapipe a lane's load costs about the same
// whatever it carries, and the passes over the cache are loads (how much faster:
// docs/results.md, "Chat beside transformers"). An entry point binds a, b, c one way only.

// where a workgroup's head reads and writes
struct At {
  live: bool,          // a folded grid may hold a few spare workgroups
  hd: u32,
  q: u32,              // its first channel in q and out: n * C + h * hd
  kv: u32,             // cache row 0's first channel of its key/value head (row t: + t * w)
  w: u32,              // a cache row's channels
  lo: u32,             // the oldest cached row it sees, and one past the newest
  rows: u32,
  srow: u32,           // its scratch row
}

fn head_at(wid: vec3<u32>, nwg: vec3<u32>) -> At {
  let g = group_index(wid, nwg);          // uniform: the same for every lane of the workgroup
  let n = g / p.H;
  let hd = p.C / p.H;
  let w = kv_width();
  return At(g < p.N * p.H, hd, n * p.C + (g % p.H) * hd, n * p.T * w + kv_col(g % p.H), w, oldest_row(),
            p.pos + 1u, g * p.T);
}

// With this lane's scores in the scratch row and m_lane their max: the exponentials in their
// place, and their sum over the workgroup, visible to every lane.
fn softmax_rows(h: At, lid: u32, m_lane: f32) -> f32 {
  let m = wg_max64(lid, m_lane);          // common.wgsl
  var z = 0.0;
  if (h.live) {
    for (var t = h.lo + lid; t < h.rows; t += 64u) {
      let e = exp(o2[h.srow + t] - m);
      o2[h.srow + t] = e;
      z += e;
    }
  }
  z = wg_sum64(lid, z);
  storageBarrier();                       // every lane's exponentials are visible to all
  return z;
}

@compute @workgroup_size(64)
fn attn_decode(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_id) lid3: vec3<u32>) {
  let h = head_at(wid, nwg);
  let lid = lid3.x;
  var m = -3.0e38;
  if (h.live) {
    for (var t = h.lo + lid; t < h.rows; t += 64u) {
      let kb = h.kv + t * h.w;
      var s = 0.0;
      for (var d = 0u; d < h.hd; d++) { s += q_at(h.q + d) * k_at(kb + d); }
      s *= p.scale;
      o2[h.srow + t] = s;
      m = max(m, s);
    }
  }
  let z = softmax_rows(h, lid, m);
  if (!h.live) { return; }
  for (var d = lid; d < h.hd; d += 64u) {
    var acc = 0.0;
    for (var t = h.lo; t < h.rows; t++) { acc += o2[h.srow + t] * v_at(h.kv + t * h.w + d); }
    o1[h.q + d] = acc / z;
  }
}

@compute @workgroup_size(64)
fn attn_decode4(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                @builtin(local_invocation_id) lid3: vec3<u32>) {
  let h = head_at(wid, nwg);
  let lid = lid3.x;
  let du = h.hd / UNIT;
  var m = -3.0e38;
  if (h.live) {
    for (var t = h.lo + lid; t < h.rows; t += 64u) {
      var s4 = vec4<f32>();
      for (var d = 0u; d < du; d++) { s4 = dot_fma(q_unit(h.q / UNIT + d), k_unit((h.kv + t * h.w) / UNIT + d), s4); }
      let s = ((s4.x + s4.y) + (s4.z + s4.w)) * p.scale;
      o2[h.srow + t] = s;
      m = max(m, s);
    }
  }
  let z = softmax_rows(h, lid, m);
  if (!h.live) { return; }
  for (var d = lid; d < du; d += 64u) {
    var acc: Unit;                        // zero
    for (var t = h.lo; t < h.rows; t++) { acc = weigh(o2[h.srow + t], v_unit((h.kv + t * h.w) / UNIT + d), acc); }
    put_unit(h.q + UNIT * d, acc, z);
  }
}

// out[i .. i+3] = o / z
fn put4(i: u32, o: vec4<f32>, z: f32) {
  let r = o / z;
  o1[i] = r.x; o1[i + 1u] = r.y; o1[i + 2u] = r.z; o1[i + 3u] = r.w;
}

// ---- how the attention reads a stored value, by the type's section: q_at, k_at, v_at (value e
// of q, kc, vc); a unit (UNIT values, one vector load) of each; dot_fma (s + the unit's products,
// 4 lanes), weigh (acc + e times a unit), put_unit (out = a unit / z)
//#if f32

@group(0) @binding(1) var<storage, read> a4: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> b4: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read> c4: array<vec4<f32>>;

fn q_at(e: u32) -> f32 { return a[e]; }
fn k_at(e: u32) -> f32 { return b[e]; }
fn v_at(e: u32) -> f32 { return c[e]; }

const UNIT: u32 = 4u;
alias Unit = vec4<f32>;
fn q_unit(i: u32) -> Unit { return a4[i]; }
fn k_unit(i: u32) -> Unit { return b4[i]; }
fn v_unit(i: u32) -> Unit { return c4[i]; }
fn dot_fma(x: Unit, y: Unit, s: vec4<f32>) -> vec4<f32> { return fma(x, y, s); }
fn weigh(e: f32, v: Unit, acc: Unit) -> Unit { return fma(vec4<f32>(e), v, acc); }
fn put_unit(i: u32, o: Unit, z: f32) { put4(i, o, z); }
//#endif
//#if !f32

// a 16-bit type, two to a word (element 2i in the low half of word i): a unit is a vec4 of words,
// 8 values, as two vec4<f32> (lo: values 0-3, hi: 4-7), unpacked by the type's half8
@group(0) @binding(1) var<storage, read> ah4: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> bh4: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read> ch4: array<vec4<u32>>;

fn q_at(e: u32) -> f32 { return half_at(ah[e / 2u], e); }
fn k_at(e: u32) -> f32 { return half_at(bh[e / 2u], e); }
fn v_at(e: u32) -> f32 { return half_at(ch[e / 2u], e); }

const UNIT: u32 = 8u;
struct Unit { lo: vec4<f32>, hi: vec4<f32> }
fn q_unit(i: u32) -> Unit { return half8(ah4[i]); }
fn k_unit(i: u32) -> Unit { return half8(bh4[i]); }
fn v_unit(i: u32) -> Unit { return half8(ch4[i]); }
fn dot_fma(x: Unit, y: Unit, s: vec4<f32>) -> vec4<f32> { return fma(x.lo, y.lo, fma(x.hi, y.hi, s)); }
fn weigh(e: f32, v: Unit, acc: Unit) -> Unit {
  return Unit(fma(vec4<f32>(e), v.lo, acc.lo), fma(vec4<f32>(e), v.hi, acc.hi));
}
fn put_unit(i: u32, o: Unit, z: f32) { put4(i, o.lo, z); put4(i + 4u, o.hi, z); }
//#endif
//#if bf16

fn half_at(w: u32, e: u32) -> f32 { return bitcast<f32>(select(w << 16u, w & 0xffff0000u, (e & 1u) == 1u)); }
fn half8(w: vec4<u32>) -> Unit { return Unit(bf16_lo4(w.xy), bf16_lo4(w.zw)); }
//#endif
//#if f16

// unpack2x16float: WGSL's f16 values read as float32, without the f16 extension
fn half_at(w: u32, e: u32) -> f32 { return unpack2x16float(w)[e & 1u]; }
fn half8(w: vec4<u32>) -> Unit {
  return Unit(vec4<f32>(unpack2x16float(w.x), unpack2x16float(w.y)), vec4<f32>(unpack2x16float(w.z), unpack2x16float(w.w)));
}
//#endif

// ---- sampling -----------------------------------------------------------------------------
// One workgroup of 256 per sequence n, over its logits row a[(row0 + n*row_stride) * VP + i], i < V.
// temperature 0: the argmax (the lowest index among equal maxima). Otherwise, with
// z = logits / temperature, the eligible tokens are those with z >= the top_k-th largest z
// (ties kept; top_k 0 or >= V keeps all), then, when top_p < 1, those of the largest z whose
// softmax mass reaches top_p of the eligible mass (ties at the boundary kept). The draw: u from
// a counter-based hash of (seed, n, step), and the first eligible index, in index order, whose
// running sum of exp(z - max) passes u times their total. The thresholds are found by bisection
// on the order-preserving integer key of z: 32 fixed rounds, each a workgroup reduction.
var<workgroup> ru: array<u32, 256>;

fn key(z: f32) -> u32 {                   // u32 order == f32 order
  let bits = bitcast<u32>(z);
  if ((bits & 0x80000000u) != 0u) { return ~bits; }
  return bits | 0x80000000u;
}

fn pcg(v: u32) -> u32 {                   // PCG-RXS-M-XS, a 32-bit hash (Jarzynski & Olano 2020)
  let s = v * 747796405u + 2891336453u;
  let w = ((s >> ((s >> 28u) + 4u)) ^ s) * 277803737u;
  return (w >> 22u) ^ w;
}

fn draw(n: u32) -> f32 {                  // in [0, 1), 24 bits
  return f32(pcg(pcg(pcg(pcg(p.seed_lo) ^ p.seed_hi) ^ n) ^ p.step) >> 8u) * (1.0 / 16777216.0);
}

fn sum256u(lid: u32, v: u32) -> u32 {
  ru[lid] = v;
  workgroupBarrier();
  for (var s = 128u; s > 0u; s >>= 1u) {
    if (lid < s) { ru[lid] = ru[lid] + ru[lid + s]; }
    workgroupBarrier();
  }
  let r = ru[0];
  workgroupBarrier();
  return r;
}

fn zval(base: u32, i: u32) -> f32 {
  return a[base + i] / p.temperature;
}

@compute @workgroup_size(256)
fn sample_tokens(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid3: vec3<u32>) {
  let n = wid.x;
  let lid = lid3.x;
  let base = (p.row0 + n * p.row_stride) * p.VP;
  if (p.temperature <= 0.0) {             // greedy
    var best = -3.4e38;
    var at = 0xffffffffu;
    for (var i = lid; i < p.V; i += 256u) {
      let v = a[base + i];
      if (v > best) { best = v; at = i; }
    }
    wg256[lid] = best;
    ru[lid] = at;
    workgroupBarrier();
    for (var s = 128u; s > 0u; s >>= 1u) {
      if (lid < s) {
        let v = wg256[lid + s];
        let j = ru[lid + s];
        if (v > wg256[lid] || (v == wg256[lid] && j < ru[lid])) { wg256[lid] = v; ru[lid] = j; }
      }
      workgroupBarrier();
    }
    if (lid == 0u) {
      ids_out[n] = ru[0];
      ids_out[p.N + p.step * p.N + n] = ru[0];
    }
    return;
  }
  var mx = -3.4e38;
  for (var i = lid; i < p.V; i += 256u) { mx = max(mx, zval(base, i)); }
  let m = wg_max256(lid, mx);
  // top-k: the largest key t with count(key >= t) >= top_k
  var lo = 0u;
  var hi = 0xffffffffu;
  let use_k = p.top_k > 0u && p.top_k < p.V;
  for (var round = 0u; round < 32u; round++) {
    let mid = lo + ((hi - lo) >> 1u) + ((hi - lo) & 1u);   // the upper middle, without overflow
    var cnt = 0u;
    if (use_k && lo < hi) {
      for (var i = lid; i < p.V; i += 256u) { cnt += select(0u, 1u, key(zval(base, i)) >= mid); }
    }
    let total = sum256u(lid, cnt);
    if (use_k && lo < hi) {
      if (total >= p.top_k) { lo = mid; } else { hi = mid - 1u; }
    }
  }
  let thr_k = select(0u, lo, use_k);
  // top-p: the largest key t >= thr_k whose mass(key >= t) reaches top_p of mass(key >= thr_k)
  let use_p = p.top_p < 1.0;
  var part = 0.0;
  for (var i = lid; i < p.V; i += 256u) {
    let z = zval(base, i);
    if (key(z) >= thr_k) { part += exp(z - m); }
  }
  let mass_k = wg_sum256(lid, part);
  lo = thr_k;
  hi = 0xffffffffu;
  for (var round = 0u; round < 32u; round++) {
    let mid = lo + ((hi - lo) >> 1u) + ((hi - lo) & 1u);   // the upper middle, without overflow
    var s = 0.0;
    if (use_p && lo < hi) {
      for (var i = lid; i < p.V; i += 256u) {
        let z = zval(base, i);
        if (key(z) >= mid) { s += exp(z - m); }
      }
    }
    let total = wg_sum256(lid, s);
    if (use_p && lo < hi) {
      if (total >= p.top_p * mass_k) { lo = mid; } else { hi = mid - 1u; }
    }
  }
  let thr = select(thr_k, lo, use_p);
  // the draw: each lane sums a contiguous chunk, lane 0 finds the chunk and the index in it
  let chunk = (p.V + 255u) / 256u;
  let i0 = min(p.V, lid * chunk);
  let i1 = min(p.V, i0 + chunk);
  var own = 0.0;
  for (var i = i0; i < i1; i++) {
    let z = zval(base, i);
    if (key(z) >= thr) { own += exp(z - m); }
  }
  wg256[lid] = own;
  workgroupBarrier();
  if (lid == 0u) {
    var total = 0.0;
    for (var j = 0u; j < 256u; j++) { total += wg256[j]; }
    let goal = draw(n) * total;              // the mass to pass
    var acc = 0.0;
    var owner = 0u;                       // the chunk holding the goal: else the last non-empty one
    var before = 0.0;                     // the mass of the chunks before it
    for (var j = 0u; j < 256u; j++) {
      if (wg256[j] > 0.0) {
        owner = j;
        before = acc;
        if (acc + wg256[j] > goal) { break; }
        acc += wg256[j];
      }
    }
    var run = before;
    var chosen = 0xffffffffu;
    var last = 0u;                        // the chunk's last eligible index: where rounding past the end lands
    let j0 = owner * chunk;
    let j1 = min(p.V, j0 + chunk);
    for (var i = j0; i < j1; i++) {
      let z = zval(base, i);
      if (key(z) >= thr) {
        last = i;
        run += exp(z - m);
        if (run > goal) { chosen = i; break; }
      }
    }
    if (chosen == 0xffffffffu) { chosen = last; }
    ids_out[n] = chosen;
    ids_out[p.N + p.step * p.N + n] = chosen;
  }
}
