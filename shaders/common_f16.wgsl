// Helpers of the f16 shaders (those that begin `enable f16;`), put in after common.wgsl by the
// loader, as it is.

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
