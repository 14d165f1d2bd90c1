enable f16;
// Products in f16: the matmul templates (matmul.wgsl, matmul_tiled.wgsl) as the f16 precision
// takes them, with the names products_f32.wgsl defines. Each product is one f16 multiply (the
// packed rate GPUs double), widened to float32 and added: the sums are never f16. A half operand
// or out is WGSL's f16 (bindings 3, 4, 7, scalar and vec4 views); a float32 operand (the
// backward's gradients) is rounded to f16 as it is read, as PyTorch's autocast casts it; past
// f16's range it becomes inf, which the loss scaler sees (to_f16, common_f16.wgsl).

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
