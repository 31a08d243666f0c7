// Attention of a draft's few query rows over all keys (dcoco.models.draft_attention), built
// beside cpu_kernels.cpp.
//
// A draft pass attends 4-24 query rows per kv head to a few hundred keys, without a mask; at that
// size SDPA's CPU kernel spends most of its 50-170 µs on set-up. Here, per kv head and block of up
// to 4 query rows of its query heads (grouped-query attention read in place: the q|k|v product's
// view in, the o product's rows out, no regrouping copies around the call): scores with AVX-512
// bf16 dot products (vdpbf16ps: bf16 pairs multiplied exactly, summed in fp32) times the scale,
// a softmax in fp32 (exp by vector_math.h's polynomial, relative error ~1e-7), then the values in
// fp32, rounded to bf16 once at the end. Not bit-equal to SDPA (another order of sums): for the
// drafter only, whose tokens the target verifies.

#include <torch/extension.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <vector>

#include "vector_math.h"

#ifdef DCOCO_VECTOR_BF16
#define DCOCO_DRAFT_ATTENTION 1
#endif

namespace {

#ifdef DCOCO_DRAFT_ATTENTION
using dcoco_vector::widen;
constexpr int QUERIES = 4;  // query rows sharing each key's and value's loads
constexpr int HEAD_DIM = 64;
constexpr int CHUNKS = HEAD_DIM / 16;  // fp32 registers per row

// One kv head's keys and values, and up to QUERIES query rows (of its query heads) to attend.
struct Head {
  const c10::BFloat16 *key, *value;
  int64_t keys, key_stride, value_stride;
  const c10::BFloat16* query[QUERIES];
  c10::BFloat16* out[QUERIES];
};

// Softmax of `scores` [count] in place; returns 1 / its sum.
float softmax_row(float* scores, int64_t count) {
  float best = -INFINITY;
  for (int64_t j = 0; j < count; ++j) best = std::max(best, scores[j]);
  const __m512 shift = _mm512_set1_ps(best);
  __m512 total = _mm512_setzero_ps();
  int64_t j = 0;
  for (; j + 16 <= count; j += 16) {
    const __m512 e = dcoco_vector::exp(_mm512_sub_ps(_mm512_loadu_ps(scores + j), shift));
    _mm512_storeu_ps(scores + j, e);
    total = _mm512_add_ps(total, e);
  }
  if (j < count) {
    const __mmask16 tail = static_cast<__mmask16>((1u << (count - j)) - 1);
    const __m512 x = _mm512_maskz_sub_ps(tail, _mm512_maskz_loadu_ps(tail, scores + j), shift);
    const __m512 e = _mm512_maskz_mov_ps(tail, dcoco_vector::exp(x));
    _mm512_mask_storeu_ps(scores + j, tail, e);
    total = _mm512_add_ps(total, e);
  }
  return 1.0f / _mm512_reduce_add_ps(total);
}

// Query rows [first, first + rows) of one head -> out rows (bf16, [rows][64]).
void attend_block(const Head& h, int rows, float scale, float* scores) {
  __m512bh query[QUERIES][2];
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < 2; ++c) {
      query[r][c] = (__m512bh)_mm512_loadu_si512(h.query[r] + 32 * c);
    }
  }
  for (int64_t j = 0; j < h.keys; ++j) {
    const c10::BFloat16* key = h.key + j * h.key_stride;
    const __m512bh low = (__m512bh)_mm512_loadu_si512(key);
    const __m512bh high = (__m512bh)_mm512_loadu_si512(key + 32);
    for (int r = 0; r < rows; ++r) {
      const __m512 dot = _mm512_dpbf16_ps(
          _mm512_dpbf16_ps(_mm512_setzero_ps(), query[r][0], low), query[r][1], high);
      scores[r * h.keys + j] = _mm512_reduce_add_ps(dot) * scale;
    }
  }
  float inverse[QUERIES];
  for (int r = 0; r < rows; ++r) inverse[r] = softmax_row(scores + r * h.keys, h.keys);
  __m512 acc[QUERIES][CHUNKS];
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < CHUNKS; ++c) acc[r][c] = _mm512_setzero_ps();
  }
  for (int64_t j = 0; j < h.keys; ++j) {
    __m512 value[CHUNKS];
    for (int c = 0; c < CHUNKS; ++c) value[c] = widen(h.value + j * h.value_stride + 16 * c);
    for (int r = 0; r < rows; ++r) {
      const __m512 p = _mm512_set1_ps(scores[r * h.keys + j]);
      for (int c = 0; c < CHUNKS; ++c) acc[r][c] = _mm512_fmadd_ps(p, value[c], acc[r][c]);
    }
  }
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < CHUNKS; ++c) {
      const __m512 y = _mm512_mul_ps(acc[r][c], _mm512_set1_ps(inverse[r]));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(h.out[r] + 16 * c), dcoco_vector::narrow(y));
    }
  }
}
#endif

}  // namespace

bool draft_attention_available() {
#ifdef DCOCO_DRAFT_ATTENTION
  return true;
#else
  return false;
#endif
}

// query [queries, q_heads, 64] (rows of 64 contiguous, any strides); key, value [1, kv_heads,
// keys, 64] (the same) bf16, q_heads a multiple of kv_heads (query head h reads kv head
// h / (q_heads / kv_heads)) -> softmax(q kᵀ · scale) v as [queries, q_heads · 64] bf16.
torch::Tensor draft_attention(const torch::Tensor& query, const torch::Tensor& key,
                              const torch::Tensor& value, double scale) {
  TORCH_CHECK(draft_attention_available(), "draft_attention needs AVX-512 bf16");
  TORCH_CHECK(query.dim() == 3 && key.dim() == 4 && key.size(0) == 1, "query 3-D, key 4-D");
  for (const auto* t : {&query, &key, &value}) {
    TORCH_CHECK(t->scalar_type() == at::kBFloat16 && t->size(-1) == 64 && t->stride(-1) == 1,
                "bf16 heads of 64 with contiguous rows expected");
  }
  const int64_t queries = query.size(0), q_heads = query.size(1), kv_heads = key.size(1);
  TORCH_CHECK(key.sizes() == value.sizes() && key.size(2) > 0 && q_heads % kv_heads == 0,
              "key and value of one shape; query heads a multiple of the kv heads");
  auto out = torch::empty({queries, q_heads * 64}, query.options());
#ifdef DCOCO_DRAFT_ATTENTION
  const int64_t group = q_heads / kv_heads, rows = queries * group, keys = key.size(2);
  const int64_t blocks = (rows + QUERIES - 1) / QUERIES;
  const auto* q = query.data_ptr<c10::BFloat16>();
  const auto* k = key.data_ptr<c10::BFloat16>();
  const auto* v = value.data_ptr<c10::BFloat16>();
  auto* y = out.data_ptr<c10::BFloat16>();
  at::parallel_for(0, kv_heads * blocks, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores(QUERIES * keys);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t kv_head = task / blocks, first = (task % blocks) * QUERIES;
      Head h{k + kv_head * key.stride(1), v + kv_head * value.stride(1), keys, key.stride(2),
             value.stride(2), {}, {}};
      const int count = static_cast<int>(std::min<int64_t>(QUERIES, rows - first));
      for (int r = 0; r < count; ++r) {  // row j: query position j / group, head j % group
        const int64_t at = first + r, head = kv_head * group + at % group;
        h.query[r] = q + (at / group) * query.stride(0) + head * query.stride(1);
        h.out[r] = y + (at / group) * q_heads * HEAD_DIM + head * HEAD_DIM;
      }
      attend_block(h, count, static_cast<float>(scale), scores.data());
    }
  });
#endif
  return out;
}
