// Products of a few fp32 rows with a weight matrix kept in fp32 or bf16, for corrector_walk.cpp.
//
// The corrector's products have 1-112 rows against weights of 65 K-295 K numbers, and in decoding
// those weights come from memory: the target's forward streams 100+ MB through the caches between
// two drafts. So the cost is reading the weights once, in order, on both cores: each output's
// weight row is widened to fp32 once and meets every input row there (four at a time, four
// independent sums). A checkpoint stores its weights in bf16, so a corrector loaded from one holds
// weights that bf16 keeps exactly: stored so (fused_walk.py checks), they are read in half the
// bytes for the same products.
#pragma once

#include <torch/extension.h>

#include <ATen/Parallel.h>

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

// out [m, rows] = x [m, n] . weight [rows, n]^T (+ bias [rows]); rows split over the threads.
template <typename Weight>
void linear(const float* x, int64_t m, int64_t n, const Weight* weight, int64_t rows,
            const float* bias, float* out) {
  at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
    std::vector<float> row(n);
    for (int64_t j = begin; j < end; ++j) {
      widen(weight + j * n, n, row.data());
      const float* w = row.data();
      const float add = bias != nullptr ? bias[j] : 0.0f;
      int64_t r = 0;
      for (; r + 4 <= m; r += 4) {
        const float *x0 = x + r * n, *x1 = x0 + n, *x2 = x1 + n, *x3 = x2 + n;
        float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
#pragma omp simd reduction(+ : s0, s1, s2, s3)
        for (int64_t i = 0; i < n; ++i) {
          s0 += x0[i] * w[i];
          s1 += x1[i] * w[i];
          s2 += x2[i] * w[i];
          s3 += x3[i] * w[i];
        }
        out[r * rows + j] = s0 + add;
        out[(r + 1) * rows + j] = s1 + add;
        out[(r + 2) * rows + j] = s2 + add;
        out[(r + 3) * rows + j] = s3 + add;
      }
      for (; r < m; ++r) out[r * rows + j] = dot(x + r * n, w, n) + add;
    }
  });
}

// `linear` with the weight [rows, n] a tensor of either dtype; bias may be undefined.
inline void linear(const float* x, int64_t m, const torch::Tensor& weight,
                   const torch::Tensor& bias, float* out) {
  const int64_t rows = weight.size(0), n = weight.size(1);
  const float* add = bias.defined() ? bias.data_ptr<float>() : nullptr;
  if (weight.scalar_type() == at::kBFloat16) {
    linear(x, m, n, weight.data_ptr<c10::BFloat16>(), rows, add, out);
  } else {
    linear(x, m, n, weight.data_ptr<float>(), rows, add, out);
  }
}

}  // namespace dcoco_rows
