// Row arithmetic for corrector_walk.cpp: e^x, silu, a row's top-K and log normaliser, a
// LayerNorm + silu, in plain loops the compiler vectorises (AVX2 or AVX-512 alike).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

namespace dcoco_rows {

// e^x by a degree-6 polynomial on x = n ln2 + f (vector_math.h's), in scalar code the compiler
// vectorises (no calls, no branches); x is clamped to [-80, 88] so 2^n stays a normal number.
inline float poly_exp(float x) {
  x = std::min(std::max(x, -80.0f), 88.0f);
  const float shifter = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const float n = (x * 1.44269504f + shifter) - shifter;
  float f = x - n * 0.693145751953125f;
  f = f - n * 1.428606765330187e-06f;
  float p = 1.0f / 720;
  p = p * f + 1.0f / 120;
  p = p * f + 1.0f / 24;
  p = p * f + 1.0f / 6;
  p = p * f + 0.5f;
  p = p * f + 1.0f;
  p = p * f + 1.0f;
  int32_t bits;
  std::memcpy(&bits, &p, sizeof bits);
  bits += static_cast<int32_t>(n) << 23;
  std::memcpy(&p, &bits, sizeof p);
  return p;
}

inline float silu(float x) { return x / (1.0f + poly_exp(-x)); }

// The k largest values of row[0, n) descending and their columns (an equal value after the ones
// kept); chunks of 16 whose maximum cannot enter are skipped after one vector reduction.
inline void row_top(const float* row, int64_t n, int64_t k, float* values, int64_t* columns) {
  int64_t kept = 0;
  for (int64_t start = 0; start < n; start += 16) {
    const int64_t end = std::min(n, start + 16);
    if (kept == k) {
      float most = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : most)
      for (int64_t i = start; i < end; ++i) most = std::max(most, row[i]);
      if (!(most > values[k - 1])) continue;
    }
    for (int64_t i = start; i < end; ++i) {
      const float value = row[i];
      if (kept == k && !(value > values[k - 1])) continue;
      int64_t at = kept < k ? kept++ : k - 1;
      while (at > 0 && value > values[at - 1]) {
        values[at] = values[at - 1];
        columns[at] = columns[at - 1];
        --at;
      }
      values[at] = value;
      columns[at] = i;
    }
  }
}

inline float log_sum_exp(const float* row, int64_t n, float most) {
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int64_t i = 0; i < n; ++i) sum += poly_exp(row[i] - most);
  return most + std::log(sum);
}

// z = silu(LayerNorm(x)) of one row, in place.
inline void norm_silu(float* x, const float* gain, const float* bias, int64_t n, float eps) {
  float mean = 0.0f, squares = 0.0f;
#pragma omp simd reduction(+ : mean)
  for (int64_t i = 0; i < n; ++i) mean += x[i];
  mean /= static_cast<float>(n);
#pragma omp simd reduction(+ : squares)
  for (int64_t i = 0; i < n; ++i) squares += (x[i] - mean) * (x[i] - mean);
  const float scale = 1.0f / std::sqrt(squares / static_cast<float>(n) + eps);
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) x[i] = silu((x[i] - mean) * scale * gain[i] + bias[i]);
}

}  // namespace dcoco_rows
