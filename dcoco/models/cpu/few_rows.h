// Products of a few fp32 rows with a weight matrix kept in fp32 or bf16, for corrector_walk.cpp.
//
// The corrector's products have 1-112 rows against weights of 65 K-295 K numbers, and in decoding
// those weights come from memory: the target's forward streams 100+ MB through the caches between
// two drafts. So the cost is reading the weights once, in order, on both cores, and then the
// multiply-adds (`linear`). A checkpoint stores its weights in bf16, so a corrector loaded from
// one holds weights that bf16 keeps exactly: stored so (fused_walk.py checks), they are read in
// half the bytes for the same products.
#pragma once

#include <torch/extension.h>

#include <ATen/Parallel.h>

#include "vector_math.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

namespace dcoco_rows {

inline float dot(const float* a, const float* b, int64_t n) {
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int64_t i = 0; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

inline void widen(const float* row, int64_t n, float* out) { std::memcpy(out, row, n * 4); }

inline void widen(const c10::BFloat16* row, int64_t n, float* out) {
  const uint16_t* raw = reinterpret_cast<const uint16_t*>(row);
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t bits = static_cast<uint32_t>(raw[i]) << 16;
    float value;
    std::memcpy(&value, &bits, sizeof value);
    out[i] = value;
  }
}

// out [m, rows] = x [m, n] . weight [n, rows] (+ bias [rows]), the weight stored transposed (one
// input's weights to every output contiguous). Outputs go in blocks of BLOCK split over the
// threads; four input rows at a time sum into 4 x BLOCK registers, each weight read once per four
// rows: the products are FMA-bound, not bound by loads and horizontal sums as row dots are.
constexpr int64_t BLOCK = 32;

// sums [count, width] of x [count, n] (row stride n) . weight [n, BLOCK] (one block's columns).
template <typename Weight>
void block(const float* x, int64_t count, int64_t n, const Weight* weight, int64_t width,
           float sums[4][BLOCK]) {
  float column[BLOCK];
  for (int64_t i = 0; i < n; ++i) {
    widen(weight + i * BLOCK, width, column);
    for (int64_t q = 0; q < count; ++q) {
      const float input = x[q * n + i];
#pragma omp simd
      for (int64_t j = 0; j < width; ++j) sums[q][j] += input * column[j];
    }
  }
}

#ifdef DCOCO_VECTOR_MATH
inline __m512 load16(const float* at) { return _mm512_loadu_ps(at); }
inline __m512 load16(const c10::BFloat16* at) { return dcoco_vector::widen(at); }

// `block` for four whole rows and a whole block: 8 sums in registers, 8 FMAs per input.
template <typename Weight>
void block_4x32(const float* x, int64_t n, const Weight* weight, float sums[4][BLOCK]) {
  __m512 s[4][2];
  for (auto& row : s) row[0] = row[1] = _mm512_setzero_ps();
  for (int64_t i = 0; i < n; ++i) {
    const __m512 low = load16(weight + i * BLOCK), high = load16(weight + i * BLOCK + 16);
    for (int q = 0; q < 4; ++q) {
      const __m512 input = _mm512_set1_ps(x[q * n + i]);
      s[q][0] = _mm512_fmadd_ps(input, low, s[q][0]);
      s[q][1] = _mm512_fmadd_ps(input, high, s[q][1]);
    }
  }
  for (int q = 0; q < 4; ++q) {
    _mm512_storeu_ps(sums[q], s[q][0]);
    _mm512_storeu_ps(sums[q] + 16, s[q][1]);
  }
}
#endif

// out [m, rows] = x [m, n] . W [n, rows] (+ bias [rows]), W stored by blocks of BLOCK outputs
// ([blocks, n, BLOCK], zero past `rows`): each block's weights one contiguous stream.
template <typename Weight>
void linear(const float* x, int64_t m, int64_t n, const Weight* weight, int64_t rows,
            const float* bias, float* out) {
  const int64_t blocks = (rows + BLOCK - 1) / BLOCK;
  at::parallel_for(0, blocks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      const int64_t first = b * BLOCK, width = std::min(BLOCK, rows - first);
      const Weight* columns = weight + b * n * BLOCK;
      for (int64_t r = 0; r < m; r += 4) {
        const int64_t count = std::min<int64_t>(4, m - r);
        float sums[4][BLOCK] = {};
#ifdef DCOCO_VECTOR_MATH
        if (count == 4) {
          block_4x32(x + r * n, n, columns, sums);
        } else {
          block(x + r * n, count, n, columns, BLOCK, sums);
        }
#else
        block(x + r * n, count, n, columns, BLOCK, sums);
#endif
        for (int64_t q = 0; q < count; ++q) {
          for (int64_t j = 0; j < width; ++j) {
            out[(r + q) * rows + first + j] = sums[q][j] + (bias ? bias[first + j] : 0.0f);
          }
        }
      }
    }
  });
}

// `linear` with the weight [blocks, n, BLOCK] a tensor of either dtype and `rows` outputs; bias
// may be undefined.
inline void linear(const float* x, int64_t m, const torch::Tensor& weight, int64_t rows,
                   const torch::Tensor& bias, float* out) {
  TORCH_CHECK(weight.dim() == 3 && weight.size(2) == BLOCK, "weights by blocks of 32 outputs");
  const int64_t n = weight.size(1);
  const float* add = bias.defined() ? bias.data_ptr<float>() : nullptr;
  if (weight.scalar_type() == at::kBFloat16) {
    linear(x, m, n, weight.data_ptr<c10::BFloat16>(), rows, add, out);
  } else {
    linear(x, m, n, weight.data_ptr<float>(), rows, add, out);
  }
}

}  // namespace dcoco_rows
