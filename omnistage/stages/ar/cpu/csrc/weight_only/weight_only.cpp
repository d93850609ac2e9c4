// Linears at decode batch sizes on AVX2 (built by native.py as their own library, so CPUs without AVX-512
// have them too). Weight-only quantized ones here: out[r, n] = sum_k x[r, k] * w[n, k], float32
// activations, the weight read row by row in groups of 32 input columns:
//   4-bit:   w = q * d + m, q in 0..15, two per byte (byte j of a group: q[j] low nibble, q[j + 16] high),
//            each group with its own float scale d and offset m; llama.cpp's Q4_1 (and Q4_0, m = -8d).
//   8-bit:   w = q * d, q int8; llama.cpp's Q8_0.
// A group's weights are loaded (and widened to float) once per block of up to kRows activation rows and
// multiplied into each row's accumulators, so a lone sequence's step reads the weight once, and a quantized
// one a quarter (8-bit) or an eighth (4-bit, plus the scales) of float32's bytes. Output features are split
// across torch's threads. Float32 linears are float_gemm.cpp's (summed in oneDNN's order).

#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "float_gemm.h"

namespace {

constexpr int64_t kGroup = 32;
constexpr int64_t kRows = 8;      // activation rows sharing one widening of the weights
constexpr int64_t kGrain = 16;    // output features a thread takes at least

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline __m256 widen_u8(__m128i bytes) { return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes)); }
inline __m256 widen_i8(__m128i bytes) { return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes)); }

// The 32 float weights of one group, in four vectors of eight columns.
struct Int4 {
  const uint8_t* q;  // [N, K / 2]
  const float* d;    // [N, K / 32]
  const float* m;
  int64_t k;
  inline void group(int64_t n, int64_t g, __m256 w[4]) const {
    const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + n * (k / 2) + g * 16));
    const __m128i nibble = _mm_set1_epi8(0x0F);
    const __m128i lo = _mm_and_si128(bytes, nibble);
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(bytes, 4), nibble);
    const int64_t at = n * (k / kGroup) + g;
    const __m256 dv = _mm256_set1_ps(d[at]), mv = _mm256_set1_ps(m[at]);
    w[0] = _mm256_fmadd_ps(widen_u8(lo), dv, mv);
    w[1] = _mm256_fmadd_ps(widen_u8(_mm_srli_si128(lo, 8)), dv, mv);
    w[2] = _mm256_fmadd_ps(widen_u8(hi), dv, mv);
    w[3] = _mm256_fmadd_ps(widen_u8(_mm_srli_si128(hi, 8)), dv, mv);
  }
};

struct Int8 {
  const int8_t* q;  // [N, K]
  const float* d;   // [N, K / 32]
  int64_t k;
  inline void group(int64_t n, int64_t g, __m256 w[4]) const {
    const int8_t* at = q + n * k + g * kGroup;
    const __m256 dv = _mm256_set1_ps(d[n * (k / kGroup) + g]);
    for (int i = 0; i < 4; ++i) {
      const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(at + 8 * i));
      w[i] = _mm256_mul_ps(widen_i8(bytes), dv);
    }
  }
};

// out[r, n] for rows r0 .. r0 + R and features n0 .. n1 of a row stride `n_out`, F features at
// a time (independent chains for the FMA units: a lone row's step would otherwise wait on its accumulators'
// latency).
template <int R, int F, int A, typename W>
void block(const W& weights, const float* x, float* out, int64_t k, int64_t n_out, int64_t r0, int64_t n0,
           int64_t n1) {
  const int64_t groups = k / kGroup;
  int64_t n = n0;
  for (; n + F <= n1; n += F) {
    __m256 acc[F][R][A];
    for (int f = 0; f < F; ++f)
      for (int r = 0; r < R; ++r)
        for (int a = 0; a < A; ++a) acc[f][r][a] = _mm256_setzero_ps();
    for (int64_t g = 0; g < groups; ++g) {
      __m256 w[F][4];
      for (int f = 0; f < F; ++f) weights.group(n + f, g, w[f]);
      for (int r = 0; r < R; ++r) {
        const float* xr = x + (r0 + r) * k + g * kGroup;
        for (int i = 0; i < 4; ++i) {
          const __m256 xv = _mm256_loadu_ps(xr + 8 * i);
          for (int f = 0; f < F; ++f) acc[f][r][i % A] = _mm256_fmadd_ps(w[f][i], xv, acc[f][r][i % A]);
        }
      }
    }
    for (int f = 0; f < F; ++f)
      for (int r = 0; r < R; ++r) {
        __m256 sum = acc[f][r][0];
        for (int a = 1; a < A; ++a) sum = _mm256_add_ps(sum, acc[f][r][a]);
        out[(r0 + r) * n_out + n + f] = hsum(sum);
      }
  }
  if (n < n1) block<R, 1, A>(weights, x, out, k, n_out, r0, n, n1);
}

// x @ weights.T into `out` [rows, n], rows in blocks of kRows;
// fewer rows take more features and two accumulators at a time, for independent FMA chains (their results
// may differ by batch shape in the last bits, as oneDNN's did).
template <typename W>
void into(const W& weights, const float* x, int64_t rows, int64_t k, int64_t n, float* out) {
  at::parallel_for(0, n, kGrain, [&](int64_t n0, int64_t n1) {
    int64_t r = 0;
    for (; r + kRows <= rows; r += kRows) block<kRows, 1, 1>(weights, x, out, k, n, r, n0, n1);
    switch (rows - r) {
      case 7: block<7, 1, 1>(weights, x, out, k, n, r, n0, n1); break;
      case 6: block<6, 1, 1>(weights, x, out, k, n, r, n0, n1); break;
      case 5: block<5, 1, 1>(weights, x, out, k, n, r, n0, n1); break;
      case 4: block<4, 1, 2>(weights, x, out, k, n, r, n0, n1); break;
      case 3: block<3, 1, 2>(weights, x, out, k, n, r, n0, n1); break;
      case 2: block<2, 2, 2>(weights, x, out, k, n, r, n0, n1); break;
      case 1: block<1, 2, 2>(weights, x, out, k, n, r, n0, n1); break;
      default: break;
    }
  });
}

void check_x(const torch::Tensor& x, int64_t k) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.dim() == 2 && x.size(1) == k && x.is_contiguous(),
              "native linear: x must be contiguous float32 [rows, ", k, "]");
  TORCH_CHECK(k % kGroup == 0, "native linear: input width must be a multiple of ", kGroup);
}

template <typename W>
torch::Tensor linear(const torch::Tensor& x, const W& weights, int64_t n_out, int64_t k) {
  check_x(x, k);
  auto out = torch::empty({x.size(0), n_out}, x.options());
  into(weights, x.data_ptr<float>(), x.size(0), k, n_out, out.data_ptr<float>());
  return out;
}

void check_scales(const torch::Tensor& s, int64_t n, int64_t k) {
  TORCH_CHECK(s.scalar_type() == at::kFloat && s.is_contiguous() && s.numel() == n * (k / kGroup),
              "weight-only linear: scales must be contiguous float32 [", n, ", ", k / kGroup, "]");
}

torch::Tensor int4_linear(torch::Tensor x, torch::Tensor q, torch::Tensor d, torch::Tensor m) {
  TORCH_CHECK(q.scalar_type() == at::kByte && q.dim() == 2 && q.is_contiguous(), "int4 weights: uint8 [N, K/2]");
  const int64_t n = q.size(0), k = q.size(1) * 2;
  check_scales(d, n, k);
  check_scales(m, n, k);
  return linear(x, Int4{q.data_ptr<uint8_t>(), d.data_ptr<float>(), m.data_ptr<float>(), k}, n, k);
}

torch::Tensor int8_linear(torch::Tensor x, torch::Tensor q, torch::Tensor d) {
  TORCH_CHECK(q.scalar_type() == at::kChar && q.dim() == 2 && q.is_contiguous(), "int8 weights: int8 [N, K]");
  const int64_t n = q.size(0), k = q.size(1);
  check_scales(d, n, k);
  return linear(x, Int8{q.data_ptr<int8_t>(), d.data_ptr<float>(), k}, n, k);
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("pack_float", &float_gemm::pack, "float32 weights [N, K] as float_linear's panels");
  m.def("float_linear", &float_gemm::linear, "x @ W.T + b for float32 weights packed by pack_float",
        py::arg("x"), py::arg("panels"), py::arg("n"), py::arg("bias"), py::arg("block_k"));
  m.def("int4_linear", &int4_linear, "x @ W.T for 4-bit weights in groups of 32 (w = q * d + m)");
  m.def("int8_linear", &int8_linear, "x @ W.T for 8-bit weights in groups of 32 (w = q * d)");
}
