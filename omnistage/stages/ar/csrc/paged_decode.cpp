// Decode attention straight from the paged KV cache, for CPUs with AVX-512 (built by native.py).
//
// torch's path gathers every decoding sequence's keys and values into padded copies, then runs SDPA on
// many tiny (3 queries x ~100 keys) problems; on a 2-core Xeon that was ~25% of a decode step. Here one
// task per sequence reads its cache rows in slot order (a block's rows for all KV heads are contiguous),
// prefetches two slots ahead, and computes scores, softmax and the weighted sum in float32 for all of its
// query heads at once, writing each output row in place.

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include "vec512.h"

#include <cmath>
#include <vector>

namespace {

using namespace omni_native;

constexpr int64_t kMaxHeadDim = 256;

// row[0:len] = softmax(row[0:len]), len >= 1.
inline void softmax_in_place(float* row, int64_t len) {
  __m512 mv = _mm512_set1_ps(-INFINITY);
  for (int64_t j = 0; j < len; j += kLanes) {
    const __mmask16 k = tail_mask(len - j);
    mv = _mm512_mask_max_ps(mv, k, mv, _mm512_maskz_loadu_ps(k, row + j));
  }
  const __m512 m = _mm512_set1_ps(_mm512_reduce_max_ps(mv));
  __m512 sv = _mm512_setzero_ps();
  for (int64_t j = 0; j < len; j += kLanes) {
    const __mmask16 k = tail_mask(len - j);
    const __m512 e = exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, row + j), m));
    _mm512_mask_storeu_ps(row + j, k, e);
    sv = _mm512_mask_add_ps(sv, k, sv, e);
  }
  const __m512 inv = _mm512_set1_ps(1.f / _mm512_reduce_add_ps(sv));
  for (int64_t j = 0; j < len; j += kLanes) {
    const __mmask16 k = tail_mask(len - j);
    _mm512_mask_storeu_ps(row + j, k, _mm512_mul_ps(_mm512_maskz_loadu_ps(k, row + j), inv));
  }
}

inline void prefetch_row(const void* row, int64_t bytes) {
  const char* p = static_cast<const char*>(row);
  for (int64_t off = 0; off < bytes; off += 64) _mm_prefetch(p + off, _MM_HINT_T0);
}

struct Shape {
  int64_t seqs, q_heads, kv_heads, dim, width;  // width: columns of the slot table
  int64_t q_row, q_head, o_row, o_head;          // strides of q and out (their last dim is contiguous)
  float scale;
};

template <typename T>
void decode(T* out, const T* q, const T* kc, const T* vc, const int64_t* rows, const int64_t* slots,
            const int64_t* lens, const Shape& s) {
  const int64_t group = s.q_heads / s.kv_heads, vecs = s.dim / kLanes, row_elems = s.kv_heads * s.dim;
  at::parallel_for(0, s.seqs, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> qf(s.q_heads * s.dim), acc(s.q_heads * s.dim), scores(s.q_heads * s.width);
    for (int64_t b = begin; b < end; ++b) {
      const int64_t len = lens[b];
      const int64_t* seq_slots = slots + b * s.width;
      const T* qb = q + rows[b] * s.q_row;
      for (int64_t hq = 0; hq < s.q_heads; ++hq)
        for (int64_t v = 0; v < vecs; ++v)
          _mm512_storeu_ps(&qf[hq * s.dim + v * kLanes],
                           _mm512_mul_ps(load16(qb + hq * s.q_head + v * kLanes), _mm512_set1_ps(s.scale)));
      for (int64_t j = 0; j < len; ++j) {
        if (j + 2 < len) prefetch_row(kc + seq_slots[j + 2] * row_elems, row_elems * sizeof(T));
        const T* krow = kc + seq_slots[j] * row_elems;
        for (int64_t h = 0; h < s.kv_heads; ++h) {
          __m512 k[kMaxHeadDim / kLanes];
          for (int64_t v = 0; v < vecs; ++v) k[v] = load16(krow + h * s.dim + v * kLanes);
          for (int64_t g = 0; g < group; ++g) {
            const float* qh = &qf[(h * group + g) * s.dim];
            __m512 dot = _mm512_mul_ps(_mm512_loadu_ps(qh), k[0]);
            for (int64_t v = 1; v < vecs; ++v) dot = _mm512_fmadd_ps(_mm512_loadu_ps(qh + v * kLanes), k[v], dot);
            scores[(h * group + g) * s.width + j] = _mm512_reduce_add_ps(dot);
          }
        }
      }
      for (int64_t hq = 0; hq < s.q_heads; ++hq) softmax_in_place(&scores[hq * s.width], len);
      std::fill(acc.begin(), acc.end(), 0.f);
      for (int64_t j = 0; j < len; ++j) {
        if (j + 2 < len) prefetch_row(vc + seq_slots[j + 2] * row_elems, row_elems * sizeof(T));
        const T* vrow = vc + seq_slots[j] * row_elems;
        for (int64_t h = 0; h < s.kv_heads; ++h) {
          for (int64_t v = 0; v < vecs; ++v) {
            const __m512 val = load16(vrow + h * s.dim + v * kLanes);
            for (int64_t g = 0; g < group; ++g) {
              const int64_t hq = h * group + g;
              float* a = &acc[hq * s.dim + v * kLanes];
              _mm512_storeu_ps(a, _mm512_fmadd_ps(_mm512_set1_ps(scores[hq * s.width + j]), val, _mm512_loadu_ps(a)));
            }
          }
        }
      }
      T* ob = out + rows[b] * s.o_row;
      for (int64_t hq = 0; hq < s.q_heads; ++hq)
        for (int64_t d = 0; d < s.dim; ++d) ob[hq * s.o_head + d] = static_cast<T>(acc[hq * s.dim + d]);
    }
  });
}

}  // namespace

// out[rows[b]] = attention of q[rows[b]] ([q_heads, dim]) over the keys/values in cache slots
// slots[b, :lens[b]]. q/out: [T, q_heads, dim]; caches: [S, kv_heads, dim] contiguous; rows [B], slots
// [B, W], lens [B] int64.
void paged_decode(torch::Tensor out, torch::Tensor q, torch::Tensor k_cache, torch::Tensor v_cache,
                  torch::Tensor rows, torch::Tensor slots, torch::Tensor lens, double scale) {
  TORCH_CHECK(q.dim() == 3 && out.sizes() == q.sizes() && q.stride(2) == 1 && out.stride(2) == 1,
              "q and out: [T, heads, dim] with a contiguous last dim");
  TORCH_CHECK(k_cache.dim() == 3 && k_cache.is_contiguous() && v_cache.is_contiguous() &&
                  v_cache.sizes() == k_cache.sizes(), "caches: [slots, kv_heads, dim], contiguous");
  TORCH_CHECK(q.scalar_type() == k_cache.scalar_type() && q.scalar_type() == v_cache.scalar_type() &&
                  q.scalar_type() == out.scalar_type(), "q, out and the caches share one dtype");
  const auto r = rows.contiguous(), sl = slots.contiguous(), ln = lens.contiguous();
  TORCH_CHECK(r.scalar_type() == at::kLong && sl.scalar_type() == at::kLong && ln.scalar_type() == at::kLong);
  Shape s{r.size(0), q.size(1), k_cache.size(1), q.size(2), sl.size(1),
          q.stride(0), q.stride(1), out.stride(0), out.stride(1), static_cast<float>(scale)};
  TORCH_CHECK(k_cache.size(2) == s.dim && s.q_heads % s.kv_heads == 0, "head counts/dims do not match");
  TORCH_CHECK(s.dim % kLanes == 0 && s.dim <= kMaxHeadDim, "head dim must be a multiple of 16, at most 256");
  TORCH_CHECK(sl.size(0) == s.seqs && ln.size(0) == s.seqs, "one slot row and one length per sequence");
  const int64_t* rp = r.data_ptr<int64_t>();
  const int64_t* sp = sl.data_ptr<int64_t>();
  const int64_t* lp = ln.data_ptr<int64_t>();
  const int64_t num_slots = k_cache.size(0), num_rows = q.size(0);
  for (int64_t b = 0; b < s.seqs; ++b) {  // a bad index must raise, not read out of bounds
    TORCH_CHECK(rp[b] >= 0 && rp[b] < num_rows, "query row out of range");
    TORCH_CHECK(lp[b] >= 1 && lp[b] <= s.width, "sequence length out of range");
    for (int64_t j = 0; j < lp[b]; ++j)
      TORCH_CHECK(sp[b * s.width + j] >= 0 && sp[b * s.width + j] < num_slots, "cache slot out of range");
  }
  if (q.scalar_type() == at::kBFloat16) {
    decode(out.data_ptr<c10::BFloat16>(), q.data_ptr<c10::BFloat16>(), k_cache.data_ptr<c10::BFloat16>(),
           v_cache.data_ptr<c10::BFloat16>(), rp, sp, lp, s);
  } else {
    TORCH_CHECK(q.scalar_type() == at::kFloat, "float32 or bfloat16 only");
    decode(out.data_ptr<float>(), q.data_ptr<float>(), k_cache.data_ptr<float>(), v_cache.data_ptr<float>(),
           rp, sp, lp, s);
  }
}
