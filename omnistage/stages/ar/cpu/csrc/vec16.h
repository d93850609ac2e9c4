// 16 float lanes for the AR engine's native decoder kernels, on AVX-512 (one register) or AVX2 (two
// halves): loads from and stores to float32 or bfloat16 memory (masked at a row's tail), arithmetic, a
// vectorized e^x, horizontal sums, and the dispatch on those two dtypes. The kernels are written once
// against these; native.py builds them for whichever of the two this CPU has.
#pragma once

#include <ATen/Dispatch.h>
#include <c10/util/BFloat16.h>
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

// Runs the lambda with scalar_t = float or c10::BFloat16 (the two dtypes the kernels take); others raise.
#define OMNI_DISPATCH_FLOAT_BF16(type, name, ...) \
  AT_DISPATCH_SWITCH(type, name, AT_DISPATCH_CASE(at::kFloat, __VA_ARGS__) AT_DISPATCH_CASE(at::kBFloat16, __VA_ARGS__))

namespace omni_native {

constexpr int64_t kLanes = 16;

#if defined(__AVX512F__)

using V = __m512;
using M = __mmask16;  // the lanes a masked load/store touches

inline M tail_mask(int64_t left) {
  return left >= kLanes ? static_cast<M>(0xFFFF) : static_cast<M>((1u << left) - 1);
}
inline V vzero() { return _mm512_setzero_ps(); }
inline V vset1(float x) { return _mm512_set1_ps(x); }
inline V vadd(V a, V b) { return _mm512_add_ps(a, b); }
inline V vsub(V a, V b) { return _mm512_sub_ps(a, b); }
inline V vmul(V a, V b) { return _mm512_mul_ps(a, b); }
inline V vdiv(V a, V b) { return _mm512_div_ps(a, b); }
inline V vfmadd(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
inline V vfnmadd(V a, V b, V c) { return _mm512_fnmadd_ps(a, b, c); }
inline V vmin(V a, V b) { return _mm512_min_ps(a, b); }
inline V vmax(V a, V b) { return _mm512_max_ps(a, b); }
inline V vmask_max(V src, M m, V a, V b) { return _mm512_mask_max_ps(src, m, a, b); }
inline V vmask_add(V src, M m, V a, V b) { return _mm512_mask_add_ps(src, m, a, b); }
inline float vreduce_add(V v) { return _mm512_reduce_add_ps(v); }
inline float vreduce_max(V v) { return _mm512_reduce_max_ps(v); }

inline V load16(const float* p) { return _mm512_loadu_ps(p); }
inline V load16(const float* p, M m) { return _mm512_maskz_loadu_ps(m, p); }
inline void store16(float* p, V f, M m) { _mm512_mask_storeu_ps(p, m, f); }

inline V load16(const c10::BFloat16* p) {
  const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}
// The first lanes of `mask` from p, zero elsewhere (never reads past them).
inline V load16(const c10::BFloat16* p, M m) {
  const __m256i raw = _mm256_maskz_loadu_epi16(m, p);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}

// float32 -> bfloat16 bits, rounded to nearest even as c10::BFloat16 rounds (NaN -> 0x7FC0).
inline __m256i to_bf16_bits(V f) {
  const __m512i bits = _mm512_castps_si512(f);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  __m512i rounded = _mm512_add_epi32(bits, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF)));
  rounded = _mm512_mask_blend_epi32(_mm512_cmp_ps_mask(f, f, _CMP_UNORD_Q), rounded,
                                    _mm512_set1_epi32(0x7FC00000));
  return _mm512_cvtepi32_epi16(_mm512_srli_epi32(rounded, 16));
}
inline void store16(c10::BFloat16* p, V f, M m) { _mm256_mask_storeu_epi16(p, m, to_bf16_bits(f)); }
inline V bf16_bits_to_float(__m256i bits) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
}

inline V round_nearest(V x) { return _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
inline V times_two_to(V p, V n) { return _mm512_scalef_ps(p, n); }  // p * 2^n

// Lane i of the result = the sum of v[i]'s 16 lanes: four rounds of pairwise shuffles and adds (45 ops,
// against some 130 for 16 separate horizontal sums).
inline V sum16x16(V v[16]) {
  V pairs[8], quads[4];
  for (int i = 0; i < 8; ++i)  // per 128-bit chunk: [a0+a2, b0+b2, a1+a3, b1+b3]
    pairs[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
  for (int i = 0; i < 4; ++i)  // per chunk: partial sums of 4 vectors, in order
    quads[i] = _mm512_add_ps(_mm512_shuffle_ps(pairs[2 * i], pairs[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_ps(pairs[2 * i], pairs[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  const V low = _mm512_add_ps(_mm512_shuffle_f32x4(quads[0], quads[1], _MM_SHUFFLE(2, 0, 2, 0)),
                              _mm512_shuffle_f32x4(quads[0], quads[1], _MM_SHUFFLE(3, 1, 3, 1)));
  const V high = _mm512_add_ps(_mm512_shuffle_f32x4(quads[2], quads[3], _MM_SHUFFLE(2, 0, 2, 0)),
                               _mm512_shuffle_f32x4(quads[2], quads[3], _MM_SHUFFLE(3, 1, 3, 1)));
  return _mm512_add_ps(_mm512_shuffle_f32x4(low, high, _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_f32x4(low, high, _MM_SHUFFLE(3, 1, 3, 1)));
}

#else  // AVX2 + FMA: two 8-lane halves

struct V {
  __m256 lo, hi;
};
struct M {
  __m256i lo, hi;  // all ones in the lanes touched
  int64_t count;   // how many (the first ones)
};

inline M tail_mask(int64_t left) {
  const int64_t n = std::min<int64_t>(std::max<int64_t>(left, 0), kLanes);
  const __m256i index = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256i lo_n = _mm256_set1_epi32(static_cast<int>(std::min<int64_t>(n, 8)));
  const __m256i hi_n = _mm256_set1_epi32(static_cast<int>(std::max<int64_t>(n - 8, 0)));
  return {_mm256_cmpgt_epi32(lo_n, index), _mm256_cmpgt_epi32(hi_n, index), n};
}
inline V vzero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
inline V vset1(float x) { return {_mm256_set1_ps(x), _mm256_set1_ps(x)}; }
inline V vadd(V a, V b) { return {_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi)}; }
inline V vsub(V a, V b) { return {_mm256_sub_ps(a.lo, b.lo), _mm256_sub_ps(a.hi, b.hi)}; }
inline V vmul(V a, V b) { return {_mm256_mul_ps(a.lo, b.lo), _mm256_mul_ps(a.hi, b.hi)}; }
inline V vdiv(V a, V b) { return {_mm256_div_ps(a.lo, b.lo), _mm256_div_ps(a.hi, b.hi)}; }
inline V vfmadd(V a, V b, V c) { return {_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)}; }
inline V vfnmadd(V a, V b, V c) { return {_mm256_fnmadd_ps(a.lo, b.lo, c.lo), _mm256_fnmadd_ps(a.hi, b.hi, c.hi)}; }
inline V vmin(V a, V b) { return {_mm256_min_ps(a.lo, b.lo), _mm256_min_ps(a.hi, b.hi)}; }
inline V vmax(V a, V b) { return {_mm256_max_ps(a.lo, b.lo), _mm256_max_ps(a.hi, b.hi)}; }
inline V vblend(V src, M m, V v) {
  return {_mm256_blendv_ps(src.lo, v.lo, _mm256_castsi256_ps(m.lo)),
          _mm256_blendv_ps(src.hi, v.hi, _mm256_castsi256_ps(m.hi))};
}
inline V vmask_max(V src, M m, V a, V b) {
  return vblend(src, m, {_mm256_max_ps(a.lo, b.lo), _mm256_max_ps(a.hi, b.hi)});
}
inline V vmask_add(V src, M m, V a, V b) { return vblend(src, m, vadd(a, b)); }
inline float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
inline float vreduce_add(V v) { return hsum8(_mm256_add_ps(v.lo, v.hi)); }
inline float vreduce_max(V v) {
  __m256 m = _mm256_max_ps(v.lo, v.hi);
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline V load16(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
inline V load16(const float* p, M m) {
  if (m.count == kLanes) return load16(p);
  return {_mm256_maskload_ps(p, m.lo), _mm256_maskload_ps(p + 8, m.hi)};
}
inline void store16(float* p, V f, M m) {
  if (m.count == kLanes) {
    _mm256_storeu_ps(p, f.lo);
    _mm256_storeu_ps(p + 8, f.hi);
    return;
  }
  _mm256_maskstore_ps(p, m.lo, f.lo);
  _mm256_maskstore_ps(p + 8, m.hi, f.hi);
}

inline V bf16_bits_to_float(__m256i bits) {  // 16 bf16 values -> floats
  const __m256i lo = _mm256_cvtepu16_epi32(_mm256_castsi256_si128(bits));
  const __m256i hi = _mm256_cvtepu16_epi32(_mm256_extracti128_si256(bits, 1));
  return {_mm256_castsi256_ps(_mm256_slli_epi32(lo, 16)), _mm256_castsi256_ps(_mm256_slli_epi32(hi, 16))};
}
inline V load16(const c10::BFloat16* p) {
  return bf16_bits_to_float(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
// The first lanes of `mask` from p, zero elsewhere (never reads past them).
inline V load16(const c10::BFloat16* p, M m) {
  if (m.count == kLanes) return load16(p);
  alignas(32) uint16_t buffer[kLanes] = {};
  std::memcpy(buffer, p, m.count * sizeof(uint16_t));
  return bf16_bits_to_float(_mm256_load_si256(reinterpret_cast<const __m256i*>(buffer)));
}

// float32 -> bfloat16 bits, rounded to nearest even as c10::BFloat16 rounds (NaN -> 0x7FC0).
inline __m256i bf16_half(__m256 f) {  // 8 lanes -> 8 rounded values in the low 16 bits of each 32
  const __m256i bits = _mm256_castps_si256(f);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  __m256i rounded = _mm256_add_epi32(bits, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7FFF)));
  const __m256 nan = _mm256_cmp_ps(f, f, _CMP_UNORD_Q);
  rounded = _mm256_castps_si256(
      _mm256_blendv_ps(_mm256_castsi256_ps(rounded), _mm256_castsi256_ps(_mm256_set1_epi32(0x7FC00000)), nan));
  return _mm256_srli_epi32(rounded, 16);
}
inline __m256i to_bf16_bits(V f) {
  const __m256i packed = _mm256_packus_epi32(bf16_half(f.lo), bf16_half(f.hi));  // 128-bit lanes interleaved
  return _mm256_permute4x64_epi64(packed, _MM_SHUFFLE(3, 1, 2, 0));
}
inline void store16(c10::BFloat16* p, V f, M m) {
  const __m256i bits = to_bf16_bits(f);
  if (m.count == kLanes) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), bits);
    return;
  }
  alignas(32) uint16_t buffer[kLanes];
  _mm256_store_si256(reinterpret_cast<__m256i*>(buffer), bits);
  std::memcpy(p, buffer, m.count * sizeof(uint16_t));
}

inline V round_nearest(V x) {
  constexpr int mode = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  return {_mm256_round_ps(x.lo, mode), _mm256_round_ps(x.hi, mode)};
}
// p * 2^n for integral n in [-126, 127] (the exponent field built directly).
inline __m256 times_two_to8(__m256 p, __m256 n) {
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}
inline V times_two_to(V p, V n) { return {times_two_to8(p.lo, n.lo), times_two_to8(p.hi, n.hi)}; }

// Lane i of the result = the sum of v[i]'s 16 lanes.
inline V sum16x16(V v[16]) {
  alignas(32) float sums[kLanes];
  for (int i = 0; i < kLanes; ++i) sums[i] = vreduce_add(v[i]);
  return {_mm256_load_ps(sums), _mm256_load_ps(sums + 8)};
}

#endif

// f rounded to T's precision and back: what storing a torch op's result in a T tensor does to it.
inline V round_to(V f, const c10::BFloat16*) { return bf16_bits_to_float(to_bf16_bits(f)); }
inline V round_to(V f, const float*) { return f; }

// e^x to about 1 ulp (the Cephes expf polynomial after reducing x by multiples of ln 2).
inline V exp16(V x) {
  x = vmax(vmin(x, vset1(88.f)), vset1(-87.f));
  const V n = round_nearest(vmul(x, vset1(1.44269504088896341f)));
  V r = vfnmadd(n, vset1(0.693359375f), x);
  r = vfnmadd(n, vset1(-2.12194440e-4f), r);
  V p = vset1(1.9875691500e-4f);
  p = vfmadd(p, r, vset1(1.3981999507e-3f));
  p = vfmadd(p, r, vset1(8.3334519073e-3f));
  p = vfmadd(p, r, vset1(4.1665795894e-2f));
  p = vfmadd(p, r, vset1(1.6666665459e-1f));
  p = vfmadd(p, r, vset1(5.0000001201e-1f));
  p = vfmadd(vmul(p, r), r, vadd(r, vset1(1.f)));
  return times_two_to(p, n);
}

}  // namespace omni_native
