// Tiled online-softmax attention (FlashAttention-2 style) and its recompute backward.
// Nothing of size T x T exists: the forward keeps, per query row, the running
// max m, the running sum l and the unnormalised output o, and writes out and
// L = m + log l; the backward rebuilds P = exp(S - L) tile by tile.
//   attn_online_forward  workgroup = BQ query rows of one (b, h); K, V tiles stream through workgroup memory
//   attn_online_d        D = rowsum(dO * O), one invocation per (b, h, t)
//   attn_online_dq       workgroup = BQ query rows; K, V tiles stream; dq = sum_j dS_ij k_j
//   attn_online_dkv      workgroup = BK key rows; Q, dO, L, D tiles stream from the diagonal down
// Tiles entirely above the causal diagonal are never visited. No atomics:
// each output row belongs to exactly one invocation. Work O(T^2 hd).
// q, k, v, dout, out: [B, T, C] with heads interleaved; L, D: [B, H, T].

struct Params { B: u32, T: u32, C: u32, H: u32, scale: f32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> q: array<f32>;
@group(0) @binding(2) var<storage, read> k: array<f32>;
@group(0) @binding(3) var<storage, read> v: array<f32>;
@group(0) @binding(4) var<storage, read> dout: array<f32>;  // dO (backward) | unused
@group(0) @binding(5) var<storage, read> Lin: array<f32>;   // L (backward) | unused
@group(0) @binding(6) var<storage, read> Din: array<f32>;   // D (backward) | unused
@group(0) @binding(7) var<storage, read_write> o1: array<f32>;  // out | D | dq | dk
@group(0) @binding(8) var<storage, read_write> o2: array<f32>;  // L | dv

override HD: u32 = 64u;  // head dim, <= HD_MAX
override BQ: u32 = 32u;  // query rows per tile (forward/dq workgroup size; dkv streamed tile)
override BK: u32 = 32u;  // key rows per tile (streamed in forward/dq; dkv workgroup size)
const HD_MAX: u32 = 128u;
const B_MAX: u32 = 64u;
const NEG: f32 = -3.4028235e38;

var<workgroup> t1: array<f32, BK * HD>;  // K tile (forward, dq) | Q tile (dkv)
var<workgroup> t2: array<f32, BK * HD>;  // V tile (forward, dq) | dO tile (dkv)
var<workgroup> tl: array<f32, BK>;       // L of the Q tile (dkv)
var<workgroup> td: array<f32, BK>;       // D of the Q tile (dkv)

fn at(b: u32, t: u32, h: u32, d: u32) -> u32 {
  return (b * p.T + t) * p.C + h * HD + d;
}

// cooperative load of rows r0.. of a [B,T,C] head slice into a tile (zeros past T)
fn load_kv(b: u32, h: u32, r0: u32, n: u32, lid: u32, nthreads: u32) {
  for (var i = lid; i < n * HD; i += nthreads) {
    let r = r0 + i / HD;
    let d = i % HD;
    if (r < p.T) { t1[i] = k[at(b, r, h, d)]; t2[i] = v[at(b, r, h, d)]; }
    else { t1[i] = 0.0; t2[i] = 0.0; }
  }
}

@compute @workgroup_size(BQ)
fn attn_online_forward(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lidv: vec3<u32>) {
  let lid = lidv.x;
  let nq = (p.T + BQ - 1u) / BQ;
  let qt = wid.x % nq;
  let h = (wid.x / nq) % p.H;
  let b = wid.x / (nq * p.H);
  let q0 = qt * BQ;
  let row = q0 + lid;
  let valid = row < p.T;
  let last = min(q0 + BQ, p.T) - 1u;     // last query row of the tile: uniform

  var qr: array<f32, HD_MAX>;
  var o: array<f32, HD_MAX>;
  for (var d = 0u; d < HD; d++) {
    qr[d] = select(0.0, q[at(b, min(row, p.T - 1u), h, d)] * p.scale, valid);
    o[d] = 0.0;
  }
  var m = NEG;
  var l = 0.0;
  var s: array<f32, B_MAX>;
  for (var k0 = 0u; k0 <= last; k0 += BK) {
    workgroupBarrier();                  // previous tile fully consumed
    load_kv(b, h, k0, BK, lid, BQ);
    workgroupBarrier();
    if (valid && k0 <= row) {
      let nk = min(BK, row + 1u - k0);   // causal: keys k0 .. row
      var mt = m;
      for (var j = 0u; j < nk; j++) {
        var acc = 0.0;
        for (var d = 0u; d < HD; d++) { acc = fma(qr[d], t1[j * HD + d], acc); }
        s[j] = acc;
        mt = max(mt, acc);
      }
      let alpha = exp(m - mt);           // rescale what was summed against the old max
      l *= alpha;
      for (var d = 0u; d < HD; d++) { o[d] *= alpha; }
      for (var j = 0u; j < nk; j++) {
        let e = exp(s[j] - mt);
        l += e;
        for (var d = 0u; d < HD; d++) { o[d] = fma(e, t2[j * HD + d], o[d]); }
      }
      m = mt;
    }
  }
  if (valid) {
    let inv = 1.0 / l;
    for (var d = 0u; d < HD; d++) { o1[at(b, row, h, d)] = o[d] * inv; }
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
  for (var d = 0u; d < HD; d++) { s = fma(q[at(b, t, h, d)], k[at(b, t, h, d)], s); }
  o1[i] = s;
}

@compute @workgroup_size(BQ)
fn attn_online_dq(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lidv: vec3<u32>) {
  let lid = lidv.x;
  let nq = (p.T + BQ - 1u) / BQ;
  let qt = wid.x % nq;
  let h = (wid.x / nq) % p.H;
  let b = wid.x / (nq * p.H);
  let q0 = qt * BQ;
  let row = q0 + lid;
  let valid = row < p.T;
  let rr = min(row, p.T - 1u);
  let last = min(q0 + BQ, p.T) - 1u;

  var qr: array<f32, HD_MAX>;
  var dor: array<f32, HD_MAX>;
  var dq: array<f32, HD_MAX>;
  for (var d = 0u; d < HD; d++) {
    qr[d] = q[at(b, rr, h, d)] * p.scale;
    dor[d] = dout[at(b, rr, h, d)];
    dq[d] = 0.0;
  }
  let li = Lin[(b * p.H + h) * p.T + rr];
  let di = Din[(b * p.H + h) * p.T + rr];
  for (var k0 = 0u; k0 <= last; k0 += BK) {
    workgroupBarrier();
    load_kv(b, h, k0, BK, lid, BQ);
    workgroupBarrier();
    if (valid && k0 <= row) {
      let nk = min(BK, row + 1u - k0);
      for (var j = 0u; j < nk; j++) {
        var sc = 0.0;
        var dp = 0.0;
        for (var d = 0u; d < HD; d++) {
          sc = fma(qr[d], t1[j * HD + d], sc);
          dp = fma(dor[d], t2[j * HD + d], dp);
        }
        let ds = exp(sc - li) * (dp - di) * p.scale;
        for (var d = 0u; d < HD; d++) { dq[d] = fma(ds, t1[j * HD + d], dq[d]); }
      }
    }
  }
  if (valid) {
    for (var d = 0u; d < HD; d++) { o1[at(b, row, h, d)] = dq[d]; }
  }
}

// workgroup = BK key rows; the streamed query tiles have BK rows too (the
// workgroup tiles reuse t1/t2 sized BK * HD), starting at the key tile's diagonal.
@compute @workgroup_size(BK)
fn attn_online_dkv(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lidv: vec3<u32>) {
  let lid = lidv.x;
  let nk = (p.T + BK - 1u) / BK;
  let kt = wid.x % nk;
  let h = (wid.x / nk) % p.H;
  let b = wid.x / (nk * p.H);
  let k0 = kt * BK;
  let col = k0 + lid;
  let valid = col < p.T;
  let cc = min(col, p.T - 1u);

  var kr: array<f32, HD_MAX>;
  var vr: array<f32, HD_MAX>;
  var dk: array<f32, HD_MAX>;
  var dv: array<f32, HD_MAX>;
  for (var d = 0u; d < HD; d++) {
    kr[d] = k[at(b, cc, h, d)];
    vr[d] = v[at(b, cc, h, d)];
    dk[d] = 0.0;
    dv[d] = 0.0;
  }
  let lbase = (b * p.H + h) * p.T;
  for (var q0 = k0; q0 < p.T; q0 += BK) {
    workgroupBarrier();
    for (var i = lid; i < BK * HD; i += BK) {
      let r = q0 + i / HD;
      let d = i % HD;
      if (r < p.T) { t1[i] = q[at(b, r, h, d)] * p.scale; t2[i] = dout[at(b, r, h, d)]; }
      else { t1[i] = 0.0; t2[i] = 0.0; }
    }
    for (var i = lid; i < BK; i += BK) {
      let r = min(q0 + i, p.T - 1u);
      tl[i] = Lin[lbase + r];
      td[i] = Din[lbase + r];
    }
    workgroupBarrier();
    if (valid) {
      let first = select(0u, col - q0, col > q0);       // causal: rows >= col
      let nr = min(BK, p.T - q0);
      for (var i = first; i < nr; i++) {
        var sc = 0.0;
        var dp = 0.0;
        for (var d = 0u; d < HD; d++) {
          sc = fma(t1[i * HD + d], kr[d], sc);
          dp = fma(t2[i * HD + d], vr[d], dp);
        }
        let pij = exp(sc - tl[i]);
        let ds = pij * (dp - td[i]);
        for (var d = 0u; d < HD; d++) {
          dv[d] = fma(pij, t2[i * HD + d], dv[d]);
          dk[d] = fma(ds, t1[i * HD + d], dk[d]);   // t1 holds q * scale: dk = sum ds * q * scale
        }
      }
    }
  }
  if (valid) {
    for (var d = 0u; d < HD; d++) { o1[at(b, col, h, d)] = dk[d]; o2[at(b, col, h, d)] = dv[d]; }
  }
}
