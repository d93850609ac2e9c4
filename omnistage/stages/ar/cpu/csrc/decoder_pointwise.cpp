// The pointwise parts of a Llama-style decoder layer, each in one pass over its rows (built by native.py).
//
// At decode batch sizes these are tiny tensors, and torch spends more on launching their ops than on the
// arithmetic: an RMS norm is eight ops (upcast, square, mean, add, rsqrt, two products, downcast), rotary
// embedding ten, SiLU-times-up two plus a slow bf16 SiLU. On a 2-core Xeon they took about a fifth of a
// decode step. Each function here computes what the torch ops compute, rounding its intermediates to the
// tensor's dtype where torch stores them (so rotary is bit-identical, and norms differ only by the order
// of the mean's sum); float32 inside.

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include "vec16.h"

#include <cmath>
#include <tuple>

namespace {

using namespace omni_native;

constexpr int64_t kGrainElems = 32768;  // rows split across threads only above this much work (as torch)

int64_t grain_rows(int64_t width) { return std::max<int64_t>(1, kGrainElems / std::max<int64_t>(1, width)); }

int64_t rows_of(const torch::Tensor& t) { return t.numel() / t.size(-1); }

// out = weight * T(x * rsqrt(mean(x^2) + eps)) for one row of n; x already rounded to T.
template <typename T>
void norm_row(const T* x, const T* weight, T* out, int64_t n, float eps) {
  V squares = vzero();
  for (int64_t j = 0; j < n; j += kLanes) {
    const V v = load16(x + j, tail_mask(n - j));
    squares = vfmadd(v, v, squares);
  }
  const V scale = vset1(1.f / std::sqrt(vreduce_add(squares) / n + eps));
  for (int64_t j = 0; j < n; j += kLanes) {
    const M m = tail_mask(n - j);
    const V normed = round_to(vmul(load16(x + j, m), scale), x);
    store16(out + j, vmul(normed, load16(weight + j, m)), m);
  }
}

template <typename T>
void rms_norm_impl(const T* x, const T* weight, T* out, int64_t rows, int64_t n, float eps) {
  at::parallel_for(0, rows, grain_rows(n), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) norm_row(x + r * n, weight, out + r * n, n, eps);
  });
}

template <typename T>
void add_rms_norm_impl(const T* h, const T* y, const T* weight, T* sum, T* out, int64_t rows, int64_t n,
                       float eps) {
  at::parallel_for(0, rows, grain_rows(n), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      for (int64_t j = 0; j < n; j += kLanes) {
        const M m = tail_mask(n - j);
        store16(sum + r * n + j, vadd(load16(h + r * n + j, m), load16(y + r * n + j, m)), m);
      }
      norm_row(sum + r * n, weight, out + r * n, n, eps);
    }
  });
}

// x[d] = x[d]*cos[d] - x[d+half]*sin[d], x[d+half] = x[d+half]*cos[d+half] + x[d]*sin[d+half] for the
// first `heads` heads of each row (q then k), products and sums rounded to T like torch's three ops.
template <typename T>
void rotary_impl(T* x, const T* cos, const T* sin, int64_t rows, int64_t width, int64_t heads, int64_t dim) {
  const int64_t half = dim / 2;
  at::parallel_for(0, rows, grain_rows(heads * dim), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* c = cos + r * dim;
      const T* s = sin + r * dim;
      for (int64_t h = 0; h < heads; ++h) {
        T* head = x + r * width + h * dim;
        for (int64_t d = 0; d < half; d += kLanes) {
          const M m = tail_mask(half - d);
          const V x1 = load16(head + d, m), x2 = load16(head + half + d, m);
          const V first = vsub(round_to(vmul(x1, load16(c + d, m)), head), round_to(vmul(x2, load16(s + d, m)), head));
          const V second =
              vadd(round_to(vmul(x2, load16(c + half + d, m)), head), round_to(vmul(x1, load16(s + half + d, m)), head));
          store16(head + d, first, m);
          store16(head + half + d, second, m);
        }
      }
    }
  });
}

// out = T(silu(gate)) * up, gate and up the two halves of each row of gate_up.
template <typename T>
void silu_mul_impl(const T* gate_up, T* out, int64_t rows, int64_t n) {
  at::parallel_for(0, rows, grain_rows(n), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* gate = gate_up + r * 2 * n;
      for (int64_t j = 0; j < n; j += kLanes) {
        const M m = tail_mask(n - j);
        const V g = load16(gate + j, m);
        const V act = round_to(vdiv(g, vadd(vset1(1.f), exp16(vsub(vzero(), g)))), gate);
        store16(out + r * n + j, vmul(act, load16(gate + n + j, m)), m);
      }
    }
  });
}

void check_rows(const torch::Tensor& t, const char* name) {
  TORCH_CHECK(t.dim() >= 1 && t.size(-1) > 0, name, " must have a non-empty last dim");
  TORCH_CHECK(t.is_contiguous(), name, " must be contiguous");
  TORCH_CHECK(t.scalar_type() == at::kFloat || t.scalar_type() == at::kBFloat16, name,
              " must be float32 or bfloat16");
}

void check_weight(const torch::Tensor& x, const torch::Tensor& weight) {
  check_rows(weight, "weight");
  TORCH_CHECK(weight.dim() == 1 && weight.size(0) == x.size(-1), "weight: one value per hidden unit");
  TORCH_CHECK(weight.scalar_type() == x.scalar_type(), "weight and input share one dtype");
}

}  // namespace

// RMS norm of each row of x (last dim), as transformers' Llama-style RMSNorm modules compute it.
torch::Tensor rms_norm(torch::Tensor x, torch::Tensor weight, double eps) {
  check_rows(x, "x");
  check_weight(x, weight);
  auto out = torch::empty_like(x);
  const int64_t rows = rows_of(x), n = x.size(-1);
  OMNI_DISPATCH_FLOAT_BF16(x.scalar_type(), "rms_norm", [&] {
    rms_norm_impl(x.data_ptr<scalar_t>(), weight.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(), rows, n,
                  static_cast<float>(eps));
  });
  return out;
}

// (h + y, rms_norm(h + y)): a residual connection and the next norm in one pass.
std::tuple<torch::Tensor, torch::Tensor> add_rms_norm(torch::Tensor h, torch::Tensor y, torch::Tensor weight,
                                                      double eps) {
  check_rows(h, "h");
  check_rows(y, "y");
  TORCH_CHECK(h.sizes() == y.sizes() && h.scalar_type() == y.scalar_type(), "h and y: one shape and dtype");
  check_weight(h, weight);
  auto sum = torch::empty_like(h), out = torch::empty_like(h);
  const int64_t rows = rows_of(h), n = h.size(-1);
  OMNI_DISPATCH_FLOAT_BF16(h.scalar_type(), "add_rms_norm", [&] {
    add_rms_norm_impl(h.data_ptr<scalar_t>(), y.data_ptr<scalar_t>(), weight.data_ptr<scalar_t>(),
                      sum.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(), rows, n, static_cast<float>(eps));
  });
  return {sum, out};
}

// Rotary embedding in place on the first `heads` heads (of `dim`) of each row of x ([..., T, W]: a packed
// q/k/v projection, q heads then k heads); cos/sin: [..., T, dim] as the model's rotary_emb returns them.
void rotary_(torch::Tensor x, torch::Tensor cos, torch::Tensor sin, int64_t heads, int64_t dim) {
  check_rows(x, "x");
  check_rows(cos, "cos");
  check_rows(sin, "sin");
  const int64_t rows = rows_of(x), width = x.size(-1);
  TORCH_CHECK(cos.sizes() == sin.sizes() && cos.size(-1) == dim && rows_of(cos) == rows,
              "cos/sin: one row of dim per row of x");
  TORCH_CHECK(cos.scalar_type() == x.scalar_type() && sin.scalar_type() == x.scalar_type(),
              "cos/sin share x's dtype");
  TORCH_CHECK(dim % 2 == 0 && heads >= 0 && heads * dim <= width, "heads * dim must fit in a row");
  OMNI_DISPATCH_FLOAT_BF16(x.scalar_type(), "rotary_", [&] {
    rotary_impl(x.data_ptr<scalar_t>(), cos.data_ptr<scalar_t>(), sin.data_ptr<scalar_t>(), rows, width, heads,
                dim);
  });
}

// silu(gate) * up for gate_up = [..., 2n] (gate then up, one packed projection) -> [..., n].
torch::Tensor silu_mul(torch::Tensor gate_up) {
  check_rows(gate_up, "gate_up");
  TORCH_CHECK(gate_up.size(-1) % 2 == 0, "gate_up: gate and up halves of one width");
  auto sizes = gate_up.sizes().vec();
  const int64_t n = sizes.back() / 2, rows = rows_of(gate_up);
  sizes.back() = n;
  auto out = torch::empty(sizes, gate_up.options());
  OMNI_DISPATCH_FLOAT_BF16(gate_up.scalar_type(), "silu_mul", [&] {
    silu_mul_impl(gate_up.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(), rows, n);
  });
  return out;
}
