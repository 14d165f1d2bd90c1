// Tiled online-softmax attention (FlashAttention-2 style) and its recompute backward.
// Nothing of size T x T exists: the forward keeps, per query row, the running
// max m, the running sum l and the unnormalised output o, and writes out and
// L = m + log l; the backward rebuilds P = exp(S - L) tile by tile.
//   attn_online_forward  workgroup = BQ query rows of one (b, h); K, V tiles stream through workgroup memory
//   attn_online_d        D = rowsum(dO * O), one invocation per (b, h, t)
//   attn_online_dq       workgroup = BQ query rows; K, V tiles stream; dq = sum_j dS_ij k_j
//   attn_online_dkv      workgroup = BK key rows; Q, dO, L, D tiles stream from the diagonal down
//   attn_online_dq_rope, attn_online_dkv_rope  the same for a rotary model whose q and k were turned
//                        where they were stored: dq and dk turned back as they are stored (each
//                        invocation holds its row whole); position = row, HD % 8 == 0
// Tiles entirely above the causal diagonal are never visited, nor, with a sliding
// window W (WINDOW > 0: a query sees its last W positions, itself included), tiles
// wholly older than every query's window: the work falls with W. No atomics:
// each output row belongs to exactly one invocation. Work O(T^2 hd).
// q, k, v, dout, out: [B, T, C] with heads interleaved; L, D: [B, H, T].
// q, k, v are bound as words: float32 (a bitcast, free) or, with BF16 or F16, 16-bit values two
// to a word, element e in half e & 1 of word e / 2, as a bf16 or f16 model stores them (bf16: the
// high half of a float32; f16: WGSL's unpack2x16float, which needs no f16 extension); the tiles
// and all arithmetic stay float32.
//
// Two facts about CPU adapters shape the loops (lavapipe, llvmpipe):
//  * they stop any invocation's loops after 65,535 iterations in total, silently;
//    so head channels are held as vec4 and the channel loops run in blocks of 8
//    (at most 4 blocks, constant after override substitution), which the compiler
//    unrolls, leaving about 3 loop trips per key: T up to ~20,000 stays under the cap;
//  * lanes run in SIMD, and a tile read whose address is the same for every lane
//    is one load: so all lanes walk the same keys and mask with select, in
//    uniform control flow;
//  * a workgroup-memory read costs more than a register: a tile row used twice is
//    copied to registers once (dkv 30 % faster at T=2048, hd=64).

struct Params { B: u32, T: u32, C: u32, H: u32, scale: f32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> q: array<u32>;
@group(0) @binding(2) var<storage, read> k: array<u32>;
@group(0) @binding(3) var<storage, read> v: array<u32>;
@group(0) @binding(4) var<storage, read> dout: array<f32>;  // dO (backward) | unused
@group(0) @binding(5) var<storage, read> Lin: array<f32>;   // L (backward) | unused
@group(0) @binding(6) var<storage, read> Din: array<f32>;   // D (backward) | unused
@group(0) @binding(7) var<storage, read_write> o1: array<f32>;  // out | D | dq | dk
@group(0) @binding(8) var<storage, read_write> o2: array<f32>;  // L | dv
@group(0) @binding(9) var<storage, read> cs: array<vec2<f32>>;  // _rope entries: RoPE's (cos, sin) [T, HD/2]

override HD: u32 = 64u;              // head dim, <= 128
override HD4: u32 = 16u;             // vec4 per row: ceil(HD / 32) * 8, zero-padded (loops go in blocks of 8)
override BQ: u32 = 32u;              // query rows per tile (forward/dq workgroup size)
override BK: u32 = 32u;              // key rows per tile (streamed in forward/dq; dkv workgroup size and its query tile)
override BF16: bool = false;         // q, k, v hold bf16
override F16: bool = false;          // q, k, v hold f16
override WINDOW: u32 = 0u;           // sliding window W; 0: none
const B_MAX: u32 = 64u;
const NEG: f32 = -0x1.fffffep+127f;

var<workgroup> t1: array<vec4<f32>, BK * HD4>;  // K tile (forward, dq) | Q*scale tile (dkv)
var<workgroup> t2: array<vec4<f32>, BK * HD4>;  // V tile (forward, dq) | dO tile (dkv)
var<workgroup> tl: array<f32, BK>;              // L of the Q tile (dkv)
var<workgroup> td: array<f32, BK>;              // D of the Q tile (dkv)

// Packed windows (DOCS): several records in a window, each attending only within itself. docs
// holds each row's position in its record, so row t's record starts at t - docs[row]. The tiles
// walked stay the window's (the bounds are uniform, from the workgroup id); keys of an earlier
// record are masked with the rest.
//#if DOCS
@group(0) @binding(10) var<storage, read> docs: array<u32>;   // [B*T]
fn first(b: u32, t: u32) -> u32 { let r = min(t, p.T - 1u); return r - min(docs[b * p.T + r], r); }
//#else
fn first(b: u32, t: u32) -> u32 { return 0u; }
//#endif

fn win() -> u32 { return select(p.T, min(WINDOW, p.T), WINDOW > 0u); }
fn oldest(t: u32) -> u32 { return t + 1u - min(win(), t + 1u); }   // the oldest key query t sees
fn seen(row: u32, key: u32) -> bool { return key <= row && row - key < win(); }

fn at(b: u32, t: u32, h: u32, d: u32) -> u32 {
  return (b * p.T + t) * p.C + h * HD + d;
}

fn word(x: u32, i: u32) -> u32 {         // word i of q (x = 0), k (1) or v (2)
  switch x { case 0u: { return q[i]; } case 1u: { return k[i]; } default: { return v[i]; } }
}

fn qkv_at(x: u32, i: u32) -> f32 {       // element i of q, k or v, as stored
  if (F16) { return unpack2x16float(word(x, i / 2u))[i & 1u]; }
  if (BF16) {
    let w = word(x, i / 2u);
    return bitcast<f32>(select(w << 16u, w & 0xffff0000u, (i & 1u) == 1u));
  }
  return bitcast<f32>(word(x, i));
}

// channels 4c .. 4c+3 of row t of a head slice, zeros past HD
fn ld4(x: u32, b: u32, t: u32, h: u32, c: u32) -> vec4<f32> {
  var r = vec4<f32>();
  for (var e = 0u; e < 4u; e++) {
    let d = 4u * c + e;
    if (d < HD) {
      let i = at(b, t, h, d);
      if (x < 3u) { r[e] = qkv_at(x, i); } else { r[e] = dout[i]; }
    }
  }
  return r;
}

fn st4(x: u32, b: u32, t: u32, h: u32, c: u32, val: vec4<f32>) {
  for (var e = 0u; e < 4u; e++) {
    let d = 4u * c + e;
    if (d < HD) {
      if (x == 0u) { o1[at(b, t, h, d)] = val[e]; } else { o2[at(b, t, h, d)] = val[e]; }
    }
  }
}

// cooperative load of n rows from r0 of two head slices into t1, t2 (zeros past T)
fn load_tiles(x1: u32, x2: u32, s1: f32, b: u32, h: u32, r0: u32, lid: u32, nthreads: u32) {
  for (var i = lid; i < BK * HD4; i += nthreads) {
    let r = r0 + i / HD4;
    let c = i % HD4;
    if (r < p.T) { t1[i] = ld4(x1, b, r, h, c) * s1; t2[i] = ld4(x2, b, r, h, c); }
    else { t1[i] = vec4<f32>(); t2[i] = vec4<f32>(); }
  }
}

// The query tile of workgroup wg: (b, h), its first row, its last one, and the first key tile
// any of its rows sees. It is built from the workgroup id alone so that WGSL's uniformity
// analysis (which Tint enforces) sees the loops bounded by it around the barriers as uniform;
// a lane's own row is q0 + lid.
struct QTile { b: u32, h: u32, q0: u32, last: u32, k0: u32 }

fn q_tile(wg: u32) -> QTile {
  let nq = (p.T + BQ - 1u) / BQ;
  let q0 = (wg % nq) * BQ;
  return QTile(wg / (nq * p.H), (wg / nq) % p.H, q0, min(q0 + BQ, p.T) - 1u, oldest(q0) / BK * BK);
}

@compute @workgroup_size(BQ)
fn attn_online_forward(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lidv: vec3<u32>) {
  let lid = lidv.x;
  let t = q_tile(wid.x);
  let b = t.b; let h = t.h; let last = t.last;
  let row = t.q0 + lid;                  // this lane's query row; rr: clamped to T-1 for loads
  let rr = min(row, p.T - 1u);

  var qr: array<vec4<f32>, 32>;
  var o: array<vec4<f32>, 32>;
  for (var c = 0u; c < HD4; c++) { qr[c] = ld4(0u, b, rr, h, c) * p.scale; o[c] = vec4<f32>(); }
  let lo = first(b, rr);                 // this row's record's first key
  var m = NEG;
  var l = 0.0;
  var s: array<f32, B_MAX>;
  for (var k0 = t.k0; k0 <= last; k0 += BK) {
    workgroupBarrier();                  // previous tile fully consumed
    load_tiles(1u, 2u, 1.0, b, h, k0, lid, BQ);
    workgroupBarrier();
    let nk = min(BK, last + 1u - k0);    // uniform; keys past this row's diagonal are masked
    var mt = m;
    for (var j = 0u; j < nk; j++) {
      var acc = 0.0;
      for (var cb = 0u; cb < HD4; cb += 8u) { for (var e = 0u; e < 8u; e++) { let c = cb + e; acc += dot(qr[c], t1[j * HD4 + c]); } }
      s[j] = select(NEG, acc, seen(row, k0 + j) && k0 + j >= lo);
      mt = max(mt, s[j]);
    }
    let alpha = exp(m - mt);             // rescale what was summed against the old max
    l *= alpha;
    for (var cb = 0u; cb < HD4; cb += 8u) { for (var e = 0u; e < 8u; e++) { o[cb + e] *= alpha; } }
    for (var j = 0u; j < nk; j++) {
      let e = select(0.0, exp(s[j] - mt), seen(row, k0 + j) && k0 + j >= lo);
      l += e;
      for (var cb = 0u; cb < HD4; cb += 8u) { for (var i = 0u; i < 8u; i++) { let c = cb + i; o[c] = fma(vec4<f32>(e), t2[j * HD4 + c], o[c]); } }
    }
    m = mt;
  }
  if (row < p.T) {
    let inv = 1.0 / l;
    for (var c = 0u; c < HD4; c++) { st4(0u, b, row, h, c, o[c] * inv); }
    o2[(b * p.H + h) * p.T + row] = m + log(l);
  }
}

// q = dout, k = out -> o1 = D   (one invocation per (b, h, t))
@compute @workgroup_size(64)
fn attn_online_d(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
  let i = gid.y * nwg.x * 64u + gid.x;
  if (i >= p.B * p.H * p.T) { return; }
  let t = i % p.T;
  let h = (i / p.T) % p.H;
  let b = i / (p.T * p.H);
  var s = 0.0;
  for (var c = 0u; c < HD4; c++) { s += dot(ld4(0u, b, t, h, c), ld4(1u, b, t, h, c)); }
  o1[i] = s;
}

// an invocation's dq into the caller's array (its row: q_tile(wid.x).q0 + lid)
fn dq_tile(wid: vec3<u32>, lid: u32, dq: ptr<function, array<vec4<f32>, 32>>) {
  let t = q_tile(wid.x);
  let b = t.b; let h = t.h; let last = t.last;
  let row = t.q0 + lid;                  // this lane's query row; rr: clamped to T-1 for loads
  let rr = min(row, p.T - 1u);

  var qr: array<vec4<f32>, 32>;
  var dor: array<vec4<f32>, 32>;
  for (var c = 0u; c < HD4; c++) {
    qr[c] = ld4(0u, b, rr, h, c) * p.scale;
    dor[c] = ld4(3u, b, rr, h, c);
  }
  let li = Lin[(b * p.H + h) * p.T + rr];
  let di = Din[(b * p.H + h) * p.T + rr];
  let lo = first(b, rr);
  for (var k0 = t.k0; k0 <= last; k0 += BK) {
    workgroupBarrier();
    load_tiles(1u, 2u, 1.0, b, h, k0, lid, BQ);
    workgroupBarrier();
    let nk = min(BK, last + 1u - k0);
    for (var j = 0u; j < nk; j++) {
      var sc = 0.0;
      var dp = 0.0;
      var kj: array<vec4<f32>, 32>;     // the key row, read from the tile once and used twice
      for (var cb = 0u; cb < HD4; cb += 8u) {
        for (var e = 0u; e < 8u; e++) {
          let c = cb + e;
          kj[c] = t1[j * HD4 + c];
          sc += dot(qr[c], kj[c]);
          dp += dot(dor[c], t2[j * HD4 + c]);
        }
      }
      let ds = select(0.0, exp(sc - li) * (dp - di) * p.scale, seen(row, k0 + j) && k0 + j >= lo);
      for (var cb = 0u; cb < HD4; cb += 8u) { for (var e = 0u; e < 8u; e++) { let c = cb + e; (*dq)[c] = fma(vec4<f32>(ds), kj[c], (*dq)[c]); } }
    }
  }
}

@compute @workgroup_size(BQ)
fn attn_online_dq(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lidv: vec3<u32>) {
  let t = q_tile(wid.x);
  let row = t.q0 + lidv.x;
  var dq: array<vec4<f32>, 32>;
  dq_tile(wid, lidv.x, &dq);
  if (row < p.T) {
    for (var c = 0u; c < HD4; c++) { st4(0u, t.b, row, t.h, c, dq[c]); }
  }
}

// row t's gradient g turned back by RoPE at position t, stored to o1: vec4 c of a head's first half
// pairs with vec4 c + HD/8 of its second (common.wgsl's turn4, by minus the angle)
fn st4_turned_back(b: u32, t: u32, h: u32, g: ptr<function, array<vec4<f32>, 32>>) {
  let h8 = HD / 8u;
  let m = vec2<f32>(1.0, -1.0);
  for (var c = 0u; c < h8; c++) {
    let e = t * (HD / 2u) + 4u * c;
    let y = turn4((*g)[c], (*g)[c + h8], cs[e] * m, cs[e + 1u] * m, cs[e + 2u] * m, cs[e + 3u] * m);
    st4(0u, b, t, h, c, y.x1);
    st4(0u, b, t, h, c + h8, y.x2);
  }
}

@compute @workgroup_size(BQ)
fn attn_online_dq_rope(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lidv: vec3<u32>) {
  let t = q_tile(wid.x);
  let row = t.q0 + lidv.x;
  var dq: array<vec4<f32>, 32>;
  dq_tile(wid, lidv.x, &dq);
  if (row < p.T) { st4_turned_back(t.b, row, t.h, &dq); }
}



// an invocation's dk and dv into the caller's arrays: workgroup = BK key rows; the streamed query
// tiles have BK rows too, from the key tile's diagonal to the last query whose window holds one of
// its keys.
fn dkv_tile(wid: vec3<u32>, lid: u32, dk: ptr<function, array<vec4<f32>, 32>>,
            dv: ptr<function, array<vec4<f32>, 32>>) {
  let nk = (p.T + BK - 1u) / BK;
  let kt = wid.x % nk;
  let h = (wid.x / nk) % p.H;
  let b = wid.x / (nk * p.H);
  let k0 = kt * BK;
  let col = k0 + lid;
  let cc = min(col, p.T - 1u);

  var kr: array<vec4<f32>, 32>;
  var vr: array<vec4<f32>, 32>;
  for (var c = 0u; c < HD4; c++) {
    kr[c] = ld4(1u, b, cc, h, c);
    vr[c] = ld4(2u, b, cc, h, c);
  }
  let lbase = (b * p.H + h) * p.T;
  let qend = min(p.T, k0 + BK - 1u + win());   // uniform: from the workgroup id
  for (var q0 = k0; q0 < qend; q0 += BK) {
    workgroupBarrier();
    load_tiles(0u, 3u, p.scale, b, h, q0, lid, BK);
    if (lid < BK) {
      let r = min(q0 + lid, p.T - 1u);
      tl[lid] = Lin[lbase + r];
      td[lid] = Din[lbase + r];
    }
    workgroupBarrier();
    let nr = min(BK, p.T - q0);          // uniform; rows above this lane's key are masked
    for (var i = 0u; i < nr; i++) {
      var sc = 0.0;
      var dp = 0.0;
      var qi: array<vec4<f32>, 32>;     // the row, read from the tile once and used twice
      var gi: array<vec4<f32>, 32>;
      for (var cb = 0u; cb < HD4; cb += 8u) {
        for (var e = 0u; e < 8u; e++) {
          let c = cb + e;
          qi[c] = t1[i * HD4 + c];
          gi[c] = t2[i * HD4 + c];
          sc += dot(qi[c], kr[c]);
          dp += dot(gi[c], vr[c]);
        }
      }
      let pij = select(0.0, exp(sc - tl[i]), seen(q0 + i, col) && col >= first(b, q0 + i));
      let ds = pij * (dp - td[i]);
      for (var cb = 0u; cb < HD4; cb += 8u) {
        for (var e = 0u; e < 8u; e++) {
          let c = cb + e;
          (*dv)[c] = fma(vec4<f32>(pij), gi[c], (*dv)[c]);
          (*dk)[c] = fma(vec4<f32>(ds), qi[c], (*dk)[c]);   // t1 holds q * scale
        }
      }
    }
  }
}

// the key row and (b, h) of invocation lid of workgroup wid (dkv_tile's): (col, b, h)
fn key_row(wid: vec3<u32>, lid: u32) -> vec3<u32> {
  let nk = (p.T + BK - 1u) / BK;
  return vec3<u32>((wid.x % nk) * BK + lid, wid.x / (nk * p.H), (wid.x / nk) % p.H);
}

@compute @workgroup_size(BK)
fn attn_online_dkv(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lidv: vec3<u32>) {
  let r = key_row(wid, lidv.x);
  var dk: array<vec4<f32>, 32>;
  var dv: array<vec4<f32>, 32>;
  dkv_tile(wid, lidv.x, &dk, &dv);
  if (r.x < p.T) {
    for (var c = 0u; c < HD4; c++) { st4(0u, r.y, r.x, r.z, c, dk[c]); st4(1u, r.y, r.x, r.z, c, dv[c]); }
  }
}

@compute @workgroup_size(BK)
fn attn_online_dkv_rope(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lidv: vec3<u32>) {
  let r = key_row(wid, lidv.x);
  var dk: array<vec4<f32>, 32>;
  var dv: array<vec4<f32>, 32>;
  dkv_tile(wid, lidv.x, &dk, &dv);
  if (r.x < p.T) {
    st4_turned_back(r.y, r.x, r.z, &dk);
    for (var c = 0u; c < HD4; c++) { st4(1u, r.y, r.x, r.z, c, dv[c]); }
  }
}
