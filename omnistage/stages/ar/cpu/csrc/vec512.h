// AVX-512 helpers shared by the AR engine's native kernels: 16 float lanes loaded from and stored to
// float32 or bfloat16 memory, a vectorized e^x, and the dispatch on those two dtypes.
#pragma once

#include <ATen/Dispatch.h>
#include <c10/util/BFloat16.h>
#include <immintrin.h>

#include <cstdint>

// Runs the lambda with scalar_t = float or c10::BFloat16 (the two dtypes the kernels take); others raise.
#define OMNI_DISPATCH_FLOAT_BF16(type, name, ...) \
  AT_DISPATCH_SWITCH(type, name, AT_DISPATCH_CASE(at::kFloat, __VA_ARGS__) AT_DISPATCH_CASE(at::kBFloat16, __VA_ARGS__))

namespace omni_native {

constexpr int64_t kLanes = 16;

inline __mmask16 tail_mask(int64_t left) {
  return left >= kLanes ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << left) - 1);
}

inline __m512 load16(const c10::BFloat16* p) {
  const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}
inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }

// The first lanes of `mask` from p, zero elsewhere (never reads past them).
inline __m512 load16(const c10::BFloat16* p, __mmask16 mask) {
  const __m256i raw = _mm256_maskz_loadu_epi16(mask, p);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}
inline __m512 load16(const float* p, __mmask16 mask) { return _mm512_maskz_loadu_ps(mask, p); }

// float32 -> bfloat16 bits, rounded to nearest even as c10::BFloat16 rounds (NaN -> 0x7FC0).
inline __m256i to_bf16_bits(__m512 f) {
  const __m512i bits = _mm512_castps_si512(f);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  __m512i rounded = _mm512_add_epi32(bits, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF)));
  rounded = _mm512_mask_blend_epi32(_mm512_cmp_ps_mask(f, f, _CMP_UNORD_Q), rounded,
                                    _mm512_set1_epi32(0x7FC00000));
  return _mm512_cvtepi32_epi16(_mm512_srli_epi32(rounded, 16));
}

inline void store16(c10::BFloat16* p, __m512 f, __mmask16 mask) {
  _mm256_mask_storeu_epi16(p, mask, to_bf16_bits(f));
}
inline void store16(float* p, __m512 f, __mmask16 mask) { _mm512_mask_storeu_ps(p, mask, f); }

// f rounded to T's precision and back: what storing a torch op's result in a T tensor does to it.
inline __m512 round_to(__m512 f, const c10::BFloat16*) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(to_bf16_bits(f)), 16));
}
inline __m512 round_to(__m512 f, const float*) { return f; }

// e^x to about 1 ulp (the Cephes expf polynomial after reducing x by multiples of ln 2).
inline __m512 exp16(__m512 x) {
  x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(88.f)), _mm512_set1_ps(-87.f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.f)));
  return _mm512_scalef_ps(p, n);
}

}  // namespace omni_native
