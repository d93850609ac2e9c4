// Linears at decode batch sizes on AVX2 (built by native.py as their own library, so CPUs without AVX-512
// have them too): out[r, n] = sum_k x[r, k] * w[n, k] (+ b[n]), float32 activations, the weight read row
// by row in groups of 32 input columns:
//   float32: the weight as it is (packed_linear.py routes a float32 linear's few-row calls here: oneDNN's
//            GEMM, built for larger blocks of rows, takes 1.2-4x as long at 1-16 rows on an AVX2 EPYC).
//   4-bit:   w = q * d + m, q in 0..15, two per byte (byte j of a group: q[j] low nibble, q[j + 16] high),
//            each group with its own float scale d and offset m; llama.cpp's Q4_1 (and Q4_0, m = -8d).
//   8-bit:   w = q * d, q int8; llama.cpp's Q8_0.
// A group's weights are loaded (and widened to float) once per block of up to kRows activation rows and
// multiplied into each row's accumulators, so a lone sequence's step reads the weight once, and a quantized
// one a quarter (8-bit) or an eighth (4-bit, plus the scales) of float32's bytes. Output features are split
// across torch's threads.

#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

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

struct Float32 {
  const float* w;  // [N, K]
  int64_t k;
  inline void group(int64_t n, int64_t g, __m256 v[4]) const {
    const float* at = w + n * k + g * kGroup;
    for (int i = 0; i < 4; ++i) v[i] = _mm256_loadu_ps(at + 8 * i);
  }
};

// out[r, n] (+ bias[n]) for rows r0 .. r0 + R and features n0 .. n1 of a row stride `n_out`, F features at
// a time (independent chains for the FMA units: a lone row's step would otherwise wait on its accumulators'
// latency).
template <int R, int F, int A, typename W>
void block(const W& weights, const float* x, float* out, int64_t k, int64_t n_out, int64_t r0, int64_t n0,
           int64_t n1, const float* bias) {
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
        out[(r0 + r) * n_out + n + f] = bias ? hsum(sum) + bias[n + f] : hsum(sum);
      }
  }
  if (n < n1) block<R, 1, A>(weights, x, out, k, n_out, r0, n, n1, bias);
}

// The features of `weights` (n of them) into columns of `out` (row stride n_out), rows in blocks of kRows.
// Float32 weights sum each row in one order whatever the number of rows (one accumulator per row and
// feature), so a row's result is the same alone and in any batch (greedy picks on a near tie do not move
// with the batch); fewer rows take more features at a time instead, for independent FMA chains. The
// quantized weights keep two accumulators below five rows (their results may differ by batch shape in the
// last bits, as oneDNN's did).
template <typename W>
void into(const W& weights, const float* x, int64_t rows, int64_t k, int64_t n, float* out, int64_t n_out,
          const float* bias) {
  constexpr bool kOneOrder = std::is_same<W, Float32>::value;
  constexpr int kFew = kOneOrder ? 1 : 2;  // accumulators per row and feature below five rows
  at::parallel_for(0, n, kGrain, [&](int64_t n0, int64_t n1) {
    int64_t r = 0;
    for (; r + kRows <= rows; r += kRows) block<kRows, 1, 1>(weights, x, out, k, n_out, r, n0, n1, bias);
    switch (rows - r) {  // fewer rows: more features or accumulators at a time, for independent FMA chains
      case 7: block<7, 1, 1>(weights, x, out, k, n_out, r, n0, n1, bias); break;
      case 6: block<6, 1, 1>(weights, x, out, k, n_out, r, n0, n1, bias); break;
      case 5: block<5, 1, 1>(weights, x, out, k, n_out, r, n0, n1, bias); break;
      case 4: block<4, kOneOrder ? 2 : 1, kFew>(weights, x, out, k, n_out, r, n0, n1, bias); break;
      case 3: block<3, kOneOrder ? 2 : 1, kFew>(weights, x, out, k, n_out, r, n0, n1, bias); break;
      case 2: block<2, kOneOrder ? 4 : 2, kFew>(weights, x, out, k, n_out, r, n0, n1, bias); break;
      case 1: block<1, kOneOrder ? 4 : 2, kFew>(weights, x, out, k, n_out, r, n0, n1, bias); break;
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
  into(weights, x.data_ptr<float>(), x.size(0), k, n_out, out.data_ptr<float>(), n_out, nullptr);
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

// x @ [w_0; w_1; ...].T + bias: float32 weights [N_i, K] side by side in one output (a joint q/k/v or
// gate/up GEMM without a joined copy of the weights).
torch::Tensor float_linear(torch::Tensor x, std::vector<torch::Tensor> weights, c10::optional<torch::Tensor> bias) {
  TORCH_CHECK(!weights.empty(), "float linear: no weights");
  const int64_t k = weights[0].size(1);
  check_x(x, k);
  int64_t n_out = 0;
  for (const auto& w : weights) {
    TORCH_CHECK(w.scalar_type() == at::kFloat && w.dim() == 2 && w.size(1) == k && w.is_contiguous(),
                "float linear: weights must be contiguous float32 [N, ", k, "]");
    n_out += w.size(0);
  }
  const float* b = nullptr;
  if (bias.has_value()) {
    TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->is_contiguous() && bias->numel() == n_out,
                "float linear: bias must be contiguous float32 [", n_out, "]");
    b = bias->data_ptr<float>();
  }
  auto out = torch::empty({x.size(0), n_out}, x.options());
  int64_t at_column = 0;
  for (const auto& w : weights) {
    into(Float32{w.data_ptr<float>(), k}, x.data_ptr<float>(), x.size(0), k, w.size(0),
         out.data_ptr<float>() + at_column, n_out, b ? b + at_column : nullptr);
    at_column += w.size(0);
  }
  return out;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("float_linear", &float_linear, "x @ [W_0; W_1; ...].T + b for float32 weights");
  m.def("int4_linear", &int4_linear, "x @ W.T for 4-bit weights in groups of 32 (w = q * d + m)");
  m.def("int8_linear", &int8_linear, "x @ W.T for 8-bit weights in groups of 32 (w = q * d)");
}
