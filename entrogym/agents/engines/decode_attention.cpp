// One decode step's attention on CPU in one call: softmax(q k^T / sqrt(d), masked) v for every
// (row, kv head) of the batch (Vaswani et al., "Attention Is All You Need", 2017, eq. 1), read
// straight from the static decoder's KV cache, computed in fp32 from fp32 or bf16 inputs.
//
// Why: at a decode step's shapes (24 rows, 3 query rows per kv head, 64-wide heads, ~100 keys)
// torch's attention is a few tiny matmuls per (row, head), and its CPU kernels spend most of
// their time outside the arithmetic (docs/rollouts.md). Here one (row, kv head) is one work
// item: its queries' scores for 16 keys at a time stay in registers while the head dimension is
// summed (the keys are cached transposed, [d, C], so a block of 16 keys is one load), the softmax
// is exact up to fp32 rounding, and the weighted sum of values keeps the R x d output in
// registers over the keys. Work items are spread over torch's intra-op threads (OpenMP).
//
// decode_attention_step does a decode step's attention with what precedes it in the layer: the
// rotary embedding of queries and keys and the cache writes, from the fused q|k|v projection's
// output, in the same one call (each of those was a torch op of its own, several per layer).
//
// Built at first use by entrogym.agents.engines.decode_kernel (torch.utils.cpp_extension).
#include "decode_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

using namespace entrogym_decode;

// One (row, kv head): R queries of D dims against the first `end` keys. keys_t [D, C] (the
// cache's keys transposed), values [C, D], seen [C] (True: the key is attended). scores: scratch
// of R rows of `end` rounded up to 16.
template <typename T, int R, int D>
void attend_one(const T* q, const T* keys_t, const T* values, const bool* seen, T* out,
                int64_t columns, int64_t end, float scale, float* scores) {
  static_assert(D % kLanes == 0, "head dim a multiple of 16");
  float query[R][D];
  for (int r = 0; r < R; ++r)
    for (int d = 0; d < D; ++d) query[r][d] = to_float(q[r * D + d]) * scale;
  const int64_t blocks = (end + kLanes - 1) / kLanes;
  // scores in blocks of 16 keys: q . k accumulated over d, one register per query
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t tb = b * kLanes;
    f16v acc[R];
    for (int r = 0; r < R; ++r) acc[r] = f16v{};
    if (tb + kLanes <= columns) {
      for (int d = 0; d < D; ++d) {
        const f16v k = load16(keys_t + d * columns + tb);
        for (int r = 0; r < R; ++r) acc[r] += query[r][d] * k;
      }
    } else {  // the cache's last, partial block
      for (int d = 0; d < D; ++d) {
        float tmp[kLanes] = {};
        for (int64_t j = 0; tb + j < columns && j < kLanes; ++j) tmp[j] = to_float(keys_t[d * columns + tb + j]);
        const f16v k = load16(tmp);
        for (int r = 0; r < R; ++r) acc[r] += query[r][d] * k;
      }
    }
    for (int r = 0; r < R; ++r) std::memcpy(scores + r * blocks * kLanes + tb, &acc[r], sizeof(f16v));
  }
  float total[R];
  for (int r = 0; r < R; ++r) {
    float* w = scores + r * blocks * kLanes;
    float m = -INFINITY;
    for (int64_t t = 0; t < end; ++t) if (seen[t]) m = std::max(m, w[t]);
    f16v sum = f16v{};
    for (int64_t b = 0; b < blocks; ++b) {
      i16v keep;  // lanes of attended keys: the others are set to 0, whatever they hold
      for (int j = 0; j < kLanes; ++j) {
        const int64_t t = b * kLanes + j;
        keep[j] = (t < end && seen[t]) ? -1 : 0;
      }
      const f16v p = keep ? exp16(load16(w + b * kLanes) - m) : f16v{};
      std::memcpy(w + b * kLanes, &p, sizeof p);
      sum += p;
    }
    float s = 0.0f;
    for (int j = 0; j < kLanes; ++j) s += sum[j];
    total[r] = s;
  }
  constexpr int V = D / kLanes;
  f16v acc[R][V];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < V; ++c) acc[r][c] = f16v{};
  for (int64_t t = 0; t < end; ++t) {
    if (!seen[t]) continue;
    f16v value[V];
    for (int c = 0; c < V; ++c) value[c] = load16(values + t * D + c * kLanes);
    for (int r = 0; r < R; ++r) {
      const float p = scores[r * blocks * kLanes + t];
      for (int c = 0; c < V; ++c) acc[r][c] += p * value[c];
    }
  }
  for (int r = 0; r < R; ++r) {
    const float inv = 1.0f / total[r];
    for (int c = 0; c < V; ++c)
      for (int j = 0; j < kLanes; ++j) from_float(acc[r][c][j] * inv, out + r * D + c * kLanes + j);
  }
}

template <typename T, int R, int D>
void attend(const T* q, const T* k, const T* v, const bool* valid, T* out, int64_t rows,
            int64_t groups, int64_t columns, int64_t end, float scale, int threads) {
  const int64_t items = rows * groups;
  const int64_t width = (end + kLanes - 1) / kLanes * kLanes;
#pragma omp parallel num_threads(threads)
  {
    std::vector<float> scores(R * width);
#pragma omp for schedule(static)
    for (int64_t item = 0; item < items; ++item) {
      attend_one<T, R, D>(q + item * R * D, k + item * D * columns, v + item * columns * D,
                          valid + (item / groups) * columns, out + item * R * D, columns, end,
                          scale, scores.data());
    }
  }
}

// Llama's rotary embedding of one head in rotate-half form (Su et al., RoFormer, 2021, eq. 34):
// out = x cos + [-x2, x1] sin, each product and the sum rounded to T as torch's three ops round
// them (fp contraction is off here, so no FMA fuses them), so the fused step rotates as
// static_decode.rotate does, bit for bit.
#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")
template <typename T, int D>
void rotate_head(const T* x, const T* cos, const T* sin, T* out) {
  constexpr int H = D / 2;
  for (int i = 0; i < D; ++i) {
    const float xc = rounded<T>(to_float(x[i]) * to_float(cos[i]));
    const float other = i < H ? -to_float(x[i + H]) : to_float(x[i - H]);
    const float ys = rounded<T>(other * to_float(sin[i]));
    from_float(xc + ys, out + i);
  }
}
#pragma GCC pop_options

// One decode step's attention with its prologue, per (row, kv head): rotate the head's R
// queries and its key, write the key (transposed) and the value at cache column `column`, and
// attend over the first column + 1 keys. qkv [B, (G R + 2 G) D] is the fused projection's
// output (q | k | v), cos and sin [B, D].
template <typename T, int R, int D>
void attend_step(const T* qkv, const T* cos, const T* sin, T* keys_t, T* values,
                 const bool* valid, T* out, int64_t rows, int64_t groups, int64_t columns,
                 int64_t column, float scale, int threads) {
  const int64_t heads = groups * R, width = (heads + 2 * groups) * D, end = column + 1;
  const int64_t items = rows * groups;
  const int64_t padded = (end + kLanes - 1) / kLanes * kLanes;
#pragma omp parallel num_threads(threads)
  {
    std::vector<float> scores(R * padded);
    T q[R * D], k[D];
#pragma omp for schedule(static)
    for (int64_t item = 0; item < items; ++item) {
      const int64_t b = item / groups, g = item % groups;
      const T* row = qkv + b * width;
      const T *c = cos + b * D, *s = sin + b * D;
      for (int r = 0; r < R; ++r) rotate_head<T, D>(row + (g * R + r) * D, c, s, q + r * D);
      rotate_head<T, D>(row + (heads + g) * D, c, s, k);
      T* kt = keys_t + item * D * columns;  // [D, C]
      for (int d = 0; d < D; ++d) kt[d * columns + column] = k[d];
      T* v = values + item * columns * D;  // [C, D]
      std::memcpy(v + column * D, row + (heads + groups + g) * D, D * sizeof(T));
      attend_one<T, R, D>(q, kt, v, valid + b * columns, out + item * R * D, columns, end,
                          scale, scores.data());
    }
  }
}

// query rows per kv head x head dim: SmolLM2's (3, 64), the tests' tiny models' (2, 32), and
// the grouped-query shapes of common small Llamas; decode_kernel.SHAPES lists the same
#define EG_SHAPES(X)                                                                     \
  X(1, 64) X(2, 64) X(3, 64) X(4, 64) X(5, 64) X(6, 64) X(7, 64) X(8, 64) X(1, 32) X(2, 32) \
  X(4, 32) X(1, 128) X(2, 128) X(3, 128) X(4, 128) X(8, 128)

template <typename T>
bool dispatch(int64_t per_group, int64_t dim, const T* q, const T* k, const T* v,
              const bool* valid, T* out, int64_t rows, int64_t groups, int64_t columns,
              int64_t end, float scale, int threads) {
#define EG_CASE(RR, DD)                                                                  \
  if (per_group == RR && dim == DD) {                                                    \
    attend<T, RR, DD>(q, k, v, valid, out, rows, groups, columns, end, scale, threads); \
    return true;                                                                         \
  }
  EG_SHAPES(EG_CASE)
#undef EG_CASE
  return false;
}

template <typename T>
bool dispatch_step(int64_t per_group, int64_t dim, const T* qkv, const T* cos, const T* sin,
                   T* keys_t, T* values, const bool* valid, T* out, int64_t rows,
                   int64_t groups, int64_t columns, int64_t column, float scale, int threads) {
#define EG_CASE(RR, DD)                                                                   \
  if (per_group == RR && dim == DD) {                                                     \
    attend_step<T, RR, DD>(qkv, cos, sin, keys_t, values, valid, out, rows, groups,       \
                           columns, column, scale, threads);                              \
    return true;                                                                          \
  }
  EG_SHAPES(EG_CASE)
#undef EG_CASE
  return false;
}

int threads_for(int64_t items) {
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), items)));
}

}  // namespace

// q [B, G, R, d]; keys_t [B, G, d, C]; values [B, G, C, d]; valid [B, C] (True: the key is
// attended; each row attends at least one of its first `end` columns). Returns [B, G, R, d] in
// q's dtype.
torch::Tensor decode_attention(const torch::Tensor& q, const torch::Tensor& keys_t,
                               const torch::Tensor& values, const torch::Tensor& valid,
                               int64_t end) {
  TORCH_CHECK(q.dim() == 4 && keys_t.dim() == 4 && values.dim() == 4, "decode_attention: 4-d tensors");
  const int64_t rows = q.size(0), groups = q.size(1), per_group = q.size(2), dim = q.size(3);
  const int64_t columns = values.size(2);
  TORCH_CHECK(keys_t.size(0) == rows && keys_t.size(1) == groups && keys_t.size(2) == dim &&
                  keys_t.size(3) == columns && values.size(0) == rows &&
                  values.size(1) == groups && values.size(3) == dim,
              "decode_attention: caches [B, G, d, C] and [B, G, C, d] for q [B, G, R, d]");
  TORCH_CHECK(valid.dim() == 2 && valid.size(0) == rows && valid.size(1) == columns &&
                  valid.scalar_type() == at::kBool,
              "decode_attention: valid must be bool [B, C]");
  TORCH_CHECK(end >= 1 && end <= columns, "decode_attention: end out of range");
  TORCH_CHECK(q.scalar_type() == keys_t.scalar_type() && q.scalar_type() == values.scalar_type(),
              "decode_attention: one dtype");
  TORCH_CHECK(q.is_contiguous() && keys_t.is_contiguous() && values.is_contiguous() && valid.is_contiguous(),
              "decode_attention: contiguous tensors");
  auto out = torch::empty_like(q);
  const float scale = 1.0f / std::sqrt(static_cast<float>(dim));
  const int threads = threads_for(rows * groups);
  bool done = false;
  if (q.scalar_type() == at::kFloat) {
    done = dispatch<float>(per_group, dim, q.data_ptr<float>(), keys_t.data_ptr<float>(),
                           values.data_ptr<float>(), valid.data_ptr<bool>(), out.data_ptr<float>(),
                           rows, groups, columns, end, scale, threads);
  } else if (q.scalar_type() == at::kBFloat16) {
    using bf = at::BFloat16;
    done = dispatch<bf>(per_group, dim, q.data_ptr<bf>(), keys_t.data_ptr<bf>(),
                        values.data_ptr<bf>(), valid.data_ptr<bool>(), out.data_ptr<bf>(), rows,
                        groups, columns, end, scale, threads);
  }
  TORCH_CHECK(done, "decode_attention: unsupported dtype or shape");
  return out;
}

// qkv [B, (H + 2 G) d] (q | k | v of one token per row); cos, sin [B, d]; keys_t [B, G, d, C] and
// values [B, G, C, d], written at `column`; valid [B, C], column `column` among the attended.
// Returns the attention [B, H d] in qkv's dtype.
torch::Tensor decode_attention_step(const torch::Tensor& qkv, const torch::Tensor& cos,
                                    const torch::Tensor& sin, torch::Tensor& keys_t,
                                    torch::Tensor& values, const torch::Tensor& valid,
                                    int64_t column) {
  TORCH_CHECK(qkv.dim() == 2 && cos.dim() == 2 && sin.dim() == 2 && keys_t.dim() == 4 &&
                  values.dim() == 4,
              "decode_attention_step: qkv [B, N], cos and sin [B, d], 4-d caches");
  const int64_t rows = qkv.size(0), groups = values.size(1), columns = values.size(2);
  const int64_t dim = values.size(3);
  TORCH_CHECK(keys_t.size(0) == rows && keys_t.size(1) == groups && keys_t.size(2) == dim &&
                  keys_t.size(3) == columns && values.size(0) == rows,
              "decode_attention_step: caches [B, G, d, C] and [B, G, C, d]");
  TORCH_CHECK(qkv.size(1) % dim == 0 && qkv.size(1) / dim > 2 * groups &&
                  (qkv.size(1) / dim - 2 * groups) % groups == 0,
              "decode_attention_step: qkv must hold H + 2 G heads of d, H a multiple of G");
  TORCH_CHECK(cos.size(0) == rows && cos.size(1) == dim && sin.sizes() == cos.sizes(),
              "decode_attention_step: cos and sin must be [B, d]");
  TORCH_CHECK(valid.dim() == 2 && valid.size(0) == rows && valid.size(1) == columns &&
                  valid.scalar_type() == at::kBool,
              "decode_attention_step: valid must be bool [B, C]");
  TORCH_CHECK(column >= 0 && column < columns, "decode_attention_step: column out of range");
  const auto dtype = qkv.scalar_type();
  TORCH_CHECK(cos.scalar_type() == dtype && sin.scalar_type() == dtype &&
                  keys_t.scalar_type() == dtype && values.scalar_type() == dtype,
              "decode_attention_step: one dtype");
  TORCH_CHECK(qkv.is_contiguous() && cos.is_contiguous() && sin.is_contiguous() &&
                  keys_t.is_contiguous() && values.is_contiguous() && valid.is_contiguous(),
              "decode_attention_step: contiguous tensors");
  TORCH_CHECK(qkv.is_cpu() && keys_t.is_cpu() && values.is_cpu() && valid.is_cpu(),
              "decode_attention_step: CPU tensors");
  const int64_t heads = qkv.size(1) / dim - 2 * groups, per_group = heads / groups;
  auto out = torch::empty({rows, heads * dim}, qkv.options());
  const float scale = 1.0f / std::sqrt(static_cast<float>(dim));
  const int threads = threads_for(rows * groups);
  bool done = false;
  if (dtype == at::kFloat) {
    done = dispatch_step<float>(per_group, dim, qkv.data_ptr<float>(), cos.data_ptr<float>(),
                                sin.data_ptr<float>(), keys_t.data_ptr<float>(),
                                values.data_ptr<float>(), valid.data_ptr<bool>(),
                                out.data_ptr<float>(), rows, groups, columns, column, scale,
                                threads);
  } else if (dtype == at::kBFloat16) {
    using bf = at::BFloat16;
    done = dispatch_step<bf>(per_group, dim, qkv.data_ptr<bf>(), cos.data_ptr<bf>(),
                             sin.data_ptr<bf>(), keys_t.data_ptr<bf>(), values.data_ptr<bf>(),
                             valid.data_ptr<bool>(), out.data_ptr<bf>(), rows, groups, columns,
                             column, scale, threads);
  }
  TORCH_CHECK(done, "decode_attention_step: unsupported dtype or shape");
  return out;
}
