// Decode attention straight from the paged KV cache (built by native.py for AVX-512 or AVX2 CPUs).
//
// torch's path gathers every decoding sequence's keys and values into padded copies, then runs SDPA on
// many tiny (3 queries x ~100 keys) problems; on a 2-core Xeon that was ~25% of a decode step. Here one
// task per sequence reads its cache rows in place, in slot order and prefetched ahead, and computes
// scores, softmax and the weighted sum in float32, writing each output row in place. Scores are summed 16
// keys at a time with one transposing reduction, and a head's vectors stay in registers (the head dim is
// a template parameter): on the benchmark's shapes that took the kernel from 4.7 to 2.5 ms of a step.

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include "vec16.h"

#include <cmath>
#include <cstring>
#include <vector>

namespace {

using namespace omni_native;

constexpr int64_t kMaxHeadDim = 256;

// row[0:len] = softmax(row[0:len]), len >= 1.
inline void softmax_in_place(float* row, int64_t len) {
  V mv = vset1(-INFINITY);
  for (int64_t j = 0; j < len; j += kLanes) {
    const M k = tail_mask(len - j);
    mv = vmask_max(mv, k, mv, load16(row + j, k));
  }
  const V m = vset1(vreduce_max(mv));
  V sv = vzero();
  for (int64_t j = 0; j < len; j += kLanes) {
    const M k = tail_mask(len - j);
    const V e = exp16(vsub(load16(row + j, k), m));
    store16(row + j, e, k);
    sv = vmask_add(sv, k, sv, e);
  }
  const V inv = vset1(1.f / vreduce_add(sv));
  for (int64_t j = 0; j < len; j += kLanes) {
    const M k = tail_mask(len - j);
    store16(row + j, vmul(load16(row + j, k), inv), k);
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
      V qv[VECS];
      for (int v = 0; v < VECS; ++v)
        qv[v] = vmul(load16(qb + hq * s.q_head + v * kLanes), vset1(s.scale));
      float* row = scores + hq * s.width;
      for (int64_t j0 = 0; j0 < len; j0 += kLanes) {
        const int64_t n = std::min<int64_t>(kLanes, len - j0);
        if (g == 0)  // the next 16 keys of this head (later query heads find them in cache)
          for (int64_t j = j0 + kLanes; j < std::min(len, j0 + 2 * kLanes); ++j)
            prefetch_row(kc + seq_slots[j] * row_elems + h * s.dim, s.dim * sizeof(T));
        V dots[kLanes];
#pragma GCC unroll 16
        for (int jj = 0; jj < kLanes; ++jj) {
          if (jj >= n) {
            dots[jj] = vzero();
            continue;
          }
          const T* krow = kc + seq_slots[j0 + jj] * row_elems + h * s.dim;
          V dot = vmul(qv[0], load16(krow));
          for (int v = 1; v < VECS; ++v) dot = vfmadd(qv[v], load16(krow + v * kLanes), dot);
          dots[jj] = dot;
        }
        store16(row + j0, sum16x16(dots), tail_mask(n));
      }
      softmax_in_place(row, len);
      V even[VECS], odd[VECS];
      for (int v = 0; v < VECS; ++v) even[v] = odd[v] = vzero();
      int64_t j = 0;
      for (; j + 1 < len; j += 2) {
        if (j + 9 < len) {
          prefetch_row(vc + seq_slots[j + 8] * row_elems + h * s.dim, s.dim * sizeof(T));
          prefetch_row(vc + seq_slots[j + 9] * row_elems + h * s.dim, s.dim * sizeof(T));
        }
        const T* v0 = vc + seq_slots[j] * row_elems + h * s.dim;
        const T* v1 = vc + seq_slots[j + 1] * row_elems + h * s.dim;
        const V p0 = vset1(row[j]), p1 = vset1(row[j + 1]);
        for (int v = 0; v < VECS; ++v) {
          even[v] = vfmadd(p0, load16(v0 + v * kLanes), even[v]);
          odd[v] = vfmadd(p1, load16(v1 + v * kLanes), odd[v]);
        }
      }
      if (j < len) {
        const T* v0 = vc + seq_slots[j] * row_elems + h * s.dim;
        const V p0 = vset1(row[j]);
        for (int v = 0; v < VECS; ++v) even[v] = vfmadd(p0, load16(v0 + v * kLanes), even[v]);
      }
      for (int v = 0; v < VECS; ++v)
        store16(ob + hq * s.o_head + v * kLanes, vadd(even[v], odd[v]), tail_mask(kLanes));
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
