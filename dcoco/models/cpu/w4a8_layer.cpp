// A drafter layer's two halves around its w4a8 products, one call each (dcoco.models.target.int4_dot.qkv
// and .mlp), built beside cpu_kernels.cpp.
//
// w4a8_qkv: the q|k|v heads of [context; rms_norm(hidden)], q's and k's normed per head and
// rotated; w4a8_mlp: hidden + down(silu(gate) · up) with gate | up = gate_up(rms_norm(hidden)).
// The draft pass otherwise runs each as a norm, its products and several operators (a join and
// views; split, silu, the product with up, the residual sum), ~55 µs of calls a layer on a
// 2-core Zen 4. Each value is rounded to bf16 where those operators round it, so the results
// equal theirs except where silu's exp (vector_math.h's polynomial, ~1 fp32 step) rounds to
// another bf16 than PyTorch's.

#include <torch/extension.h>

#include <cmath>

#include "vector_math.h"

// cpu_kernels.cpp and int4_dot.cpp, built into the same module
torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps);
torch::Tensor rotate(const torch::Tensor& x, const torch::Tensor& cos,
                     const torch::Tensor& signed_sin, const c10::optional<torch::Tensor>& weight,
                     double eps);
torch::Tensor int4_dot(const torch::Tensor& x, const torch::Tensor& weights,
                       const torch::Tensor& scales, const torch::Tensor& zeros);

namespace {

using bf16 = c10::BFloat16;

// act [rows, width] = bf16(bf16(silu(gate)) · up), gate and up the two halves' first `width`
// columns of gate_up [rows, stride] (silu(g) = g / (1 + e^-g), in fp32 as PyTorch computes it).
void silu_mul(const bf16* gate_up, int64_t stride, int64_t up_at, int64_t rows, int64_t width,
              bf16* act) {
  for (int64_t r = 0; r < rows; ++r) {
    const bf16* gate = gate_up + r * stride;
    const bf16* up = gate + up_at;
    bf16* out = act + r * width;
    int64_t i = 0;
#ifdef DCOCO_VECTOR_BF16
    const __m512 one = _mm512_set1_ps(1.0f);
    for (; i + 16 <= width; i += 16) {
      const __m512 g = dcoco_vector::widen(gate + i);
      const __m512 negated = _mm512_sub_ps(_mm512_setzero_ps(), g);
      const __m512 silu = _mm512_div_ps(g, _mm512_add_ps(one, dcoco_vector::exp(negated)));
      const __m512 rounded = dcoco_vector::round_bf16(silu);  // silu's own bf16 result
      const __m512 product = _mm512_mul_ps(rounded, dcoco_vector::widen(up + i));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), dcoco_vector::narrow(product));
    }
#endif
    for (; i < width; ++i) {
      const float g = gate[i], silu = static_cast<float>(bf16(g / (1.0f + std::exp(-g))));
      out[i] = bf16(silu * static_cast<float>(up[i]));
    }
  }
}

}  // namespace

// hidden [rows, n] bf16 contiguous, norm [n] bf16; gate_up and down as int4_dot's packed weights,
// scales and zeros (gate_up's outputs: gate's `width`, then up's) -> [rows, n] bf16.
torch::Tensor w4a8_mlp(const torch::Tensor& hidden, const torch::Tensor& norm, double eps,
                       const torch::Tensor& gate_up_weights, const torch::Tensor& gate_up_scales,
                       const torch::Tensor& gate_up_zeros, const torch::Tensor& down_weights,
                       const torch::Tensor& down_scales, const torch::Tensor& down_zeros,
                       int64_t width) {
  TORCH_CHECK(hidden.scalar_type() == at::kBFloat16 && hidden.dim() == 2 && hidden.is_contiguous(),
              "hidden [rows, n] bf16 contiguous expected");
  const int64_t rows = hidden.size(0), n = hidden.size(1);
  const auto gate_up = int4_dot(rms_norm(hidden, norm, eps), gate_up_weights, gate_up_scales,
                                gate_up_zeros);  // [rows, >= 2 width]
  TORCH_CHECK(gate_up.size(1) >= 2 * width && down_weights.size(1) * 8 == width,
              "gate_up's outputs are gate's `width` then up's; down takes `width` inputs");
  auto act = torch::empty({rows, width}, hidden.options());
  silu_mul(gate_up.data_ptr<bf16>(), gate_up.size(1), width, rows, width, act.data_ptr<bf16>());
  const auto down = int4_dot(act, down_weights, down_scales, down_zeros);  // [rows, >= n]
  TORCH_CHECK(down.size(1) >= n, "down's outputs must cover the hidden size");
  return hidden + down.narrow(1, 0, n);
}

// hidden [rows, n], context [tokens, n] bf16 (rows contiguous); norm [n]; the q|k|v product as
// int4_dot's packed weights, scales and zeros; qk_norm [rotated, 64] (one row per q and k head);
// cos, signed_sin [tokens + rows, 1, 64] -> (q|k heads normed and rotated [tokens + rows,
// rotated, 64], every head [tokens + rows, heads, 64] as the product left them).
std::tuple<torch::Tensor, torch::Tensor> w4a8_qkv(
    const torch::Tensor& hidden, const torch::Tensor& context, const torch::Tensor& norm,
    double eps, const torch::Tensor& weights, const torch::Tensor& scales,
    const torch::Tensor& zeros, int64_t out_features, const torch::Tensor& qk_norm,
    const torch::Tensor& cos, const torch::Tensor& signed_sin) {
  const int64_t head_dim = qk_norm.size(1), rotated = qk_norm.size(0);
  TORCH_CHECK(out_features % head_dim == 0 && rotated * head_dim <= out_features,
              "the product's outputs are whole heads, the rotated ones first");
  const auto input = torch::cat({context, rms_norm(hidden, norm, eps)});
  const auto products = int4_dot(input, weights, scales, zeros).narrow(1, 0, out_features);
  const auto heads = products.view({input.size(0), -1, head_dim});
  return {rotate(heads.narrow(1, 0, rotated), cos, signed_sin, qk_norm, eps), heads};
}
