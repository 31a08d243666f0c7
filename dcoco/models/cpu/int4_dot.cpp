// Int4-by-int8 dot products for a few rows (dcoco.models.target.int4_dot), built beside cpu_kernels.cpp.
//
// y = x Wᵀ with W as 4-bit codes q (0..15) and, per 32 inputs, w = (q - 8)·scale + zero; x rounded
// per row and 32 inputs to int8 (x ≈ a·xq, a = max|x| / 127): llama.cpp's Q4 × Q8 scheme. A
// group's sum Σ (q - 8)·xq is exact in int32 (AVX-512 VNNI's vpdpbusd: 64 byte products a call,
// the codes as its unsigned bytes and the row as its signed ones, 8·Σ xq taken back off), then
// y += scale·a·Σ (q - 8)·xq + zero·Σ x, with Σ x the fp32 sum of the unrounded inputs.
//
// Weights arrive packed by output blocks of 16 ([out / 16, in / 8, 16, 4] bytes): lane n's four
// bytes hold inputs k..k+3 in the low nibbles and k+4..k+7 in the high ones, so one 64-byte load
// is 128 weights and each vpdpbusd takes four inputs of one row broadcast to all 16 lanes. The
// weights are unpacked once per block for every row (up to 8 rows per pass; 4 in AVX2 without
// VNNI, int4_dot_avx2.h). Each row's sums run in the same order whatever the number of rows, so a
// row's result does not depend on its batch.

#include <torch/extension.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "vector_math.h"

#ifdef __AVX2__
#include <immintrin.h>
#endif

#if defined(DCOCO_VECTOR_MATH) && defined(__AVX512VNNI__)
#define DCOCO_INT4_DOT 1
#define DCOCO_INT4_DOT_ISA "avx512-vnni"
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define DCOCO_INT4_DOT_AVX2 1  // int4_dot_avx2.h: the same products in 256-bit registers
#endif

namespace {

constexpr int64_t GROUP = 32;
constexpr int64_t LANES = 16;

#if defined(DCOCO_INT4_DOT) || defined(DCOCO_INT4_DOT_AVX2)
// Rows rounded to int8 per group: codes [rows, in]; per [rows, groups] the scale a, the fp32 sum
// of the inputs and 8·Σ xq (Σ (q - 8)·xq = Σ q·xq - 8·Σ xq).
struct QuantisedRows {
  std::vector<int8_t> codes;
  std::vector<float> scale, sum;
  std::vector<int32_t> eights;
};
#endif

#ifdef DCOCO_INT4_DOT_AVX2
#include "int4_dot_avx2.h"
#elif defined(DCOCO_INT4_DOT)
constexpr int ROWS_PER_PASS = 8;  // rows sharing one unpacking of a weight block

// 32 inputs of a row as fp32, from bf16 (its bits shifted up) or fp32.
template <typename T>
void load_group(const T* v, __m512& first, __m512& second) {
  if constexpr (std::is_same_v<T, float>) {
    first = _mm512_loadu_ps(v);
    second = _mm512_loadu_ps(v + LANES);
  } else {
    first = dcoco_vector::widen(v);
    second = dcoco_vector::widen(v + LANES);
  }
}

// Each row and 32 inputs: a = max|x| / 127, xq = round-to-even(x·127 / max|x|), in AVX-512.
template <typename T>
QuantisedRows quantise_rows(const T* data, int64_t rows, int64_t in) {
  const int64_t groups = in / GROUP;
  QuantisedRows out{std::vector<int8_t>(rows * in), std::vector<float>(rows * groups),
                    std::vector<float>(rows * groups), std::vector<int32_t>(rows * groups)};
  for (int64_t g = 0; g < rows * groups; ++g) {
    __m512 first, second;
    load_group(data + g * GROUP, first, second);
    const float amax =
        _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(first), _mm512_abs_ps(second)));
    const __m512 inverse = _mm512_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
    const __m512i low = _mm512_cvtps_epi32(_mm512_mul_ps(first, inverse));  // MXCSR: to even
    const __m512i high = _mm512_cvtps_epi32(_mm512_mul_ps(second, inverse));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(&out.codes[g * GROUP]), _mm512_cvtepi32_epi8(low));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(&out.codes[g * GROUP + LANES]),
                     _mm512_cvtepi32_epi8(high));
    out.scale[g] = amax / 127.0f;
    out.sum[g] = _mm512_reduce_add_ps(_mm512_add_ps(first, second));
    out.eights[g] = 8 * _mm512_reduce_add_epi32(_mm512_add_epi32(low, high));
  }
  return out;
}

template <typename T>
const __m256i* ymm(const T* at) {
  return reinterpret_cast<const __m256i*>(at);
}

// Rows [row0, row0 + R) of one block of 16 outputs, written as bf16 to y (row stride `stride`).
// vpdpbusd multiplies unsigned by signed bytes: the codes go in as they are (0..15) and each
// row's four bytes broadcast as its signed operand, which the instruction can read straight
// from memory. Up to 4 rows keep two sums a row (the low and high nibbles) so that a single row
// is not one chain of dependent instructions.
template <int R>
void block_rows(const uint8_t* weights, const at::Half* scales, const at::Half* zeros,
                const QuantisedRows& q, int64_t in, int64_t row0, c10::BFloat16* y,
                int64_t stride) {
  constexpr int A = R <= 4 ? 2 : 1;
  const int64_t groups = in / GROUP;
  const int8_t* rows = q.codes.data() + row0 * in;
  const __m512i nibble = _mm512_set1_epi8(0x0F);
  __m512 total[R];
  for (int r = 0; r < R; ++r) total[r] = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    __m512i dots[R][A];
    for (int r = 0; r < R; ++r) {
      for (int a = 0; a < A; ++a) dots[r][a] = _mm512_setzero_si512();
    }
    for (int64_t j = 0; j < GROUP / 8; ++j) {
      const __m512i packed = _mm512_loadu_si512(weights + (g * (GROUP / 8) + j) * 64);
      const __m512i low = _mm512_and_si512(packed, nibble);
      const __m512i high = _mm512_and_si512(_mm512_srli_epi16(packed, 4), nibble);
      for (int r = 0; r < R; ++r) {
        const int8_t* x = rows + r * in + g * GROUP + j * 8;
        int32_t first, second;
        std::memcpy(&first, x, 4);
        std::memcpy(&second, x + 4, 4);
        dots[r][0] = _mm512_dpbusd_epi32(dots[r][0], low, _mm512_set1_epi32(first));
        dots[r][A - 1] = _mm512_dpbusd_epi32(dots[r][A - 1], high, _mm512_set1_epi32(second));
      }
    }
    const __m512 scale = _mm512_cvtph_ps(_mm256_loadu_si256(ymm(scales + g * LANES)));
    const __m512 zero = _mm512_cvtph_ps(_mm256_loadu_si256(ymm(zeros + g * LANES)));
    for (int r = 0; r < R; ++r) {
      const int64_t at = (row0 + r) * groups + g;
      __m512i sum = dots[r][0];
      if (A == 2) sum = _mm512_add_epi32(sum, dots[r][A - 1]);
      const __m512i exact = _mm512_sub_epi32(sum, _mm512_set1_epi32(q.eights[at]));
      const __m512 step = _mm512_mul_ps(scale, _mm512_set1_ps(q.scale[at]));
      total[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(exact), step, total[r]);
      total[r] = _mm512_fmadd_ps(zero, _mm512_set1_ps(q.sum[at]), total[r]);
    }
  }
  for (int r = 0; r < R; ++r) {
    c10::BFloat16* row = y + (row0 + r) * stride;
#ifdef DCOCO_VECTOR_BF16  // round to nearest even, as c10::BFloat16 does
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(row), dcoco_vector::narrow(total[r]));
#else
    alignas(64) float results[LANES];
    _mm512_store_ps(results, total[r]);
    for (int64_t n = 0; n < LANES; ++n) row[n] = results[n];
#endif
  }
}
#endif

#ifdef DCOCO_INT4_DOT
using BlockRows = void (*)(const uint8_t*, const at::Half*, const at::Half*, const QuantisedRows&,
                           int64_t, int64_t, c10::BFloat16*, int64_t);

template <std::size_t... I>
constexpr std::array<BlockRows, sizeof...(I)> by_rows(std::index_sequence<I...>) {
  return {block_rows<static_cast<int>(I) + 1>...};
}
constexpr auto BY_ROWS = by_rows(std::make_index_sequence<ROWS_PER_PASS>{});
#endif

}  // namespace

bool int4_dot_available() {
#ifdef DCOCO_INT4_DOT
  return true;
#else
  return false;
#endif
}

// The instructions int4_dot was built on: "avx512-vnni", "avx2", or "" where it was not built.
std::string int4_dot_isa() {
#ifdef DCOCO_INT4_DOT
  return DCOCO_INT4_DOT_ISA;
#else
  return "";
#endif
}

// x [rows, in] (bf16 or fp32, contiguous); weights [out / 16, in / 8, 16, 4] uint8; scales,
// zeros [out / 16, in / 32, 16] fp16 (w = (q - 8)·scale + zero) -> [rows, out] bf16. 20 bytes
// per 32 weights, as many as torch's int4 layers read, so a product streams from memory as fast.
torch::Tensor int4_dot(const torch::Tensor& x, const torch::Tensor& weights,
                       const torch::Tensor& scales, const torch::Tensor& zeros) {
  TORCH_CHECK(int4_dot_available(), "int4_dot needs AVX-512 VNNI or AVX2");
  TORCH_CHECK(x.dim() == 2 && x.size(1) % GROUP == 0 && x.is_contiguous(),
              "x [rows, in] contiguous, in divisible by 32");
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kFloat,
              "x bf16 or fp32");
  const int64_t rows = x.size(0), in = x.size(1), blocks = weights.size(0);
  TORCH_CHECK(weights.scalar_type() == at::kByte && weights.is_contiguous() &&
                  weights.numel() == blocks * in * 8,
              "weights [out / 16, in / 8, 16, 4] uint8 expected");
  const int64_t per_block = (in / GROUP) * LANES;
  for (const auto* t : {&scales, &zeros}) {
    TORCH_CHECK(
        t->scalar_type() == at::kHalf && t->is_contiguous() && t->numel() == blocks * per_block,
        "scales and zeros [out / 16, in / 32, 16] fp16 expected");
  }
  auto out = torch::empty({rows, blocks * LANES}, x.options().dtype(at::kBFloat16));
#ifdef DCOCO_INT4_DOT
  const QuantisedRows q = x.scalar_type() == at::kFloat
                              ? quantise_rows(x.data_ptr<float>(), rows, in)
                              : quantise_rows(x.data_ptr<c10::BFloat16>(), rows, in);
  const uint8_t* w = weights.data_ptr<uint8_t>();
  const at::Half* s = scales.data_ptr<at::Half>();
  const at::Half* z = zeros.data_ptr<at::Half>();
  c10::BFloat16* y = out.data_ptr<c10::BFloat16>();
  const int64_t stride = blocks * LANES;
  at::parallel_for(0, blocks, 8, [&](int64_t first, int64_t last) {
    for (int64_t b = first; b < last; ++b) {
      const int64_t at = b * per_block;
      for (int64_t row0 = 0; row0 < rows; row0 += ROWS_PER_PASS) {
        const int count = static_cast<int>(std::min<int64_t>(ROWS_PER_PASS, rows - row0));
        BY_ROWS[count - 1](w + b * in * 8, s + at, z + at, q, in, row0, y + b * LANES, stride);
      }
    }
  });
#endif
  return out;
}
