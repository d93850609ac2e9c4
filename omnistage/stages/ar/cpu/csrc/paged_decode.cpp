// Decode attention straight from the paged KV cache, for CPUs with AVX-512 (built by native.py).
//
// torch's path gathers every decoding sequence's keys and values into padded copies, then runs SDPA on
// many tiny (3 queries x ~100 keys) problems; on a 2-core Xeon that was ~25% of a decode step. Here one
// task per sequence reads its cache rows in place, in slot order and prefetched ahead, and computes
// scores, softmax and the weighted sum in float32, writing each output row in place. Scores are summed 16
// keys at a time with one transposing reduction, and a head's vectors stay in registers (the head dim is
// a template parameter): on the benchmark's shapes that took the kernel from 4.7 to 2.5 ms of a step.

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include "vec512.h"

#include <cmath>
#include <cstring>
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

// Lane i of the result = the sum of v[i]'s 16 lanes: four rounds of pairwise shuffles and adds (45 ops,
// against some 130 for 16 separate horizontal sums).
inline __m512 sum16x16(__m512 v[16]) {
  __m512 pairs[8], quads[4];
  for (int i = 0; i < 8; ++i)  // per 128-bit chunk: [a0+a2, b0+b2, a1+a3, b1+b3]
    pairs[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
  for (int i = 0; i < 4; ++i)  // per chunk: partial sums of 4 vectors, in order
    quads[i] = _mm512_add_ps(_mm512_shuffle_ps(pairs[2 * i], pairs[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_ps(pairs[2 * i], pairs[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  const __m512 low = _mm512_add_ps(_mm512_shuffle_f32x4(quads[0], quads[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                   _mm512_shuffle_f32x4(quads[0], quads[1], _MM_SHUFFLE(3, 1, 3, 1)));
  const __m512 high = _mm512_add_ps(_mm512_shuffle_f32x4(quads[2], quads[3], _MM_SHUFFLE(2, 0, 2, 0)),
                                    _mm512_shuffle_f32x4(quads[2], quads[3], _MM_SHUFFLE(3, 1, 3, 1)));
  return _mm512_add_ps(_mm512_shuffle_f32x4(low, high, _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_f32x4(low, high, _MM_SHUFFLE(3, 1, 3, 1)));
}

// One sequence's attention, head dim VECS * 16 (a template so that a head's vectors live in registers).
// For each KV head: scores of each of its query heads against 16 keys at a time, softmax, then the
// weighted sum of values two keys at a time (two independent accumulator sets).
template <int VECS, typename T>
void decode_sequence(T* ob, const T* qb, const T* kc, const T* vc, const int64_t* seq_slots, int64_t len,
                     const Shape& s, float* scores) {
  const int64_t group = s.q_heads / s.kv_heads, row_elems = s.kv_heads * s.dim;
  for (int64_t h = 0; h < s.kv_heads; ++h) {
    for (int64_t g = 0; g < group; ++g) {
      const int64_t hq = h * group + g;
      __m512 qv[VECS];
      for (int v = 0; v < VECS; ++v)
        qv[v] = _mm512_mul_ps(load16(qb + hq * s.q_head + v * kLanes), _mm512_set1_ps(s.scale));
      float* row = scores + hq * s.width;
      for (int64_t j0 = 0; j0 < len; j0 += kLanes) {
        const int64_t n = std::min<int64_t>(kLanes, len - j0);
        if (g == 0)  // the next 16 keys of this head (later query heads find them in cache)
          for (int64_t j = j0 + kLanes; j < std::min(len, j0 + 2 * kLanes); ++j)
            prefetch_row(kc + seq_slots[j] * row_elems + h * s.dim, s.dim * sizeof(T));
        __m512 dots[kLanes];
#pragma GCC unroll 16
        for (int jj = 0; jj < kLanes; ++jj) {
          if (jj >= n) {
            dots[jj] = _mm512_setzero_ps();
            continue;
          }
          const T* krow = kc + seq_slots[j0 + jj] * row_elems + h * s.dim;
          __m512 dot = _mm512_mul_ps(qv[0], load16(krow));
          for (int v = 1; v < VECS; ++v) dot = _mm512_fmadd_ps(qv[v], load16(krow + v * kLanes), dot);
          dots[jj] = dot;
        }
        _mm512_mask_storeu_ps(row + j0, tail_mask(n), sum16x16(dots));
      }
      softmax_in_place(row, len);
      __m512 even[VECS], odd[VECS];
      for (int v = 0; v < VECS; ++v) even[v] = odd[v] = _mm512_setzero_ps();
      int64_t j = 0;
      for (; j + 1 < len; j += 2) {
        if (j + 9 < len) {
          prefetch_row(vc + seq_slots[j + 8] * row_elems + h * s.dim, s.dim * sizeof(T));
          prefetch_row(vc + seq_slots[j + 9] * row_elems + h * s.dim, s.dim * sizeof(T));
        }
        const T* v0 = vc + seq_slots[j] * row_elems + h * s.dim;
        const T* v1 = vc + seq_slots[j + 1] * row_elems + h * s.dim;
        const __m512 p0 = _mm512_set1_ps(row[j]), p1 = _mm512_set1_ps(row[j + 1]);
        for (int v = 0; v < VECS; ++v) {
          even[v] = _mm512_fmadd_ps(p0, load16(v0 + v * kLanes), even[v]);
          odd[v] = _mm512_fmadd_ps(p1, load16(v1 + v * kLanes), odd[v]);
        }
      }
      if (j < len) {
        const T* v0 = vc + seq_slots[j] * row_elems + h * s.dim;
        const __m512 p0 = _mm512_set1_ps(row[j]);
        for (int v = 0; v < VECS; ++v) even[v] = _mm512_fmadd_ps(p0, load16(v0 + v * kLanes), even[v]);
      }
      for (int v = 0; v < VECS; ++v)
        store16(ob + hq * s.o_head + v * kLanes, _mm512_add_ps(even[v], odd[v]), tail_mask(kLanes));
    }
  }
}

template <int VECS, typename T>
void decode(T* out, const T* q, const T* kc, const T* vc, const int64_t* rows, const int64_t* slots,
            const int64_t* lens, const Shape& s) {
  at::parallel_for(0, s.seqs, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores(s.q_heads * s.width);
    for (int64_t b = begin; b < end; ++b)
      decode_sequence<VECS>(out + rows[b] * s.o_row, q + rows[b] * s.q_row, kc, vc, slots + b * s.width, lens[b],
                            s, scores.data());
  });
}

// decode<dim / 16> for the head dims the kernel takes.
template <typename T>
void decode_any(T* out, const T* q, const T* kc, const T* vc, const int64_t* rows, const int64_t* slots,
                const int64_t* lens, const Shape& s) {
  switch (s.dim / kLanes) {
#define OMNI_DECODE_CASE(n) \
  case n:                   \
    return decode<n>(out, q, kc, vc, rows, slots, lens, s);
    OMNI_DECODE_CASE(1) OMNI_DECODE_CASE(2) OMNI_DECODE_CASE(3) OMNI_DECODE_CASE(4)
    OMNI_DECODE_CASE(5) OMNI_DECODE_CASE(6) OMNI_DECODE_CASE(7) OMNI_DECODE_CASE(8)
    OMNI_DECODE_CASE(9) OMNI_DECODE_CASE(10) OMNI_DECODE_CASE(11) OMNI_DECODE_CASE(12)
    OMNI_DECODE_CASE(13) OMNI_DECODE_CASE(14) OMNI_DECODE_CASE(15) OMNI_DECODE_CASE(16)
#undef OMNI_DECODE_CASE
  }
  TORCH_CHECK(false, "head dim must be a multiple of 16, at most 256");
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
  OMNI_DISPATCH_FLOAT_BF16(q.scalar_type(), "paged_decode", [&] {
    decode_any(out.data_ptr<scalar_t>(), q.data_ptr<scalar_t>(), k_cache.data_ptr<scalar_t>(),
               v_cache.data_ptr<scalar_t>(), rp, sp, lp, s);
  });
}

// k_cache[slots[t]] = k[t] and v_cache[slots[t]] = v[t]: this step's keys and values into the paged cache,
// one row copy each (two index_copy_ calls cost ~20 us apiece at decode sizes). k/v: [T, kv_heads, dim]
// with each row's heads packed (a view of the q/k/v projection is); caches: [S, kv_heads, dim] contiguous.
void write_cache(torch::Tensor k_cache, torch::Tensor v_cache, torch::Tensor slots, torch::Tensor k,
                 torch::Tensor v) {
  TORCH_CHECK(k_cache.dim() == 3 && k_cache.is_contiguous() && v_cache.is_contiguous() &&
                  v_cache.sizes() == k_cache.sizes(), "caches: [slots, kv_heads, dim], contiguous");
  TORCH_CHECK(k.dim() == 3 && k.sizes() == v.sizes() && k.size(1) == k_cache.size(1) && k.size(2) == k_cache.size(2),
              "k and v: [T, kv_heads, dim] of the cache's heads and dim");
  for (const auto& t : {k, v})
    TORCH_CHECK(t.stride(2) == 1 && t.stride(1) == t.size(2), "k and v: each row's heads packed");
  TORCH_CHECK(k.scalar_type() == k_cache.scalar_type() && v.scalar_type() == k_cache.scalar_type() &&
                  v_cache.scalar_type() == k_cache.scalar_type(), "k, v and the caches share one dtype");
  const auto sl = slots.contiguous();
  TORCH_CHECK(sl.scalar_type() == at::kLong && sl.dim() == 1 && sl.size(0) == k.size(0), "one int64 slot per row");
  const int64_t* sp = sl.data_ptr<int64_t>();
  const int64_t rows = k.size(0), num_slots = k_cache.size(0);
  for (int64_t t = 0; t < rows; ++t) TORCH_CHECK(sp[t] >= 0 && sp[t] < num_slots, "cache slot out of range");
  const int64_t bytes = k.size(1) * k.size(2) * k.element_size();
  auto* kc = static_cast<char*>(k_cache.data_ptr());
  auto* vc = static_cast<char*>(v_cache.data_ptr());
  const auto* kp = static_cast<const char*>(k.data_ptr());
  const auto* vp = static_cast<const char*>(v.data_ptr());
  const int64_t k_row = k.stride(0) * k.element_size(), v_row = v.stride(0) * v.element_size();
  for (int64_t t = 0; t < rows; ++t) {
    std::memcpy(kc + sp[t] * bytes, kp + t * k_row, bytes);
    std::memcpy(vc + sp[t] * bytes, vp + t * v_row, bytes);
  }
}
