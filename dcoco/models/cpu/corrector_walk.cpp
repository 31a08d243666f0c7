// The DCOCO corrector's prefix-first walk in one call (dcoco.models.heads.fused_walk).
//
// Eagerly the walk is ~300 small operators and compiled it still cost 1.3 ms at 4 slots on a
// 2-core Zen 4, for ~5 M multiply-adds. Here it is: the top-K and log normaliser of each slot's
// logits, the candidates' representations, the products over every slot or candidate (slot
// projection, pair state, delta's and the query's pair parts, the successors' part of delta's
// first layer: few_rows.h, which reads each weight once), and the walk itself, which computes
// S[p, a, :] only for the candidate a it chose at p (K scores per slot, not K x K).
// Everything is fp32. The picks equal the batched walk's in fp32 except where two scores lie
// within rounding (tests/test_fused_walk.py); either pick is verified, so output is unchanged.

#include <torch/extension.h>

#include <ATen/Parallel.h>

#include "few_rows.h"
#include "row_math.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <string>
#include <vector>

namespace {

using dcoco_rows::log_sum_exp;
using dcoco_rows::norm_silu;
using dcoco_rows::row_top;
using dcoco_rows::silu;
using Weights = std::map<std::string, torch::Tensor>;

// The normalised features of candidate `rank` (candidate_features.py's order), or its logit.
void features(float* out, bool normalised, float logit, float top1, float lse, int64_t rank,
              int64_t trained_top_k) {
  out[0] = logit;
  if (!normalised) return;
  out[1] = logit - lse;
  out[2] = std::exp(out[1]);
  out[3] = logit - top1;
  out[4] = static_cast<float>(rank) / static_cast<float>(trained_top_k);
  out[5] = rank == 0 ? 1.0f : 0.0f;
  out[6] = 0.0f;
}

const float* ptr(const Weights& w, const char* name) {
  auto found = w.find(name);
  return found == w.end() ? nullptr : found->second.data_ptr<float>();
}

// log P(b | a) for each of `count` successors b, from the sorted pair codes a * vocab + b, else
// a's unseen value. a's codes are one run of the table: found once, then searched per b (a
// search over the whole table is ~17 cache misses a lookup once the draft pass has run).
void counted(const Weights& w, int64_t a, const int64_t* successors, int64_t count, float* out) {
  const torch::Tensor& codes = w.at("codes");
  const int64_t vocab = w.at("unseen").size(0);
  const int64_t* table = codes.data_ptr<int64_t>();
  const int64_t* first = std::lower_bound(table, table + codes.numel(), a * vocab);
  const int64_t* last = std::lower_bound(first, table + codes.numel(), (a + 1) * vocab);
  const float* log_probs = w.at("log_probs").data_ptr<float>();
  const float unseen = w.at("unseen").data_ptr<float>()[a];
  for (int64_t i = 0; i < count; ++i) {
    const int64_t code = a * vocab + successors[i];
    const int64_t* at = std::lower_bound(first, last, code);
    out[i] = at != last && *at == code ? log_probs[at - table] : unseen;
  }
}

struct Block {  // one request's walk inputs; slot' 0 is the anchor where the corrector has one
  const float* logits;  // [slots, K] candidate logits (real slots)
  const int64_t* ids;   // [slots', K] candidate token ids
  const float* cand;    // [slots', K, width + F] z and features
  const float* to_pre;  // [pairs, K, width]
  const float* pair_pre;  // [pairs, width]
  const float* query_pair;  // [pairs, width] or null
};

// S[pair, a, :] [K] into `scores`.
void walk_row(const Weights& w, const Block& block, int64_t pair, int64_t a, int64_t top_k,
              int64_t width, int64_t in, bool anchor, float query_scale, float* scores) {
  std::vector<float> base(width), query(width), counts(top_k, 0.0f);
  const float* chosen = block.cand + (pair * top_k + a) * in;
  dcoco_rows::linear(chosen, 1, w.at("delta_from"), width, torch::Tensor(), base.data());
  for (int64_t j = 0; j < width; ++j) base[j] += block.pair_pre[pair * width + j];
  const bool query_term = w.count("query_from") > 0;
  if (query_term) {  // the query reads z, the first width inputs
    dcoco_rows::linear(chosen, 1, w.at("query_from"), width, torch::Tensor(), query.data());
    const float* pair_part = block.query_pair + pair * width;
    for (int64_t j = 0; j < width; ++j) query[j] = silu(query[j] + pair_part[j]);
  }
  const float* bigram_in = ptr(w, "bigram_in");
  const int64_t* to_ids = block.ids + (pair + 1) * top_k;
  if (bigram_in != nullptr) counted(w, block.ids[pair * top_k + a], to_ids, top_k, counts.data());
  const float* out_w = ptr(w, "out_w");
  const float out_b = ptr(w, "out_b")[0];
  const float* successors = query_term ? ptr(w, "successors") : nullptr;
  // the pair counts' weight of this slot pair (MAX_PAIRS = 16)
  const float bigram_scale = bigram_in ? ptr(w, "bigram_scale")[std::min<int64_t>(pair, 15)] : 0.0f;
  const int64_t slot = anchor ? pair : pair + 1;
  for (int64_t b = 0; b < top_k; ++b) {
    const float* to = block.to_pre + (pair * top_k + b) * width;
    const float scaled = std::max(counts[b], -30.0f) / 10.0f;
    float delta = 0.0f;
#pragma omp simd reduction(+ : delta)
    for (int64_t j = 0; j < width; ++j) {
      float value = base[j] + to[j];
      if (bigram_in != nullptr) value += scaled * bigram_in[j];
      delta += silu(value) * out_w[j];
    }
    delta += out_b;
    if (query_term) {
      delta += dcoco_rows::dot(query.data(), successors + to_ids[b] * width, width) * query_scale;
    }
    delta += bigram_scale * counts[b];  // 0 without pair counts
    scores[b] = block.logits[slot * top_k + b] + delta;
  }
}

int64_t first_argmax(const float* values, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i) {
    if (values[i] > values[best]) best = i;
  }
  return best;
}

struct Shape {
  int64_t batch, slots, columns, top_k, trained_top_k, width, feature_width, in, walked, pairs;
  bool normalised, anchor;
};

struct Candidates {
  torch::Tensor logits;   // [batch, slots, K] fp32, descending
  torch::Tensor columns;  // [batch, slots, K] their logits' columns
  std::vector<float> lse;  // [batch * slots] log normalisers (normalised features)
};

// 1. Each slot's top-K and log normaliser, slots split over the threads.
void top_candidates(const torch::Tensor& logits, const Shape& n, Candidates& out) {
  const float* rows = logits.data_ptr<float>();
  float* values = out.logits.data_ptr<float>();
  int64_t* columns = out.columns.data_ptr<int64_t>();
  at::parallel_for(0, n.batch * n.slots, 1, [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      float* top = values + row * n.top_k;
      row_top(rows + row * n.columns, n.columns, n.top_k, top, columns + row * n.top_k);
      if (n.normalised) out.lse[row] = log_sum_exp(rows + row * n.columns, n.columns, top[0]);
    }
  });
}

struct PairParts {
  torch::Tensor slot_pre;    // [batch, slots', width] W_h h + b, before each candidate's E row
  torch::Tensor pair_pre;    // [batch, pairs, width] delta's pair block and bias
  torch::Tensor query_pair;  // [batch, pairs, width] the query's pair block and bias (or none)
};

// 1'. What depends on the hidden states alone: the slot projection and the pair state's parts.
PairParts pair_parts(const Weights& w, const torch::Tensor& walk_hidden, const Shape& n) {
  const auto fp32 = walk_hidden.options();
  const int64_t hidden = walk_hidden.size(2), pairs = n.batch * n.pairs;
  PairParts out{torch::empty({n.batch, n.walked, n.width}, fp32),
                torch::empty({n.batch, n.pairs, n.width}, fp32), torch::Tensor()};
  dcoco_rows::linear(walk_hidden.data_ptr<float>(), n.batch * n.walked, w.at("slot_w"), n.width,
                     w.at("slot_b"), out.slot_pre.data_ptr<float>());
  torch::Tensor state = torch::zeros({n.batch, n.pairs, n.width}, fp32);
  if (w.count("pair_w")) {  // s_p = silu(norm(W [h_p ; h_p+1] + b))
    std::vector<float> both(pairs * 2 * hidden);
    const float* states = walk_hidden.data_ptr<float>();
    for (int64_t i = 0; i < pairs; ++i) {
      const float* h = states + (i / n.pairs * n.walked + i % n.pairs) * hidden;
      std::copy(h, h + 2 * hidden, both.data() + i * 2 * hidden);  // slots p and p + 1
    }
    float* rows = state.data_ptr<float>();
    dcoco_rows::linear(both.data(), pairs, w.at("pair_w"), n.width, w.at("pair_b"), rows);
    const float eps = w.at("pair_eps").item<float>();
    const float *gain = ptr(w, "pair_ln_w"), *bias = ptr(w, "pair_ln_b");
    for (int64_t i = 0; i < pairs; ++i) norm_silu(rows + i * n.width, gain, bias, n.width, eps);
  }
  dcoco_rows::linear(state.data_ptr<float>(), pairs, w.at("delta_pair"), n.width, w.at("delta_b"),
                     out.pair_pre.data_ptr<float>());
  if (w.count("query_from")) {
    out.query_pair = torch::empty({n.batch, n.pairs, n.width}, fp32);
    dcoco_rows::linear(state.data_ptr<float>(), pairs, w.at("query_pair"), n.width,
                       w.at("query_b"), out.query_pair.data_ptr<float>());
  }
  return out;
}

// 2. Each candidate's [z ; features], z = silu(norm(W_h h + W_e E[id])), into cand [batch,
// slots', K, in]; slot' 0 is the anchor where the corrector has one.
void candidate_rows(const Weights& w, const Shape& n, const Candidates& top,
                    const torch::Tensor& slot_pre, const torch::Tensor& walk_ids,
                    torch::Tensor& cand) {
  const float* table = ptr(w, "token_table");
  const float *gain = ptr(w, "cand_ln_w"), *bias = ptr(w, "cand_ln_b");
  const float eps = w.at("candidate_eps").item<float>();
  const float* tops = top.logits.data_ptr<float>();
  const int64_t* ids = walk_ids.data_ptr<int64_t>();
  float* rows = cand.data_ptr<float>();
  at::parallel_for(0, n.batch * n.walked, 1, [&](int64_t begin, int64_t end) {
    for (int64_t slot = begin; slot < end; ++slot) {  // slot = b * walked + s
      const int64_t real = n.anchor ? slot % n.walked - 1 : slot % n.walked;
      const int64_t row = slot / n.walked * n.slots + real;
      const float* pre = slot_pre.data_ptr<float>() + slot * n.width;
      for (int64_t k = 0; k < n.top_k; ++k) {
        float* out = rows + (slot * n.top_k + k) * n.in;
        if (real < 0 && k > 0) {  // the anchor's K candidates are one token: copy the first
          std::copy(out - n.in, out, out);
          continue;
        }
        const float* embedded = table ? table + ids[slot * n.top_k + k] * n.width : nullptr;
        for (int64_t j = 0; j < n.width; ++j) out[j] = pre[j] + (embedded ? embedded[j] : 0.0f);
        norm_silu(out, gain, bias, n.width, eps);
        float* feature = out + n.width;
        if (real < 0) {  // the anchor: a certain top-1 (candidate_features.anchor_features)
          std::fill(feature, feature + n.feature_width, 0.0f);
          if (n.normalised) feature[2] = feature[5] = feature[6] = 1.0f;
          continue;
        }
        const float* logits = tops + row * n.top_k;
        features(feature, n.normalised, logits[k], logits[0], top.lse[row], k, n.trained_top_k);
      }
    }
  });
}

// 4. One request's walk: the candidate index it picks at each slot.
std::vector<int64_t> walk(const Weights& w, const Block& block, const Shape& n, bool from_start,
                          float query_scale) {
  std::vector<float> scores(n.top_k);
  std::vector<int64_t> path;
  int64_t index = 0, first = 0;
  if (n.anchor) {
    first = 1;  // pair 0 is anchor -> slot 0: its row 0 is slot 0's start scores
    if (from_start) {
      walk_row(w, block, 0, 0, n.top_k, n.width, n.in, n.anchor, query_scale, scores.data());
      index = first_argmax(scores.data(), n.top_k);
    }
  }
  path.push_back(index);
  for (int64_t pair = first; pair < n.pairs; ++pair) {
    walk_row(w, block, pair, index, n.top_k, n.width, n.in, n.anchor, query_scale, scores.data());
    index = first_argmax(scores.data(), n.top_k);
    path.push_back(index);
  }
  return path;
}

}  // namespace

// Token ids [batch, slots] from logits [batch, slots, N] and hidden [batch, slots, H] (fp32,
// contiguous), anchor_ids [batch], column_ids [N] (a draft vocabulary's token ids; empty: the
// columns are token ids), the corrector's fp32 weights and norm eps by name (fused_walk.py).
torch::Tensor corrector_walk(const torch::Tensor& logits, const torch::Tensor& hidden,
                             const torch::Tensor& anchor_ids, const torch::Tensor& column_ids,
                             const Weights& w, int64_t top_k, int64_t trained_top_k,
                             bool normalised, bool anchor, bool from_start, double query_scale) {
  TORCH_CHECK(logits.scalar_type() == at::kFloat && hidden.scalar_type() == at::kFloat, "fp32");
  TORCH_CHECK(logits.is_contiguous() && hidden.is_contiguous(), "contiguous inputs expected");
  const int64_t batch = logits.size(0), slots = logits.size(1), width = w.at("slot_b").size(0);
  const int64_t feature_width = normalised ? 7 : 1, walked = slots + (anchor ? 1 : 0);
  const Shape n{batch, slots, logits.size(2), top_k, trained_top_k, width, feature_width,
                width + feature_width, walked, walked - 1, normalised, anchor};
  const torch::Tensor walk_hidden =  // the anchor: a virtual slot before slot 0, slot 0's state
      anchor ? torch::cat({hidden.narrow(1, 0, 1), hidden}, 1).contiguous() : hidden;
  Candidates top{torch::empty({batch, slots, top_k}, logits.options()),
                 torch::empty({batch, slots, top_k}, anchor_ids.options()),
                 std::vector<float>(batch * slots, 0.0f)};
  top_candidates(logits, n, top);
  const PairParts parts = pair_parts(w, walk_hidden, n);
  torch::Tensor ids = column_ids.numel() ? column_ids.index({top.columns}) : top.columns;
  torch::Tensor walk_ids = ids;
  if (anchor) {
    walk_ids = torch::cat({anchor_ids.view({batch, 1, 1}).expand({batch, 1, top_k}), ids}, 1);
  }
  walk_ids = walk_ids.contiguous();
  torch::Tensor cand = torch::empty({batch, walked, top_k, n.in}, logits.options());
  candidate_rows(w, n, top, parts.slot_pre, walk_ids, cand);
  // 3. the successors' part of delta's first layer, every candidate at once
  torch::Tensor to_pre = torch::empty({batch, n.pairs, top_k, width}, logits.options());
  for (int64_t b = 0; b < batch; ++b) {  // slots' 1.. of each request
    dcoco_rows::linear(cand.data_ptr<float>() + (b * walked + 1) * top_k * n.in, n.pairs * top_k,
                       w.at("delta_to"), width, torch::Tensor(),
                       to_pre.data_ptr<float>() + b * n.pairs * top_k * width);
  }
  torch::Tensor tokens = torch::empty({batch, slots}, anchor_ids.options());
  for (int64_t b = 0; b < batch; ++b) {
    const Block block{top.logits.data_ptr<float>() + b * slots * top_k,
                      walk_ids.data_ptr<int64_t>() + b * walked * top_k,
                      cand.data_ptr<float>() + b * walked * top_k * n.in,
                      to_pre.data_ptr<float>() + b * n.pairs * top_k * width,
                      parts.pair_pre.data_ptr<float>() + b * n.pairs * width,
                      parts.query_pair.defined()
                          ? parts.query_pair.data_ptr<float>() + b * n.pairs * width
                          : nullptr};
    const float scale = static_cast<float>(query_scale);
    const std::vector<int64_t> path = walk(w, block, n, from_start, scale);
    const int64_t* candidate_ids = ids.data_ptr<int64_t>() + b * slots * top_k;
    int64_t* out = tokens.data_ptr<int64_t>() + b * slots;
    for (int64_t s = 0; s < slots; ++s) out[s] = candidate_ids[s * top_k + path[s]];
  }
  return tokens;
}
