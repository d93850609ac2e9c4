// Float32 linears that round exactly as oneDNN's packed GEMM does on this CPU, and run faster than it at a
// decode step's rows (packed_linear.py routes float32 linears below a long prefill's rows here).
//
// Why oneDNN's order: a greedy pick on a near tie follows the last bits of the logits, so two servers agree
// token for token only if their sums round alike; vLLM(-Omni)'s CPU GEMM is oneDNN's. oneDNN's float32 GEMM
// computes each output as one FMA chain over k in order, in blocks of `block_k`: each block's chain starts
// at zero and the blocks are added into the output in order, then the bias. The block depends on the CPU,
// the rows and K (packed_linear.py's `onednn_blocks` finds it: 1024 on AVX2; checked bit for bit against
// torch.ops.mkldnn._linear_pointwise). This kernel does the same: eight output features a vector (the
// weight packed as panels [ceil(N/8), K, 8]), each row's x[k] broadcast, so a row's result does not depend
// on the other rows in the batch either, for a given block.
//
// Tiles of up to 4 rows x 3 panels (12 accumulators, the FMA units' latency covered) walk k in chunks of
// 256 that stay in L1 across the row tiles; accumulators carry between chunks through memory (a float
// stored and reloaded is unchanged, so the chain is the same one). Column groups are split across torch's
// threads; an output's sum never is.

#include "float_gemm.h"

#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <vector>

namespace float_gemm {
namespace {

constexpr int64_t kLanes = 8;     // output features per vector
constexpr int64_t kChunkK = 256;  // k per pass over a tile
constexpr int64_t kGrainFma = 1 << 16;  // multiply-adds a thread takes at least

// c[r][b][lane] += sum over k0 <= k < k1 of xt[k][r] * panel_b[k][lane], in k order; `fresh` starts c at zero.
template <int R, int B>
void tile(const float* xt, int64_t ld_x, const float* panel, int64_t panel_stride, int64_t k0, int64_t k1,
          float* c, bool fresh) {
  if (fresh) std::fill(c, c + R * B * kLanes, 0.f);
  __m256 acc[R][B];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int b = 0; b < B; ++b) acc[r][b] = _mm256_loadu_ps(c + (r * B + b) * kLanes);
  const float* w = panel + k0 * kLanes;
  const float* x = xt + k0 * ld_x;
  for (int64_t k = k0; k < k1; ++k, w += kLanes, x += ld_x) {
    __m256 wv[B];
#pragma GCC unroll 4
    for (int b = 0; b < B; ++b) wv[b] = _mm256_loadu_ps(w + b * panel_stride);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const __m256 xv = _mm256_broadcast_ss(x + r);
#pragma GCC unroll 4
      for (int b = 0; b < B; ++b) acc[r][b] = _mm256_fmadd_ps(xv, wv[b], acc[r][b]);
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int b = 0; b < B; ++b) _mm256_storeu_ps(c + (r * B + b) * kLanes, acc[r][b]);
}

using Tile = void (*)(const float*, int64_t, const float*, int64_t, int64_t, int64_t, float*, bool);

template <int R>
Tile tile_of_panels(int64_t b) {
  switch (b) {
    case 1: return tile<R, 1>;
    case 2: return tile<R, 2>;
    case 3: return tile<R, 3>;
    default: return tile<R, 4>;
  }
}

Tile tile_of(int64_t rows, int64_t panels) {
  switch (rows) {
    case 1: return tile_of_panels<1>(panels);
    case 2: return tile_of_panels<2>(panels);
    case 3: return tile_of_panels<3>(panels);
    default: return tile_of_panels<4>(panels);
  }
}

}  // namespace

torch::Tensor pack(const torch::Tensor& w) {
  TORCH_CHECK(w.scalar_type() == at::kFloat && w.dim() == 2, "float linear: weights must be float32 [N, K]");
  const int64_t n = w.size(0), k = w.size(1), panels = (n + kLanes - 1) / kLanes;
  auto padded = torch::zeros({panels * kLanes, k}, w.options());
  padded.narrow(0, 0, n).copy_(w);
  return padded.view({panels, kLanes, k}).transpose(1, 2).contiguous();
}

torch::Tensor linear(const torch::Tensor& x, const torch::Tensor& panels, int64_t n,
                     const c10::optional<torch::Tensor>& bias, int64_t block_k) {
  TORCH_CHECK(panels.scalar_type() == at::kFloat && panels.dim() == 3 && panels.size(2) == kLanes &&
                  panels.is_contiguous() && panels.size(0) == (n + kLanes - 1) / kLanes,
              "float linear: weights must be packed by pack_float");
  const int64_t k = panels.size(1), n_panels = panels.size(0);
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.dim() == 2 && x.size(1) == k && x.is_contiguous(),
              "float linear: x must be contiguous float32 [rows, ", k, "]");
  const float* b = nullptr;
  if (bias.has_value()) {
    TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->is_contiguous() && bias->numel() == n,
                "float linear: bias must be contiguous float32 [", n, "]");
    b = bias->data_ptr<float>();
  }
  TORCH_CHECK(block_k > 0 && (block_k % kChunkK == 0 || block_k >= k),
              "float linear: block_k must be a multiple of ", kChunkK, " or at least K");
  const int64_t rows = x.size(0);
  auto out = torch::empty({rows, n}, x.options());
  if (rows == 0 || n == 0) return out;
  const torch::Tensor xt = x.t().contiguous();  // [K, rows]: a k step's row values side by side
  const float* xp = xt.data_ptr<float>();
  const float* pp = panels.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const int64_t tile_rows = std::min<int64_t>(rows, 4);
  const int64_t group = rows <= 3 ? 4 : 3;  // panels a tile takes: 12 accumulators (8 for 1-2 rows)
  const int64_t groups = (n_panels + group - 1) / group;
  const int64_t grain = std::max<int64_t>(1, kGrainFma / std::max<int64_t>(1, rows * k * group * kLanes));
  at::parallel_for(0, groups, grain, [&](int64_t g0, int64_t g1) {
    std::vector<float> sums(2 * rows * group * kLanes);  // [row tile][row][panel][lane]: total, then a block's
    float* total = sums.data();
    float* block = total + rows * group * kLanes;
    for (int64_t g = g0; g < g1; ++g) {
      const int64_t p0 = g * group, np = std::min(group, n_panels - p0);
      const float* panel = pp + p0 * k * kLanes;
      for (int64_t kb = 0; kb < k; kb += block_k) {
        const int64_t kb_end = std::min(k, kb + block_k);
        float* into = kb == 0 ? total : block;
        for (int64_t k0 = kb; k0 < kb_end; k0 += kChunkK) {
          const int64_t k1 = std::min(kb_end, k0 + kChunkK);
          for (int64_t r0 = 0; r0 < rows; r0 += tile_rows) {
            const int64_t rr = std::min(tile_rows, rows - r0);
            tile_of(rr, np)(xp + r0, rows, panel, k * kLanes, k0, k1, into + r0 * np * kLanes, k0 == kb);
          }
        }
        if (kb > 0)
          for (int64_t i = 0; i < rows * np * kLanes; ++i) total[i] += block[i];
      }
      for (int64_t r0 = 0; r0 < rows; r0 += tile_rows) {
        const int64_t rr = std::min(tile_rows, rows - r0);
        for (int64_t r = 0; r < rr; ++r)
          for (int64_t p = 0; p < np; ++p) {
            const int64_t col = (p0 + p) * kLanes, valid = std::min(kLanes, n - col);
            const float* sum = total + r0 * np * kLanes + (r * np + p) * kLanes;
            float* dst = op + (r0 + r) * n + col;
            for (int64_t j = 0; j < valid; ++j) dst[j] = b ? sum[j] + b[col + j] : sum[j];
          }
      }
    }
  });
  return out;
}

}  // namespace float_gemm
