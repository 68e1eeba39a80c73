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
// Built at first use by entrogym.agents.engines.decode_kernel (torch.utils.cpp_extension).
#include <torch/extension.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

// 16 fp32 lanes: GCC/Clang vector extensions, lowered to the target's widest registers.
typedef float f16v __attribute__((vector_size(64)));
typedef uint32_t u16v __attribute__((vector_size(64)));
typedef uint16_t h16v __attribute__((vector_size(32)));
typedef int32_t i16v __attribute__((vector_size(64)));
constexpr int kLanes = 16;

inline f16v load16(const float* p) {
  f16v v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline f16v load16(const at::BFloat16* p) {  // bf16 is the top half of an fp32
  h16v h;
  std::memcpy(&h, p, sizeof h);
  const u16v u = __builtin_convertvector(h, u16v) << 16;
  f16v v;
  std::memcpy(&v, &u, sizeof v);
  return v;
}
inline float to_float(float x) { return x; }
inline float to_float(at::BFloat16 x) { return static_cast<float>(x); }
inline void from_float(float x, float* out) { *out = x; }
inline void from_float(float x, at::BFloat16* out) { *out = at::BFloat16(x); }

// exp(x) for 16 lanes of x <= 0: Cody and Waite's range reduction, x = n ln 2 + r with ln 2 in
// two parts, and the degree-6 polynomial of Cephes' expf for e^r on [-ln2/2, ln2/2]
// (S. L. Moshier, Cephes Math Library, 1984-1992): relative error ~1e-7, and vectorised, where
// std::exp is a scalar call per element.
inline f16v exp16(f16v x) {
  // clamped to [-87, 0], so that no lane overflows (lanes of keys not attended are set to 0
  // after, whatever they computed)
  const f16v lo = f16v{} - 87.0f, zero = f16v{};
  x = x < lo ? lo : x;
  x = x > zero ? zero : x;
  f16v n = x * 1.44269504088896341f + 0.5f;
  const i16v ni = __builtin_convertvector(n, i16v);  // truncation toward zero
  f16v nf = __builtin_convertvector(ni, f16v);
  nf = nf > n ? nf - 1.0f : nf;  // floor
  const f16v r = x - nf * 0.693359375f + nf * 2.12194440e-4f;
  f16v p = f16v{} + 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const i16v bits = (__builtin_convertvector(nf, i16v) + 127) << 23;
  f16v scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

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

template <typename T>
bool dispatch(int64_t per_group, int64_t dim, const T* q, const T* k, const T* v,
              const bool* valid, T* out, int64_t rows, int64_t groups, int64_t columns,
              int64_t end, float scale, int threads) {
#define EG_CASE(RR, DD)                                                                  \
  if (per_group == RR && dim == DD) {                                                    \
    attend<T, RR, DD>(q, k, v, valid, out, rows, groups, columns, end, scale, threads); \
    return true;                                                                         \
  }
  // query rows per kv head x head dim: SmolLM2's (3, 64), the tests' tiny models' (2, 32), and
  // the grouped-query shapes of common small Llamas; decode_kernel.SHAPES lists the same
  EG_CASE(1, 64) EG_CASE(2, 64) EG_CASE(3, 64) EG_CASE(4, 64) EG_CASE(5, 64) EG_CASE(6, 64)
  EG_CASE(7, 64) EG_CASE(8, 64)
  EG_CASE(1, 32) EG_CASE(2, 32) EG_CASE(4, 32)
  EG_CASE(1, 128) EG_CASE(2, 128) EG_CASE(3, 128) EG_CASE(4, 128) EG_CASE(8, 128)
#undef EG_CASE
  return false;
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
  const int threads = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), rows * groups)));
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

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("decode_attention", &decode_attention, "one decode step's attention from the KV cache");
}
