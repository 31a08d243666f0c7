// Int4-by-int8 dot products for a few rows (dcoco.models.int4_dot), built beside cpu_kernels.cpp.
//
// y = x Wᵀ with W as 4-bit codes q (0..15) and, per 32 inputs, w = (q - 8)·scale + zero; x rounded
// per row and 32 inputs to int8 (x ≈ a·xq, a = max|x| / 127): llama.cpp's Q4 × Q8 scheme. A
// group's sum Σ (q - 8)·xq is exact in int32 (AVX-512 VNNI's vpdpbusd: 64 byte products a call),
// then y += scale·a·Σ (q - 8)·xq + zero·Σ x, with Σ x the fp32 sum of the unrounded inputs.
//
// Weights arrive packed by output blocks of 16 ([out / 16, in / 8, 16, 4] bytes): lane n's four
// bytes hold inputs k..k+3 in the low nibbles and k+4..k+7 in the high ones, so one 64-byte load
// is 128 weights and each vpdpbusd takes four inputs of one row broadcast to all 16 lanes. The
// weights are unpacked once per block for every row (up to 8 rows per pass). Each row's sums run
// in the same order whatever the number of rows, so a row's result does not depend on its batch.

#include <torch/extension.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#include <immintrin.h>
#define DCOCO_INT4_DOT 1
#endif

namespace {

constexpr int64_t GROUP = 32;
constexpr int64_t LANES = 16;
constexpr int ROWS_PER_PASS = 8;  // rows sharing one unpacking of a weight block

// Rows rounded to int8 per group: codes [rows, in], scale a and fp32 sum per [rows, groups].
struct QuantisedRows {
  std::vector<uint8_t> codes;  // xq + 128
  std::vector<float> scale, sum;
};

QuantisedRows quantise_rows(const torch::Tensor& x) {
  const auto values = x.to(torch::kFloat32).contiguous();
  const int64_t rows = values.size(0), in = values.size(1), groups = in / GROUP;
  const float* data = values.data_ptr<float>();
  QuantisedRows out{std::vector<uint8_t>(rows * in), std::vector<float>(rows * groups),
                    std::vector<float>(rows * groups)};
  for (int64_t g = 0; g < rows * groups; ++g) {
    const float* v = data + g * GROUP;
    float amax = 0.0f, total = 0.0f;
    for (int64_t i = 0; i < GROUP; ++i) {
      amax = std::max(amax, std::fabs(v[i]));
      total += v[i];
    }
    const float a = amax / 127.0f, inverse = amax > 0.0f ? 127.0f / amax : 0.0f;
    for (int64_t i = 0; i < GROUP; ++i) {
      out.codes[g * GROUP + i] = static_cast<uint8_t>(std::nearbyint(v[i] * inverse) + 128.0f);
    }
    out.scale[g] = a;
    out.sum[g] = total;
  }
  return out;
}

#ifdef DCOCO_INT4_DOT
template <typename T>
const __m256i* ymm(const T* at) {
  return reinterpret_cast<const __m256i*>(at);
}

// Rows [row0, row0 + R) of one block of 16 outputs: fp32 results into out [R][16]. vpdpbusd
// multiplies unsigned by signed bytes: the rows go in as xq + 128 (1..255) and the weights as
// q - 8 (-8..7), so the rounding error of the rows meets centred weights, and 128·Σ(q - 8)
// (`offsets`, per output and group) comes back off. Up to 4 rows keep two sums a row (the low
// and high nibbles) so that a single row is not one chain of dependent instructions.
template <int R>
void block_rows(const uint8_t* weights, const at::Half* scales, const at::Half* zeros,
                const int16_t* offsets, const QuantisedRows& q, int64_t in, int64_t row0,
                float* out) {
  constexpr int A = R <= 4 ? 2 : 1;
  const int64_t groups = in / GROUP;
  const __m512i nibble = _mm512_set1_epi8(0x0F), eight = _mm512_set1_epi8(8);
  __m512 total[R];
  for (int r = 0; r < R; ++r) total[r] = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    __m512i dots[R][A];
    for (int r = 0; r < R; ++r) {
      for (int a = 0; a < A; ++a) dots[r][a] = _mm512_setzero_si512();
    }
    for (int64_t j = 0; j < GROUP / 8; ++j) {
      const __m512i packed = _mm512_loadu_si512(weights + (g * (GROUP / 8) + j) * 64);
      const __m512i low = _mm512_sub_epi8(_mm512_and_si512(packed, nibble), eight);
      const __m512i high =
          _mm512_sub_epi8(_mm512_and_si512(_mm512_srli_epi16(packed, 4), nibble), eight);
      for (int r = 0; r < R; ++r) {
        const uint8_t* x = q.codes.data() + (row0 + r) * in + g * GROUP + j * 8;
        int32_t first, second;
        std::memcpy(&first, x, 4);
        std::memcpy(&second, x + 4, 4);
        dots[r][0] = _mm512_dpbusd_epi32(dots[r][0], _mm512_set1_epi32(first), low);
        dots[r][A - 1] = _mm512_dpbusd_epi32(dots[r][A - 1], _mm512_set1_epi32(second), high);
      }
    }
    const __m512 scale = _mm512_cvtph_ps(_mm256_loadu_si256(ymm(scales + g * LANES)));
    const __m512 zero = _mm512_cvtph_ps(_mm256_loadu_si256(ymm(zeros + g * LANES)));
    const __m512i offset = _mm512_cvtepi16_epi32(_mm256_loadu_si256(ymm(offsets + g * LANES)));
    for (int r = 0; r < R; ++r) {
      const int64_t at = (row0 + r) * groups + g;
      __m512i sum = dots[r][0];
      if (A == 2) sum = _mm512_add_epi32(sum, dots[r][A - 1]);
      const __m512 dot = _mm512_cvtepi32_ps(_mm512_sub_epi32(sum, offset));
      const __m512 step = _mm512_mul_ps(scale, _mm512_set1_ps(q.scale[at]));
      total[r] = _mm512_fmadd_ps(dot, step, total[r]);
      total[r] = _mm512_fmadd_ps(zero, _mm512_set1_ps(q.sum[at]), total[r]);
    }
  }
  for (int r = 0; r < R; ++r) _mm512_storeu_ps(out + r * LANES, total[r]);
}

using BlockRows = void (*)(const uint8_t*, const at::Half*, const at::Half*, const int16_t*,
                           const QuantisedRows&, int64_t, int64_t, float*);
constexpr BlockRows BY_ROWS[ROWS_PER_PASS] = {block_rows<1>, block_rows<2>, block_rows<3>,
                                         block_rows<4>, block_rows<5>, block_rows<6>,
                                         block_rows<7>, block_rows<8>};
#endif

}  // namespace

bool int4_dot_available() {
#ifdef DCOCO_INT4_DOT
  return true;
#else
  return false;
#endif
}

// x [rows, in] (bf16 or fp32); weights [out / 16, in / 8, 16, 4] uint8; scales, zeros
// [out / 16, in / 32, 16] fp16 (w = (q - 8)·scale + zero); offsets [out / 16, in / 32, 16] int16
// (128·Σ(q - 8) per group) -> [rows, out] bf16. 22 bytes per 32 weights, as many as torch's
// int4 layers read (20), so a product streams from memory as fast.
torch::Tensor int4_dot(const torch::Tensor& x, const torch::Tensor& weights,
                       const torch::Tensor& scales, const torch::Tensor& zeros,
                       const torch::Tensor& offsets) {
  TORCH_CHECK(int4_dot_available(), "int4_dot needs AVX-512 VNNI");
  TORCH_CHECK(x.dim() == 2 && x.size(1) % GROUP == 0, "x [rows, in], in divisible by 32");
  const int64_t rows = x.size(0), in = x.size(1), blocks = weights.size(0);
  TORCH_CHECK(weights.scalar_type() == at::kByte && weights.is_contiguous() &&
                  weights.numel() == blocks * in * 8,
              "weights [out / 16, in / 8, 16, 4] uint8 expected");
  const int64_t per_block = (in / GROUP) * LANES;
  for (const auto* t : {&scales, &zeros, &offsets}) {
    const auto dtype = t == &offsets ? at::kShort : at::kHalf;
    TORCH_CHECK(t->scalar_type() == dtype && t->is_contiguous() && t->numel() == blocks * per_block,
                "scales, zeros (fp16) and offsets (int16) [out / 16, in / 32, 16] expected");
  }
  auto out = torch::empty({rows, blocks * LANES}, x.options().dtype(at::kBFloat16));
#ifdef DCOCO_INT4_DOT
  const QuantisedRows q = quantise_rows(x);
  const uint8_t* w = weights.data_ptr<uint8_t>();
  const at::Half* s = scales.data_ptr<at::Half>();
  const at::Half* z = zeros.data_ptr<at::Half>();
  const int16_t* o = offsets.data_ptr<int16_t>();
  c10::BFloat16* y = out.data_ptr<c10::BFloat16>();
  at::parallel_for(0, blocks, 8, [&](int64_t first, int64_t last) {
    float results[ROWS_PER_PASS * LANES];
    for (int64_t b = first; b < last; ++b) {
      const int64_t at = b * per_block;
      for (int64_t row0 = 0; row0 < rows; row0 += ROWS_PER_PASS) {
        const int count = static_cast<int>(std::min<int64_t>(ROWS_PER_PASS, rows - row0));
        BY_ROWS[count - 1](w + b * in * 8, s + at, z + at, o + at, q, in, row0, results);
        for (int r = 0; r < count; ++r) {
          for (int64_t n = 0; n < LANES; ++n) {
            y[(row0 + r) * blocks * LANES + b * LANES + n] = results[r * LANES + n];
          }
        }
      }
    }
  });
#endif
  return out;
}
