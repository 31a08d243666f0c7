// Attention of a draft's few query rows over all keys (dcoco.models.draft_attention), built
// beside cpu_kernels.cpp.
//
// A draft pass attends 4-24 query rows per kv head to a few hundred keys, without a mask; at that
// size SDPA's CPU kernel spends most of its 50-170 µs on set-up. Here, per kv head and block of up
// to 4 queries: scores with AVX-512 bf16 dot products (vdpbf16ps: bf16 pairs multiplied exactly,
// summed in fp32) times the scale, a softmax in fp32 (exp by a degree-6 polynomial and scalef,
// relative error ~1e-7), then the values in fp32, rounded to bf16 once at the end. Not bit-equal to
// SDPA (another order of sums): for the drafter only, whose tokens the target verifies.

#include <torch/extension.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <vector>

#if defined(__AVX512F__) && defined(__AVX512BF16__) && defined(__AVX512BW__)
#include <immintrin.h>
#define DCOCO_DRAFT_ATTENTION 1
#endif

namespace {

#ifdef DCOCO_DRAFT_ATTENTION
constexpr int QUERIES = 4;  // query rows sharing each key's and value's loads
constexpr int HEAD_DIM = 64;
constexpr int CHUNKS = HEAD_DIM / 16;  // fp32 registers per row

// e^x for x <= 0 (a score minus its row's max): 2^n · p(f), x = n·ln2 + f, |f| <= ln2 / 2.
inline __m512 exp_nonpositive(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-88.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 f = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
  f = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187e-06f), f);
  __m512 p = _mm512_set1_ps(1.0f / 720);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f / 120));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f / 24));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f / 6));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}

inline __m512 widen(const c10::BFloat16* at) {  // 16 bf16 -> 16 fp32
  const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(at));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}

struct Head {
  const c10::BFloat16 *query, *key, *value;
  int64_t keys, key_stride, value_stride;
};

// Softmax of `scores` [count] in place; returns 1 / its sum.
float softmax_row(float* scores, int64_t count) {
  float best = -INFINITY;
  for (int64_t j = 0; j < count; ++j) best = std::max(best, scores[j]);
  const __m512 shift = _mm512_set1_ps(best);
  __m512 total = _mm512_setzero_ps();
  int64_t j = 0;
  for (; j + 16 <= count; j += 16) {
    const __m512 e = exp_nonpositive(_mm512_sub_ps(_mm512_loadu_ps(scores + j), shift));
    _mm512_storeu_ps(scores + j, e);
    total = _mm512_add_ps(total, e);
  }
  if (j < count) {
    const __mmask16 tail = static_cast<__mmask16>((1u << (count - j)) - 1);
    const __m512 x = _mm512_maskz_sub_ps(tail, _mm512_maskz_loadu_ps(tail, scores + j), shift);
    const __m512 e = _mm512_maskz_mov_ps(tail, exp_nonpositive(x));
    _mm512_mask_storeu_ps(scores + j, tail, e);
    total = _mm512_add_ps(total, e);
  }
  return 1.0f / _mm512_reduce_add_ps(total);
}

// Query rows [first, first + rows) of one head -> out rows (bf16, [rows][64]).
void attend_block(const Head& h, int64_t first, int rows, float scale, float* scores,
                  c10::BFloat16* out) {
  __m512bh query[QUERIES][2];
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < 2; ++c) {
      query[r][c] = (__m512bh)_mm512_loadu_si512(h.query + (first + r) * HEAD_DIM + 32 * c);
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
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + r * HEAD_DIM + 16 * c),
                          (__m256i)_mm512_cvtneps_pbh(y));
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

// query [1, heads, rows, 64] contiguous; key, value [1, heads, keys, 64] (rows contiguous,
// any row stride) bf16 -> softmax(q kᵀ · scale) v [1, heads, rows, 64] bf16.
torch::Tensor draft_attention(const torch::Tensor& query, const torch::Tensor& key,
                              const torch::Tensor& value, double scale) {
  TORCH_CHECK(draft_attention_available(), "draft_attention needs AVX-512 bf16");
  for (const auto* t : {&query, &key, &value}) {
    TORCH_CHECK(t->scalar_type() == at::kBFloat16 && t->dim() == 4 && t->size(0) == 1 &&
                    t->size(3) == 64 && t->stride(3) == 1,
                "bf16 [1, heads, rows, 64] with contiguous rows expected");
  }
  TORCH_CHECK(query.is_contiguous() && key.sizes() == value.sizes() &&
                  key.size(1) == query.size(1) && key.size(2) > 0,
              "query contiguous; key and value of one shape, the query's heads");
  auto out = torch::empty(query.sizes(), query.options());
#ifdef DCOCO_DRAFT_ATTENTION
  const int64_t heads = query.size(1), rows = query.size(2), keys = key.size(2);
  const int64_t blocks = (rows + QUERIES - 1) / QUERIES;
  const auto* q = query.data_ptr<c10::BFloat16>();
  const auto* k = key.data_ptr<c10::BFloat16>();
  const auto* v = value.data_ptr<c10::BFloat16>();
  auto* y = out.data_ptr<c10::BFloat16>();
  at::parallel_for(0, heads * blocks, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores(QUERIES * keys);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t head = task / blocks, first = (task % blocks) * QUERIES;
      const Head h{q + head * rows * HEAD_DIM, k + head * key.stride(1),
                   v + head * value.stride(1), keys, key.stride(2), value.stride(2)};
      const int count = static_cast<int>(std::min<int64_t>(QUERIES, rows - first));
      attend_block(h, first, count, static_cast<float>(scale), scores.data(),
                   y + (head * rows + first) * HEAD_DIM);
    }
  });
#endif
  return out;
}
