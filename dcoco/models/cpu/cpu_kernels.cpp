// Fused CPU kernels for the decoding step's small bf16 operations (dcoco.models.cpu.cpu_kernels).
//
// Each kernel does in one call what eager PyTorch does in 4-12 operators, for the few rows a
// decoding step or a draft pass has; at ~1.5 us a call against 10-16 us for the operators. Every
// intermediate value is rounded to bf16 where PyTorch's operators round it, so each kernel equals
// its operators' result except where a sum of squares or an exp rounds differently in fp32 (the
// tests bound that to one bf16 step). Single-threaded: the work is a few thousand values.

#include <torch/extension.h>

#include <ATen/Parallel.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <string>

#ifdef __AVX512F__
#include <immintrin.h>
#endif

namespace {

using bf16 = c10::BFloat16;

inline float round_bf16(float value) { return static_cast<float>(bf16(value)); }

// Rows of a [rows, n] or [outer, inner, n] bf16 tensor whose last dim is contiguous.
struct Rows {
  const bf16* data;
  int64_t outer, inner, n, outer_stride, inner_stride;

  explicit Rows(const torch::Tensor& x) : data(x.data_ptr<bf16>()), n(x.size(-1)) {
    TORCH_CHECK(x.scalar_type() == at::kBFloat16, "bf16 input expected");
    TORCH_CHECK(x.dim() == 2 || x.dim() == 3, "2-D or 3-D input expected");
    TORCH_CHECK(x.stride(-1) == 1, "the last dim must be contiguous");
    outer = x.size(0);
    outer_stride = x.stride(0);
    inner = x.dim() == 3 ? x.size(1) : 1;
    inner_stride = x.dim() == 3 ? x.stride(1) : 0;
  }
  const bf16* row(int64_t i, int64_t j) const { return data + i * outer_stride + j * inner_stride; }
};

// out = bf16(weight * bf16(x * rsqrt(mean(x^2) + eps))), the RMSNorm of Llama / Qwen layers.
void norm_row(const bf16* x, const bf16* weight, int64_t n, float eps, float* out) {
  float partial[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};  // 8 chains: no serial add
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int lane = 0; lane < 8; ++lane) {
      const float value = x[i + lane];
      partial[lane] += value * value;
    }
  }
  float squares = 0.f;
  for (; i < n; ++i) squares += static_cast<float>(x[i]) * static_cast<float>(x[i]);
  for (float value : partial) squares += value;
  const float scale = 1.f / std::sqrt(squares / static_cast<float>(n) + eps);
  for (int64_t k = 0; k < n; ++k) {
    out[k] = round_bf16(static_cast<float>(weight[k]) * round_bf16(x[k] * scale));
  }
}

// x cos + roll(x, n / 2) signed_sin, each product and the sum rounded to bf16.
void rotate_row(const float* x, const bf16* cos, const bf16* signed_sin, int64_t n, bf16* out) {
  const int64_t half = n / 2;  // roll by half: out[i] reads x[i + half] below, x[i - half] above
  for (int64_t i = 0; i < half; ++i) {
    out[i] = bf16(round_bf16(x[i] * cos[i]) + round_bf16(x[i + half] * signed_sin[i]));
  }
  for (int64_t i = half; i < n; ++i) {
    out[i] = bf16(round_bf16(x[i] * cos[i]) + round_bf16(x[i - half] * signed_sin[i]));
  }
}

}  // namespace

// x [rows, n] or [outer, inner, n]; weight [n] or [inner, n] (one row per inner index).
torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps) {
  const Rows rows(x);
  TORCH_CHECK(weight.scalar_type() == at::kBFloat16 && weight.is_contiguous(), "bf16 weight");
  const bool per_inner = weight.dim() == 2;
  TORCH_CHECK(weight.size(-1) == rows.n && (!per_inner || weight.size(0) == rows.inner),
              "weight [n] or [inner, n] expected");
  auto out = torch::empty(x.sizes(), x.options());
  bf16* target = out.data_ptr<bf16>();
  std::vector<float> normed(rows.n);
  for (int64_t i = 0; i < rows.outer; ++i) {
    for (int64_t j = 0; j < rows.inner; ++j) {
      const bf16* w = weight.data_ptr<bf16>() + (per_inner ? j * rows.n : 0);
      norm_row(rows.row(i, j), w, rows.n, static_cast<float>(eps), normed.data());
      bf16* row_out = target + (i * rows.inner + j) * rows.n;
      for (int64_t k = 0; k < rows.n; ++k) row_out[k] = bf16(normed[k]);
    }
  }
  return out;
}

// x [tokens, heads, head_dim]; cos, signed_sin [tokens, 1, head_dim] -> rotated, contiguous.
// With a norm weight [heads, head_dim], each head is RMS-normed first (Qwen3's q/k norms).
torch::Tensor rotate(const torch::Tensor& x, const torch::Tensor& cos,
                     const torch::Tensor& signed_sin, const c10::optional<torch::Tensor>& weight,
                     double eps) {
  const Rows rows(x);
  TORCH_CHECK(cos.is_contiguous() && signed_sin.is_contiguous(), "contiguous tables");
  TORCH_CHECK(cos.numel() == rows.outer * rows.n && signed_sin.numel() == cos.numel(),
              "one table row per token");
  TORCH_CHECK(rows.n % 2 == 0, "an even head_dim");
  if (weight.has_value()) {
    TORCH_CHECK(weight->scalar_type() == at::kBFloat16 && weight->is_contiguous() &&
                    weight->numel() == rows.inner * rows.n,
                "norm weight [heads, head_dim] expected");
  }
  auto out = torch::empty(x.sizes(), x.options());
  bf16* target = out.data_ptr<bf16>();
  std::vector<float> values(rows.n);
  for (int64_t i = 0; i < rows.outer; ++i) {
    const bf16* c = cos.data_ptr<bf16>() + i * rows.n;
    const bf16* s = signed_sin.data_ptr<bf16>() + i * rows.n;
    for (int64_t j = 0; j < rows.inner; ++j) {
      const bf16* source = rows.row(i, j);
      if (weight.has_value()) {
        const bf16* w = weight->data_ptr<bf16>() + j * rows.n;
        norm_row(source, w, rows.n, static_cast<float>(eps), values.data());
      } else {
        for (int64_t k = 0; k < rows.n; ++k) values[k] = source[k];
      }
      rotate_row(values.data(), c, s, rows.n, target + (i * rows.inner + j) * rows.n);
    }
  }
  return out;
}

namespace {

// The first index of a row's maximum, as torch.argmax picks it (a NaN counts as the maximum, so
// the first NaN wins).
template <typename T>
int64_t argmax_row(const T* row, int64_t n) {
  float best = -std::numeric_limits<float>::infinity();
  int64_t at = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float value = static_cast<float>(row[i]);
    if (std::isnan(value)) return i;
    if (value > best) {
      best = value;
      at = i;
    }
  }
  return at;
}

#ifdef __AVX512F__
inline __m512 load16(const float* at, __mmask16 mask) { return _mm512_maskz_loadu_ps(mask, at); }
inline __m512 load16(const bf16* at, __mmask16 mask) {
  const __m256i raw = _mm256_maskz_loadu_epi16(mask, at);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}

// The row's maximum 16 lanes at a time, then the first index holding it; a row with a NaN, or
// whose maximum is -inf, takes the scalar scan.
template <typename T>
int64_t argmax_row_fast(const T* row, int64_t n) {
  const __m512 lowest = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  __m512 best = lowest;
  __mmask16 nan = 0;
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 mask = n - i >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << (n - i)) - 1);
    const __m512 value = _mm512_mask_mov_ps(lowest, mask, load16(row + i, mask));
    nan |= _mm512_cmp_ps_mask(value, value, _CMP_UNORD_Q);
    best = _mm512_max_ps(best, value);
  }
  const float top = _mm512_reduce_max_ps(best);
  if (nan || top == -std::numeric_limits<float>::infinity()) return argmax_row(row, n);
  const __m512 wanted = _mm512_set1_ps(top);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 mask = n - i >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << (n - i)) - 1);
    const __mmask16 hit = _mm512_mask_cmp_ps_mask(mask, load16(row + i, mask), wanted, _CMP_EQ_OQ);
    if (hit) return i + __builtin_ctz(hit);
  }
  return 0;
}
#else
template <typename T>
int64_t argmax_row_fast(const T* row, int64_t n) {
  return argmax_row(row, n);
}
#endif

}  // namespace

// x [rows, n] fp32 or bf16, rows contiguous -> int64 [rows]: torch.argmax(x, -1).
torch::Tensor row_argmax(const torch::Tensor& x) {
  TORCH_CHECK(x.dim() == 2 && x.size(1) > 0 && x.stride(1) == 1, "rows [rows, n] expected");
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16,
              "fp32 or bf16 rows expected");
  auto out = torch::empty({x.size(0)}, x.options().dtype(at::kLong));
  int64_t* index = out.data_ptr<int64_t>();
  const int64_t n = x.size(1), stride = x.stride(0);
  at::parallel_for(0, x.size(0), 1, [&](int64_t first, int64_t last) {
    for (int64_t r = first; r < last; ++r) {
      index[r] = x.scalar_type() == at::kFloat
                     ? argmax_row_fast(x.data_ptr<float>() + r * stride, n)
                     : argmax_row_fast(x.data_ptr<bf16>() + r * stride, n);
    }
  });
  return out;
}

// logits [rows, n] fp32 or bf16 (rows contiguous) -> an fp32 copy [rows, n] with bonus[r] (fp32)
// added at column columns[r] (int64; negative: none): the copy gate's add_copy_bonus in one call.
torch::Tensor copy_bonus(const torch::Tensor& logits, const torch::Tensor& bonus,
                         const torch::Tensor& columns) {
  TORCH_CHECK(logits.dim() == 2 && logits.stride(1) == 1, "logits [rows, n] expected");
  TORCH_CHECK(logits.scalar_type() == at::kFloat || logits.scalar_type() == at::kBFloat16,
              "fp32 or bf16 logits expected");
  const int64_t rows = logits.size(0), n = logits.size(1), stride = logits.stride(0);
  TORCH_CHECK(bonus.scalar_type() == at::kFloat && bonus.is_contiguous() && bonus.numel() == rows &&
                  columns.scalar_type() == at::kLong && columns.is_contiguous() &&
                  columns.numel() == rows,
              "bonus fp32 [rows] and columns int64 [rows] expected");
  auto out = torch::empty({rows, n}, logits.options().dtype(at::kFloat));
  float* y = out.data_ptr<float>();
  for (int64_t r = 0; r < rows; ++r) {
    if (logits.scalar_type() == at::kFloat) {
      std::memcpy(y + r * n, logits.data_ptr<float>() + r * stride, n * sizeof(float));
    } else {
      const bf16* row = logits.data_ptr<bf16>() + r * stride;
      int64_t i = 0;
#ifdef __AVX512F__
      for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + r * n + i, load16(row + i, 0xFFFF));
#endif
      for (; i < n; ++i) y[r * n + i] = row[i];
    }
    const int64_t column = columns.data_ptr<int64_t>()[r];
    TORCH_CHECK(column < n, "a hint column past the logits");
    if (column >= 0) y[r * n + column] += bonus.data_ptr<float>()[r];
  }
  return out;
}

// int4_dot.cpp, built into the same module
bool int4_dot_available();
std::string int4_dot_isa();
torch::Tensor int4_dot(const torch::Tensor& x, const torch::Tensor& weights,
                       const torch::Tensor& scales, const torch::Tensor& zeros);

// w4a8_layer.cpp, built into the same module
std::tuple<torch::Tensor, torch::Tensor> w4a8_qkv(
    const torch::Tensor& hidden, const torch::Tensor& context, const torch::Tensor& norm,
    double eps, const torch::Tensor& weights, const torch::Tensor& scales,
    const torch::Tensor& zeros, int64_t out_features, const torch::Tensor& qk_norm,
    const torch::Tensor& cos, const torch::Tensor& signed_sin);
torch::Tensor w4a8_mlp(const torch::Tensor& hidden, const torch::Tensor& norm, double eps,
                       const torch::Tensor& gate_up_weights, const torch::Tensor& gate_up_scales,
                       const torch::Tensor& gate_up_zeros, const torch::Tensor& down_weights,
                       const torch::Tensor& down_scales, const torch::Tensor& down_zeros,
                       int64_t width);

// draft_attention.cpp, built into the same module
bool draft_attention_available();
torch::Tensor draft_attention(const torch::Tensor& query, const torch::Tensor& key,
                              const torch::Tensor& value, double scale);

// corrector_walk.cpp, built into the same module
torch::Tensor corrector_walk(const torch::Tensor& logits, const torch::Tensor& hidden,
                             const torch::Tensor& anchor_ids, const torch::Tensor& column_ids,
                             const std::map<std::string, torch::Tensor>& weights, int64_t top_k,
                             int64_t trained_top_k, bool normalised, bool anchor, bool from_start,
                             double query_scale);

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("rms_norm", &rms_norm, "RMSNorm of bf16 rows");
  m.def("row_argmax", &row_argmax, "argmax of fp32 or bf16 rows, as torch.argmax");
  m.def("copy_bonus", &copy_bonus, "fp32 logits with the copy gate's bonus at each row's hint");
  m.def("rotate", &rotate, "rotary embedding of bf16 heads, optionally RMS-normed first");
  m.def("int4_dot_available", &int4_dot_available, "whether int4_dot was built (AVX-512 VNNI, AVX2)");
  m.def("int4_dot_isa", &int4_dot_isa, "the instructions int4_dot was built on");
  m.def("int4_dot", &int4_dot, "rows times 4-bit codes, the rows rounded to int8 per 32 inputs");
  m.def("w4a8_qkv", &w4a8_qkv, "a drafter layer's q|k|v heads on int4_dot, normed and rotated");
  m.def("w4a8_mlp", &w4a8_mlp, "a drafter layer's MLP on int4_dot products, with its norm");
  m.def("draft_attention_available", &draft_attention_available,
        "whether draft_attention was built (AVX-512 bf16)");
  m.def("draft_attention", &draft_attention, "a draft's few query rows over all keys, no mask");
  m.def("corrector_walk", &corrector_walk, "the DCOCO corrector's prefix-first walk, fp32");
}
