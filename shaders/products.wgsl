//#if f16
enable f16;
//#endif
// The products of the matmul templates (matmul.wgsl, matmul_tiled.wgsl): the loader (gpu.kernel's
// fill "f32" or "f16") puts this file in front of a template, after common.wgsl, with the
// section of that product type kept. Each section defines the same names: the type T the products
// are taken in, how a stored half operand is read and how a half result is stored. A new
// precision's products are another section here, not another copy of each matmul.
// A template binds a float32 operand at binding 1 or 2 and float32 out at 6 itself; a half
// operand or out is bound at 3, 4 or 7, declared here as the half type is stored. Each binding
// has a scalar view (…1, the scalar template's) and a vec4 view (…4, the tiled one's); an entry
// point uses one of them.
//#if !f16

// Products in float32, as the f32 and bf16 precisions take them. The half type is bf16, two to a
// u32 (element 2i in the low 16 bits, common.wgsl).
alias T = f32;   // what each product is taken in

@group(0) @binding(3) var<storage, read> AH1: array<u32>;
@group(0) @binding(3) var<storage, read> AH4: array<vec2<u32>>;
@group(0) @binding(4) var<storage, read> BH1: array<u32>;
@group(0) @binding(4) var<storage, read> BH4: array<vec2<u32>>;
@group(0) @binding(7) var<storage, read_write> OH1: array<u32>;
@group(0) @binding(7) var<storage, read_write> OH4: array<vec2<u32>>;

fn bf16_at(w: u32, e: u32) -> f32 { return bitcast<f32>(select(w << 16u, w & 0xffff0000u, (e & 1u) == 1u)); }

fn wide(x: f32) -> T { return x; }                      // a float32 operand's value, as T
fn wide4(x: vec4<f32>) -> vec4<T> { return x; }
fn a_half(e: u32) -> T { return bf16_at(AH1[e / 2u], e); }   // element e of a half operand
fn b_half(e: u32) -> T { return bf16_at(BH1[e / 2u], e); }
fn a_half4(i: u32) -> vec4<T> { return bf16_lo4(AH4[i]); }   // its i-th run of 4 elements
fn b_half4(i: u32) -> vec4<T> { return bf16_lo4(BH4[i]); }

// acc + a * b, one rounding per lane (a fused multiply-add)
fn mac(a: T, b: vec4<T>, acc: vec4<f32>) -> vec4<f32> { return fma(vec4<f32>(a), b, acc); }

// results stored as bf16, rounded to nearest even: elements e, e + 1 (e even), or run i of 4
fn store_half2(e: u32, x: f32, y: f32) { OH1[e / 2u] = bf16_pack(x, y); }
fn store_half4(i: u32, o: vec4<f32>) { OH4[i] = vec2<u32>(bf16_pack(o.x, o.y), bf16_pack(o.z, o.w)); }
//#else

// Products in f16, as the f16 precision takes them. Each product is one f16 multiply (the packed
// rate GPUs double), widened to float32 and added: the sums are never f16. A half operand or out
// is WGSL's f16; a float32 operand (the backward's gradients) is rounded to f16 as it is read, as
// PyTorch's autocast casts it; past f16's range it becomes inf, which the loss scaler sees
// (to_f16, common.wgsl's f16 section).
alias T = f16;

@group(0) @binding(3) var<storage, read> AH1: array<f16>;
@group(0) @binding(3) var<storage, read> AH4: array<vec4<f16>>;
@group(0) @binding(4) var<storage, read> BH1: array<f16>;
@group(0) @binding(4) var<storage, read> BH4: array<vec4<f16>>;
@group(0) @binding(7) var<storage, read_write> OH1: array<f16>;
@group(0) @binding(7) var<storage, read_write> OH4: array<vec4<f16>>;

fn wide(x: f32) -> T { return to_f16(x); }
fn wide4(x: vec4<f32>) -> vec4<T> { return to_f16x4(x); }
fn a_half(e: u32) -> T { return AH1[e]; }
fn b_half(e: u32) -> T { return BH1[e]; }
fn a_half4(i: u32) -> vec4<T> { return AH4[i]; }
fn b_half4(i: u32) -> vec4<T> { return BH4[i]; }

// acc + the f16 products a * b, widened
fn mac(a: T, b: vec4<T>, acc: vec4<f32>) -> vec4<f32> { return acc + vec4<f32>(a * b); }

fn store_half2(e: u32, x: f32, y: f32) { OH1[e] = to_f16(x); OH1[e + 1u] = to_f16(y); }
fn store_half4(i: u32, o: vec4<f32>) { OH4[i] = to_f16x4(o); }
//#endif
