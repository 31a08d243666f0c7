// int4_dot.cpp's two loops in AVX2 (with FMA and F16C), for CPUs without AVX-512 VNNI: AMD Zen 3,
// Intel before Cascade Lake. Included by int4_dot.cpp inside its namespace, after QuantisedRows,
// GROUP and LANES (<immintrin.h> included above); the same packed weights, the same rounding of the rows, the same sums.
//
// AVX2 has no vpdpbusd. vpmaddubsw multiplies the unsigned codes by the row's signed bytes and adds
// adjacent pairs into int16: a pair is at most 2·15·127 = 3,810, and a group's eight such sums a
// lane (4 loads x low and high nibbles) at most 30,480, so a group sums exactly in int16 and one
// vpmaddwd by ones widens it to the int32 sums vpdpbusd would have made. Each 64-byte load of 16
// lanes is two 32-byte halves (lanes 0-7, 8-15). With 16 registers, 4 rows share an unpacking.

#pragma once

#define DCOCO_INT4_DOT 1
#define DCOCO_INT4_DOT_ISA "avx2"

constexpr int ROWS_PER_PASS = 4;  // rows sharing one unpacking of a weight block

// 8 inputs of a row as fp32, from bf16 (its bits shifted up) or fp32.
template <typename T>
__m256 load8(const T* v) {
  if constexpr (std::is_same_v<T, float>) {
    return _mm256_loadu_ps(v);
  } else {
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(v));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(raw), 16));
  }
}

inline float max8(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
}

inline float sum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

inline int32_t sum8(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  return _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1)));
}

// Each row and 32 inputs: a = max|x| / 127, xq = round-to-even(x·127 / max|x|).
template <typename T>
QuantisedRows quantise_rows(const T* data, int64_t rows, int64_t in) {
  const int64_t groups = in / GROUP;
  QuantisedRows out{std::vector<int8_t>(rows * in), std::vector<float>(rows * groups),
                    std::vector<float>(rows * groups), std::vector<int32_t>(rows * groups)};
  const __m256 sign = _mm256_set1_ps(-0.0f);
  // packs_epi32 then packs_epi16 leave the 8-byte quarters in the order 0, 2, 4, 6, 1, 3, 5, 7
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (int64_t g = 0; g < rows * groups; ++g) {
    __m256 v[4];
    for (int i = 0; i < 4; ++i) v[i] = load8(data + g * GROUP + 8 * i);
    const __m256 largest = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, v[0]), _mm256_andnot_ps(sign, v[1])),
                                         _mm256_max_ps(_mm256_andnot_ps(sign, v[2]), _mm256_andnot_ps(sign, v[3])));
    const float amax = max8(largest);
    const __m256 inverse = _mm256_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
    __m256i q[4];  // MXCSR: to even
    for (int i = 0; i < 4; ++i) q[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], inverse));
    const __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(&out.codes[g * GROUP]),
                        _mm256_permutevar8x32_epi32(bytes, order));
    out.scale[g] = amax / 127.0f;
    out.sum[g] = sum8(_mm256_add_ps(_mm256_add_ps(v[0], v[1]), _mm256_add_ps(v[2], v[3])));
    out.eights[g] = 8 * sum8(_mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3])));
  }
  return out;
}

// Rows [row0, row0 + R) of one block of 16 outputs, written as bf16 to y (row stride `stride`).
template <int R>
void block_rows(const uint8_t* weights, const at::Half* scales, const at::Half* zeros,
                const QuantisedRows& q, int64_t in, int64_t row0, c10::BFloat16* y,
                int64_t stride) {
  const int64_t groups = in / GROUP;
  const int8_t* rows = q.codes.data() + row0 * in;
  const __m256i nibble = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
  __m256 total[R][2];
  for (int r = 0; r < R; ++r) total[r][0] = total[r][1] = _mm256_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    __m256i sums[R][2];  // int16, exact over the group (see the top)
    for (int r = 0; r < R; ++r) sums[r][0] = sums[r][1] = _mm256_setzero_si256();
    for (int64_t j = 0; j < GROUP / 8; ++j) {
      const uint8_t* at = weights + (g * (GROUP / 8) + j) * 64;
      __m256i low[2], high[2];
      for (int h = 0; h < 2; ++h) {
        const __m256i packed = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(at + 32 * h));
        low[h] = _mm256_and_si256(packed, nibble);
        high[h] = _mm256_and_si256(_mm256_srli_epi16(packed, 4), nibble);
      }
      for (int r = 0; r < R; ++r) {
        const int8_t* x = rows + r * in + g * GROUP + j * 8;
        int32_t first, second;
        std::memcpy(&first, x, 4);
        std::memcpy(&second, x + 4, 4);
        const __m256i lows = _mm256_set1_epi32(first), highs = _mm256_set1_epi32(second);
        for (int h = 0; h < 2; ++h) {
          const __m256i pairs = _mm256_add_epi16(_mm256_maddubs_epi16(low[h], lows),
                                                 _mm256_maddubs_epi16(high[h], highs));
          sums[r][h] = _mm256_add_epi16(sums[r][h], pairs);
        }
      }
    }
    for (int h = 0; h < 2; ++h) {
      const auto* half = reinterpret_cast<const __m128i*>(scales + g * LANES + 8 * h);
      const __m256 scale = _mm256_cvtph_ps(_mm_loadu_si128(half));
      const __m256 zero = _mm256_cvtph_ps(
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(zeros + g * LANES + 8 * h)));
      for (int r = 0; r < R; ++r) {
        const int64_t at = (row0 + r) * groups + g;
        const __m256i sum = _mm256_madd_epi16(sums[r][h], ones);
        const __m256i exact = _mm256_sub_epi32(sum, _mm256_set1_epi32(q.eights[at]));
        const __m256 step = _mm256_mul_ps(scale, _mm256_set1_ps(q.scale[at]));
        total[r][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(exact), step, total[r][h]);
        total[r][h] = _mm256_fmadd_ps(zero, _mm256_set1_ps(q.sum[at]), total[r][h]);
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    alignas(32) float results[LANES];
    _mm256_store_ps(results, total[r][0]);
    _mm256_store_ps(results + 8, total[r][1]);
    c10::BFloat16* row = y + (row0 + r) * stride;
    for (int64_t n = 0; n < LANES; ++n) row[n] = results[n];  // to nearest even
  }
}
