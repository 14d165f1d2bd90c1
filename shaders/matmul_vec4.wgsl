//#if sg
enable subgroups;
//#endif
// The trainer's float32 matmuls, read as vec4, for shapes where K and N (and M for
// matmul_atb) are multiples of 4; matmul.wgsl serves every other shape. Two algorithms: the vec4
// kernels below, and the sg section's (after them) for adapters with subgroups.
//   matmul_vec4      out[M,N] = A[M,K]   @ B[K,N] (+ bias)
//   matmul_abt_vec4  out[M,N] = A[M,K]   @ B[N,K]^T
//   matmul_atb_vec4  out[M,N] = A[K,M]^T @ B[K,N]
//
// A workgroup owns 16 whole rows; its WX invocations each own 4 columns, and
// keep the 16 x 4 block as four mat4x4 accumulators (column c of acc_q is
// output row 4q+c). K advances four at a time: one 4x4 block of B per
// invocation (4 vec4 loads) meets the 16 rows of A (16 vec4 loads) in four
// mat4x4 products, 256 multiply-adds.
// Why this shape: lavapipe runs invocations as SIMD lanes and pays per lane
// for a load whose address differs between lanes, but loads an address that
// depends only on the workgroup once for all lanes. A's addresses here depend
// on the workgroup only, so only B's loads are paid per lane, and each B value
// is used 16 times. No workgroup memory, no barriers (dear on lavapipe).
// Rows past M are clamped on load and skipped on store; columns past N are
// clamped likewise.
//
// The sg section: the same matmuls with subgroup broadcasts, for adapters with the
// "subgroup" feature; same bindings, shapes and results as the vec4 kernels
// (K and N multiples of 4, M too for matmul_atb).
//   matmul_sg      out[M,N] = A[M,K]   @ B[K,N] (+ bias)
//   matmul_abt_sg  out[M,N] = A[M,K]   @ B[N,K]^T
//   matmul_atb_sg  out[M,N] = A[K,M]^T @ B[K,N]
//
// A workgroup is one subgroup of 8 lanes and owns TM (16 or 32) rows x 32*NC
// columns of out: each lane keeps NC blocks of TM x 4 (columns 4c4..,
// 4(c4+8).., 4(c4+16)..), each 16 rows as four mat4x4 (column c of acc_q is
// row 4q+c), as the vec4 kernels do. What differs is how A reaches the lanes.
// Why: lavapipe loads storage buffers one lane at a time whatever the address
// (scripts/probe_adapter.py), so the vec4 kernels' 16 A loads per lane per step,
// although all lanes read the same address, cost as much as 16 distinct ones.
// Here each lane loads TM/8 of the TM rows and subgroupBroadcast hands them to
// the others: a register shuffle, not a load. Per lane and k-step of 4, loads
// per multiply-add fall from 20 vec4 per 256 (vec4) to 6 per 256 (TM 16,
// NC 1), 10 per 512 (NC 2) and 12 per 1024 (TM 32, NC 2). Each step measured
// faster (docs/results.md, "How the subgroup matmul was shaped"); NC 3 ran as fast
// as NC 2, no faster (accumulators already spill from the CPU's registers): it is
// there for widths of 24 vec4 columns (N = 96), which it fills exactly.
// The lane indexing assumes subgroups of at least 8 lanes holding the whole
// workgroup; device/planner.py checks these kernels against NumPy before using them.
// Rows past M are clamped on load and skipped on store; columns past N
// likewise. Every lane runs the whole loop (broadcasts need all 8).
//
// The turned matmuls: A @ B (+ bias) or A @ B^T (+=), then RoPE (rope.wgsl's rope_forward) where
// out is stored, for the projections that write a rotary model's q and k. RoPE pairs channel i
// of a head with channel i + hd/2; a tile of contiguous columns holds one, not both. So here an
// invocation's two column blocks are the two halves of a pair: vec4 column j of a head's first
// half and the same j of its second (HALF4 = hd/8 apart), and it turns its own registers.
//   matmul_rope_vec4, matmul_abt_rope_vec4   the vec4 kernels' walk, two blocks an invocation
//   matmul_rope_sg, matmul_abt_rope_sg       the sg kernels' walk with NC = 2 (hd = 64: the same columns)
// Rows are at positions row % T + offset, as rope_forward's; hd a multiple of 8, N of hd.

// batched: workgroup row z works on the z-th product, its A, B and out sa, sb, so floats on;
// T, offset: the turned matmuls' positions (row i at i % T + offset)
struct Params { M: u32, N: u32, K: u32, has_bias: u32, accumulate: u32, batch: u32, sa: u32, sb: u32, so: u32,
                T: u32, offset: u32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> A: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> B: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read> bias: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read_write> out: array<vec4<f32>>;
@group(0) @binding(5) var<storage, read> cs: array<vec2<f32>>;   // the turned matmuls': (cos, sin) [positions, hd/2]

override WX: u32 = 16u;  // vec4: invocations per workgroup, 4 columns each
override TM: u32 = 16u;  // rows per workgroup: 16 (vec4); 16 or 32 (sg: 32 with at most 2 column blocks)
override HALF4: u32 = 0u;  // the turned matmuls': hd / 8, half a head in vec4 columns (0: not turned)
// HALF4 as a divisor: 1 where it is 0, since Tint (Dawn, Chrome) refuses a division by a constant
// zero in any pipeline of the module, the untaken branches included
override H4: u32 = max(HALF4, 1u);

// this product's first vec4 of A, B and out (all 0 unbatched)
var<private> oa: u32;
var<private> ob: u32;
var<private> oo: u32;

fn batch_at(z: u32) {
  oa = z * (p.sa / 4u);
  ob = z * (p.sb / 4u);
  oo = z * (p.so / 4u);
}

struct Acc { q0: mat4x4<f32>, q1: mat4x4<f32>, q2: mat4x4<f32>, q3: mat4x4<f32> }

fn row(r: u32) -> u32 { return min(r, p.M - 1u); }

// where rows row0 .. row0+15 of a row-major [M, 4*k4] A start (clamped to the last row)
struct Rows16 { r0: u32, r1: u32, r2: u32, r3: u32, r4: u32, r5: u32, r6: u32, r7: u32,
                r8: u32, r9: u32, r10: u32, r11: u32, r12: u32, r13: u32, r14: u32, r15: u32 }

fn rows16(row0: u32, k4: u32) -> Rows16 {
  return Rows16(row(row0) * k4, row(row0 + 1u) * k4, row(row0 + 2u) * k4, row(row0 + 3u) * k4,
                row(row0 + 4u) * k4, row(row0 + 5u) * k4, row(row0 + 6u) * k4, row(row0 + 7u) * k4,
                row(row0 + 8u) * k4, row(row0 + 9u) * k4, row(row0 + 10u) * k4, row(row0 + 11u) * k4,
                row(row0 + 12u) * k4, row(row0 + 13u) * k4, row(row0 + 14u) * k4, row(row0 + 15u) * k4);
}

fn store(acc: Acc, row0: u32, c4: u32, live: bool) {
  if (!live) { return; }
  let n4 = p.N / 4u;
  var b = vec4<f32>();
  if (p.has_bias != 0u) { b = bias[c4]; }
  for (var q = 0u; q < 4u; q++) {
    var m: mat4x4<f32>;
    switch q { case 0u: { m = acc.q0; } case 1u: { m = acc.q1; } case 2u: { m = acc.q2; } default: { m = acc.q3; } }
    for (var c = 0u; c < 4u; c++) {
      let i = row0 + 4u * q + c;
      if (i < p.M) {
        var v = m[c] + b;
        if (p.accumulate != 0u) { v += out[oo + i * n4 + c4]; }
        out[oo + i * n4 + c4] = v;
      }
    }
  }
}

// The turned matmuls' store: rows row0.. of a pair's halves, x1 at vec4 column ca (a head's
// first half) and x2 at cb = ca + HALF4, bias (and what out holds, accumulating) added, then
// turned at each row's position as rope_forward turns: (x1 cos - x2 sin, x2 cos + x1 sin).
fn turn_store(x1: Acc, x2: Acc, row0: u32, ca: u32, cb: u32, live: bool) {
  if (!live) { return; }
  let n4 = p.N / 4u;
  var b1 = vec4<f32>();
  var b2 = vec4<f32>();
  if (p.has_bias != 0u) { b1 = bias[ca]; b2 = bias[cb]; }
  let i0 = 4u * (ca % (2u * H4));        // the block's first channel in its head, < hd/2
  for (var q = 0u; q < 4u; q++) {
    var m1: mat4x4<f32>;
    var m2: mat4x4<f32>;
    switch q {
      case 0u: { m1 = x1.q0; m2 = x2.q0; }
      case 1u: { m1 = x1.q1; m2 = x2.q1; }
      case 2u: { m1 = x1.q2; m2 = x2.q2; }
      default: { m1 = x1.q3; m2 = x2.q3; }
    }
    for (var c = 0u; c < 4u; c++) {
      let i = row0 + 4u * q + c;
      if (i < p.M) {
        var v1 = m1[c] + b1;
        var v2 = m2[c] + b2;
        if (p.accumulate != 0u) { v1 += out[oo + i * n4 + ca]; v2 += out[oo + i * n4 + cb]; }
        let t = (i % p.T + p.offset) * (4u * HALF4) + i0;    // the table's row: position * hd/2
        let y = turn4(v1, v2, cs[t], cs[t + 1u], cs[t + 2u], cs[t + 3u]);
        out[oo + i * n4 + ca] = y.x1;
        out[oo + i * n4 + cb] = y.x2;
      }
    }
  }
}

// The turned matmuls' vec4 columns: pair q (of N/8) is column j = q % HALF4 of head q / HALF4's
// first half, and the same column of its second half
fn pair_cols(q: u32) -> vec2<u32> {
  let ca = (q / H4) * 2u * H4 + q % H4;
  return vec2<u32>(ca, ca + HALF4);
}

// B's 4x4 block at k = 4kk.. for output columns 4c4..: as columns (B rows k..k+3 at the
// 4 columns) for A @ B, or transposed from B's rows 4c4.. for A @ B^T (tb)
fn b_block(c4: u32, kk: u32, tb: bool) -> mat4x4<f32> {
  if (tb) {
    let k4 = p.K / 4u;
    let j = 4u * c4;
    return transpose(mat4x4<f32>(B[ob + j * k4 + kk], B[ob + (j + 1u) * k4 + kk], B[ob + (j + 2u) * k4 + kk], B[ob + (j + 3u) * k4 + kk]));
  }
  let n4 = p.N / 4u;
  let k = 4u * kk;
  return mat4x4<f32>(B[ob + k * n4 + c4], B[ob + (k + 1u) * n4 + c4], B[ob + (k + 2u) * n4 + c4], B[ob + (k + 3u) * n4 + c4]);
}

// A @ B (tb = false) or A @ B^T (tb = true): the same walk, only B's 4x4 block is read differently.
fn a_times_b(wid: vec3<u32>, lid: u32, tb: bool) {
  let n4 = p.N / 4u;
  let k4 = p.K / 4u;
  let cw = wid.x * WX + lid;
  let c4 = min(cw, n4 - 1u);
  let row0 = wid.y * TM;
  let a = rows16(row0, k4);
  var acc: Acc;
  for (var kk = 0u; kk < k4; kk++) {
    let bm = b_block(c4, kk, tb);
    acc.q0 += bm * mat4x4<f32>(A[oa + a.r0 + kk], A[oa + a.r1 + kk], A[oa + a.r2 + kk], A[oa + a.r3 + kk]);
    acc.q1 += bm * mat4x4<f32>(A[oa + a.r4 + kk], A[oa + a.r5 + kk], A[oa + a.r6 + kk], A[oa + a.r7 + kk]);
    acc.q2 += bm * mat4x4<f32>(A[oa + a.r8 + kk], A[oa + a.r9 + kk], A[oa + a.r10 + kk], A[oa + a.r11 + kk]);
    acc.q3 += bm * mat4x4<f32>(A[oa + a.r12 + kk], A[oa + a.r13 + kk], A[oa + a.r14 + kk], A[oa + a.r15 + kk]);
  }
  store(acc, row0, c4, cw < n4);
}

@compute @workgroup_size(WX)
fn matmul_vec4(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  batch_at(wid.z);
  a_times_b(wid, lid, false);
}

@compute @workgroup_size(WX)
fn matmul_abt_vec4(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  batch_at(wid.z);
  a_times_b(wid, lid, true);
}

// acc + bm times 16 rows of A at one k-step, four at a time in r (rows 4q.. in r's q-th matrix)
fn mac_rows(acc: Acc, bm: mat4x4<f32>, r: Acc) -> Acc {
  return Acc(acc.q0 + bm * r.q0, acc.q1 + bm * r.q1, acc.q2 + bm * r.q2, acc.q3 + bm * r.q3);
}

// The vec4 walk over a pair's two blocks: the 16 rows of A, loaded once, meet both.
fn turned_vec4(wid: vec3<u32>, lid: u32, tb: bool) {
  let n4 = p.N / 4u;
  let k4 = p.K / 4u;
  let q = wid.x * WX + lid;
  let pc = min(pair_cols(q), vec2<u32>(n4 - 1u));
  let row0 = wid.y * TM;
  let a = rows16(row0, k4);
  var x1: Acc;
  var x2: Acc;
  for (var kk = 0u; kk < k4; kk++) {
    let r = Acc(mat4x4<f32>(A[oa + a.r0 + kk], A[oa + a.r1 + kk], A[oa + a.r2 + kk], A[oa + a.r3 + kk]),
                mat4x4<f32>(A[oa + a.r4 + kk], A[oa + a.r5 + kk], A[oa + a.r6 + kk], A[oa + a.r7 + kk]),
                mat4x4<f32>(A[oa + a.r8 + kk], A[oa + a.r9 + kk], A[oa + a.r10 + kk], A[oa + a.r11 + kk]),
                mat4x4<f32>(A[oa + a.r12 + kk], A[oa + a.r13 + kk], A[oa + a.r14 + kk], A[oa + a.r15 + kk]));
    x1 = mac_rows(x1, b_block(pc.x, kk, tb), r);      // the 16 rows, loaded once, meet both blocks
    x2 = mac_rows(x2, b_block(pc.y, kk, tb), r);
  }
  turn_store(x1, x2, row0, pc.x, pc.y, q < n4 / 2u);
}

@compute @workgroup_size(WX)
fn matmul_rope_vec4(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  turned_vec4(wid, lid, false);
}

@compute @workgroup_size(WX)
fn matmul_abt_rope_vec4(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  turned_vec4(wid, lid, true);
}

@compute @workgroup_size(WX)
fn matmul_atb_vec4(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  batch_at(wid.z);
  let n4 = p.N / 4u;
  let m4 = p.M / 4u;
  let cw = wid.x * WX + lid;
  let c4 = min(cw, n4 - 1u);
  let row0 = wid.y * TM;
  let r0 = min(row0 / 4u, m4 - 1u);        // A's columns row0.. as vec4 groups
  let r1 = min(row0 / 4u + 1u, m4 - 1u);
  let r2 = min(row0 / 4u + 2u, m4 - 1u);
  let r3 = min(row0 / 4u + 3u, m4 - 1u);
  var acc: Acc;
  for (var k = 0u; k < p.K; k++) {
    let b = B[ob + k * n4 + c4];
    let s = oa + k * m4;
    // outer products: column c of acc_q gains b * A[k, 4q + c]
    let x0 = A[s + r0];
    acc.q0 += mat4x4<f32>(b * x0.x, b * x0.y, b * x0.z, b * x0.w);
    let x1 = A[s + r1];
    acc.q1 += mat4x4<f32>(b * x1.x, b * x1.y, b * x1.z, b * x1.w);
    let x2 = A[s + r2];
    acc.q2 += mat4x4<f32>(b * x2.x, b * x2.y, b * x2.z, b * x2.w);
    let x3 = A[s + r3];
    acc.q3 += mat4x4<f32>(b * x3.x, b * x3.y, b * x3.z, b * x3.w);
  }
  store(acc, row0, c4, cw < n4);
}

//#if sg

override NC: u32 = 2u;   // column blocks per lane, 1 to 3 (device/kernels.py picks what wastes fewest lanes)
const LANES: u32 = 8u;   // invocations per workgroup, 4 columns per block each

// this lane's column blocks: the vec4 column index of each (clamped) and whether it is real
struct Cols { a: u32, b: u32, c: u32, live_a: bool, live_b: bool, live_c: bool }

fn cols(wid: vec3<u32>, lane: u32) -> Cols {
  let n4 = p.N / 4u;
  if (HALF4 > 0u) {                        // turned (NC = 2): blocks a and b are a pair's halves
    let q = wid.x * LANES + lane;
    let pc = pair_cols(q);
    let live = q < n4 / 2u;
    return Cols(min(pc.x, n4 - 1u), min(pc.y, n4 - 1u), 0u, live, live, false);
  }
  let ca = wid.x * LANES * NC + lane;
  let cb = ca + LANES;
  let cc = ca + 2u * LANES;
  return Cols(min(ca, n4 - 1u), min(cb, n4 - 1u), min(cc, n4 - 1u),
              (ca < n4), (NC >= 2u) && (cb < n4), (NC >= 3u) && (cc < n4));
}

// the workgroup's tile: rows row0.. of column blocks a, b, c (NC >= 2, 3), and rows row0+16..
// of blocks a, b (TM = 32)
fn store_tile(acc: Acc, acc2: Acc, acc3: Acc, hi: Acc, hi2: Acc, row0: u32, c: Cols) {
  store(acc, row0, c.a, c.live_a);
  if (NC >= 2u) { store(acc2, row0, c.b, c.live_b); }
  if (NC >= 3u) { store(acc3, row0, c.c, c.live_c); }
  if (TM == 32u) {
    store(hi, row0 + 16u, c.a, c.live_a);
    if (NC >= 2u) { store(hi2, row0 + 16u, c.b, c.live_b); }
  }
}

// acc (one 16-row, 4-column block) += bm (B's 4x4 block) times the 16 rows of A that
// lanes hold in x0 (rows 0-7) and x1 (rows 8-15)
fn mac16(acc: ptr<function, Acc>, bm: mat4x4<f32>, x0: vec4<f32>, x1: vec4<f32>) {
  (*acc).q0 += bm * rows_of(x0, x1, 0u);
  (*acc).q1 += bm * rows_of(x0, x1, 1u);
  (*acc).q2 += bm * rows_of(x0, x1, 2u);
  (*acc).q3 += bm * rows_of(x0, x1, 3u);
}

// The workgroup's tile as a_times_b_sg leaves it: rows 0-15 of column blocks a, b, c (NC >= 2, 3),
// rows 16-31 (TM = 32) of blocks a, b; which columns they are; the first row
struct Tile { acc: Acc, acc2: Acc, acc3: Acc, hi: Acc, hi2: Acc, c: Cols, row0: u32 }

// A @ B (tb = false) or A @ B^T (tb = true): only B's 4x4 blocks are read differently.
// Lane l loads rows l, 8+l (and 16+l, 24+l when TM = 32) of the workgroup's A rows.
fn a_times_b_sg(wid: vec3<u32>, lane: u32, tb: bool) -> Tile {
  let k4 = p.K / 4u;
  let c = cols(wid, lane);
  let row0 = wid.y * TM;
  let a0 = oa + row(row0 + lane) * k4;
  let a1 = oa + row(row0 + 8u + lane) * k4;
  let a2 = oa + row(row0 + 16u + lane) * k4;
  let a3 = oa + row(row0 + 24u + lane) * k4;
  var acc: Acc;    // rows 0-15 of column blocks a, b, c (NC >= 2, 3)
  var acc2: Acc;
  var acc3: Acc;
  var hi: Acc;     // rows 16-31 (TM = 32) of column blocks a, b
  var hi2: Acc;
  for (var kk = 0u; kk < k4; kk++) {
    let bm = b_block(c.a, kk, tb);
    var bm2: mat4x4<f32>;
    var bm3: mat4x4<f32>;
    if (NC >= 2u) { bm2 = b_block(c.b, kk, tb); }
    if (NC >= 3u) { bm3 = b_block(c.c, kk, tb); }
    let x0 = A[a0 + kk];
    let x1 = A[a1 + kk];
    mac16(&acc, bm, x0, x1);
    if (NC >= 2u) { mac16(&acc2, bm2, x0, x1); }
    if (NC >= 3u) { mac16(&acc3, bm3, x0, x1); }
    if (TM == 32u) {
      let x2 = A[a2 + kk];
      let x3 = A[a3 + kk];
      mac16(&hi, bm, x2, x3);
      if (NC >= 2u) { mac16(&hi2, bm2, x2, x3); }
    }
  }
  return Tile(acc, acc2, acc3, hi, hi2, c, row0);
}

@compute @workgroup_size(LANES)
fn matmul_sg(@builtin(workgroup_id) wid: vec3<u32>, @builtin(subgroup_invocation_id) lane: u32) {
  batch_at(wid.z);
  let t = a_times_b_sg(wid, lane, false);
  store_tile(t.acc, t.acc2, t.acc3, t.hi, t.hi2, t.row0, t.c);
}

@compute @workgroup_size(LANES)
fn matmul_abt_sg(@builtin(workgroup_id) wid: vec3<u32>, @builtin(subgroup_invocation_id) lane: u32) {
  batch_at(wid.z);
  let t = a_times_b_sg(wid, lane, true);
  store_tile(t.acc, t.acc2, t.acc3, t.hi, t.hi2, t.row0, t.c);
}

// the turned sg matmuls (HALF4 > 0, NC = 2): blocks a and b are a pair's halves
fn turn_tile(t: Tile) {
  turn_store(t.acc, t.acc2, t.row0, t.c.a, t.c.b, t.c.live_a);
  if (TM == 32u) { turn_store(t.hi, t.hi2, t.row0 + 16u, t.c.a, t.c.b, t.c.live_a); }
}

@compute @workgroup_size(LANES)
fn matmul_rope_sg(@builtin(workgroup_id) wid: vec3<u32>, @builtin(subgroup_invocation_id) lane: u32) {
  turn_tile(a_times_b_sg(wid, lane, false));
}

@compute @workgroup_size(LANES)
fn matmul_abt_rope_sg(@builtin(workgroup_id) wid: vec3<u32>, @builtin(subgroup_invocation_id) lane: u32) {
  turn_tile(a_times_b_sg(wid, lane, true));
}

// Four k per step. 16 rows: lane l loads A[k + l/4, the 16 rows] and A[k + 2 + l/4, ...]
// as the vec4 l%4 of them; 32 rows: lane l loads the vec4 l of the 32 rows at k, k+1, k+2
// and k+3. Column c of acc_q gains b * A[k, 4q + c]. Past K, A reads as zeros.
// a0..a3: the same 4 output rows of A at k..k+3; b0..b3: this block's 4 columns of B at k..k+3
fn outer4(b0: vec4<f32>, b1: vec4<f32>, b2: vec4<f32>, b3: vec4<f32>,
          a0: vec4<f32>, a1: vec4<f32>, a2: vec4<f32>, a3: vec4<f32>) -> mat4x4<f32> {
  return mat4x4<f32>(b0 * a0.x + b1 * a1.x + b2 * a2.x + b3 * a3.x, b0 * a0.y + b1 * a1.y + b2 * a2.y + b3 * a3.y,
                     b0 * a0.z + b1 * a1.z + b2 * a2.z + b3 * a3.z, b0 * a0.w + b1 * a1.w + b2 * a2.w + b3 * a3.w);
}

fn a_row(k: u32, col: u32, m4: u32) -> vec4<f32> {
  return select(A[oa + min(k, p.K - 1u) * m4 + col], vec4<f32>(), k >= p.K);
}

fn b_row(k: u32, c4: u32) -> vec4<f32> { return B[ob + min(k, p.K - 1u) * (p.N / 4u) + c4]; }

struct Rows4 { a0: vec4<f32>, a1: vec4<f32>, a2: vec4<f32>, a3: vec4<f32> }   // A's 4 rows at k..k+3
struct ARows16 { s0: Rows4, s1: Rows4, s2: Rows4, s3: Rows4 }                     // 16 rows: s_q = rows 4q..
struct BRows { b0: vec4<f32>, b1: vec4<f32>, b2: vec4<f32>, b3: vec4<f32> }    // B's rows k..k+3 at 4 columns

fn b_rows(k: u32, c4: u32) -> BRows { return BRows(b_row(k, c4), b_row(k + 1u, c4), b_row(k + 2u, c4), b_row(k + 3u, c4)); }

// acc (16 rows, 4 columns) += B's rows k..k+3 at those columns times A's 16 rows at k..k+3
fn outer16(acc: ptr<function, Acc>, b: BRows, a: ARows16) {
  (*acc).q0 += outer4(b.b0, b.b1, b.b2, b.b3, a.s0.a0, a.s0.a1, a.s0.a2, a.s0.a3);
  (*acc).q1 += outer4(b.b0, b.b1, b.b2, b.b3, a.s1.a0, a.s1.a1, a.s1.a2, a.s1.a3);
  (*acc).q2 += outer4(b.b0, b.b1, b.b2, b.b3, a.s2.a0, a.s2.a1, a.s2.a2, a.s2.a3);
  (*acc).q3 += outer4(b.b0, b.b1, b.b2, b.b3, a.s3.a0, a.s3.a1, a.s3.a2, a.s3.a3);
}

// 16 rows: rows 4q..4q+3 at k..k+3 from lanes q and q+4 (x: k, k+1) and the same lanes' y (k+2, k+3)
fn bcast(x: vec4<f32>, y: vec4<f32>, q: u32) -> Rows4 {
  switch q {
    case 0u: { return Rows4(subgroupBroadcast(x, 0u), subgroupBroadcast(x, 4u), subgroupBroadcast(y, 0u), subgroupBroadcast(y, 4u)); }
    case 1u: { return Rows4(subgroupBroadcast(x, 1u), subgroupBroadcast(x, 5u), subgroupBroadcast(y, 1u), subgroupBroadcast(y, 5u)); }
    case 2u: { return Rows4(subgroupBroadcast(x, 2u), subgroupBroadcast(x, 6u), subgroupBroadcast(y, 2u), subgroupBroadcast(y, 6u)); }
    default: { return Rows4(subgroupBroadcast(x, 3u), subgroupBroadcast(x, 7u), subgroupBroadcast(y, 3u), subgroupBroadcast(y, 7u)); }
  }
}

// 32 rows: rows 4q..4q+3 at k..k+3 from lane q's x0..x3 (q = 0..7)
fn bcast32(x0: vec4<f32>, x1: vec4<f32>, x2: vec4<f32>, x3: vec4<f32>, q: u32) -> Rows4 {
  switch q {
    case 0u: { return Rows4(subgroupBroadcast(x0, 0u), subgroupBroadcast(x1, 0u), subgroupBroadcast(x2, 0u), subgroupBroadcast(x3, 0u)); }
    case 1u: { return Rows4(subgroupBroadcast(x0, 1u), subgroupBroadcast(x1, 1u), subgroupBroadcast(x2, 1u), subgroupBroadcast(x3, 1u)); }
    case 2u: { return Rows4(subgroupBroadcast(x0, 2u), subgroupBroadcast(x1, 2u), subgroupBroadcast(x2, 2u), subgroupBroadcast(x3, 2u)); }
    case 3u: { return Rows4(subgroupBroadcast(x0, 3u), subgroupBroadcast(x1, 3u), subgroupBroadcast(x2, 3u), subgroupBroadcast(x3, 3u)); }
    case 4u: { return Rows4(subgroupBroadcast(x0, 4u), subgroupBroadcast(x1, 4u), subgroupBroadcast(x2, 4u), subgroupBroadcast(x3, 4u)); }
    case 5u: { return Rows4(subgroupBroadcast(x0, 5u), subgroupBroadcast(x1, 5u), subgroupBroadcast(x2, 5u), subgroupBroadcast(x3, 5u)); }
    case 6u: { return Rows4(subgroupBroadcast(x0, 6u), subgroupBroadcast(x1, 6u), subgroupBroadcast(x2, 6u), subgroupBroadcast(x3, 6u)); }
    default: { return Rows4(subgroupBroadcast(x0, 7u), subgroupBroadcast(x1, 7u), subgroupBroadcast(x2, 7u), subgroupBroadcast(x3, 7u)); }
  }
}

@compute @workgroup_size(LANES)
fn matmul_atb_sg(@builtin(workgroup_id) wid: vec3<u32>, @builtin(subgroup_invocation_id) lane: u32) {
  batch_at(wid.z);
  let m4 = p.M / 4u;
  let c = cols(wid, lane);
  let row0 = wid.y * TM;
  var acc: Acc;   // rows 0-15 of column blocks a, b, c
  var acc2: Acc;
  var acc3: Acc;
  var hi: Acc;    // rows 16-31 (TM = 32) of column blocks a, b
  var hi2: Acc;
  for (var k = 0u; k < p.K; k += 4u) {
    let ba = b_rows(k, c.a);
    var bb: BRows;
    if (NC >= 2u) { bb = b_rows(k, c.b); }
    if (TM == 32u) {
      // rows 0-15 meet B, then rows 16-31: half the broadcast values live at a time
      let mine = min(row0 / 4u + lane, m4 - 1u);       // the vec4 of the 32 rows this lane loads
      let x0 = a_row(k, mine, m4);
      let x1 = a_row(k + 1u, mine, m4);
      let x2 = a_row(k + 2u, mine, m4);
      let x3 = a_row(k + 3u, mine, m4);
      let lo = ARows16(bcast32(x0, x1, x2, x3, 0u), bcast32(x0, x1, x2, x3, 1u), bcast32(x0, x1, x2, x3, 2u), bcast32(x0, x1, x2, x3, 3u));
      outer16(&acc, ba, lo);
      if (NC >= 2u) { outer16(&acc2, bb, lo); }
      let up = ARows16(bcast32(x0, x1, x2, x3, 4u), bcast32(x0, x1, x2, x3, 5u), bcast32(x0, x1, x2, x3, 6u), bcast32(x0, x1, x2, x3, 7u));
      outer16(&hi, ba, up);
      if (NC >= 2u) { outer16(&hi2, bb, up); }
    } else {
      let mine = min(row0 / 4u + lane % 4u, m4 - 1u);  // the vec4 of the 16 rows this lane loads
      let x = a_row(k + lane / 4u, mine, m4);
      let y = a_row(k + 2u + lane / 4u, mine, m4);
      let lo = ARows16(bcast(x, y, 0u), bcast(x, y, 1u), bcast(x, y, 2u), bcast(x, y, 3u));
      outer16(&acc, ba, lo);
      if (NC >= 2u) { outer16(&acc2, bb, lo); }
      if (NC >= 3u) { outer16(&acc3, b_rows(k, c.c), lo); }
    }
  }
  store_tile(acc, acc2, acc3, hi, hi2, row0, c);
}
//#endif
