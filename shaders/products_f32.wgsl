// Products in float32: the matmul templates (matmul.wgsl, matmul_tiled.wgsl) as the f32 and bf16
// precisions take them. The loader (gpu.kernel's products="f32") puts this file in front of a
// template, after common.wgsl; products_f16.wgsl defines the same names for f16 products, and a
// new precision's products are a third such file, not another copy of each matmul.
// A template binds a float32 operand at binding 1 or 2 and float32 out at 6 itself; a half
// operand or out is bound at 3, 4 or 7, declared here as the half type is stored: bf16, two to a
// u32 (element 2i in the low 16 bits, common.wgsl). Each binding has a scalar view (…1, the
// scalar template's) and a vec4 view (…4, the tiled one's); an entry point uses one of them.

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
