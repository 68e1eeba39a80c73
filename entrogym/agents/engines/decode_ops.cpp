// The static decoder's other per-step CPU kernels, each one call where torch takes several:
// Llama's RMSNorm, the gated MLP's silu(gate) * up, and the token draw with its log-prob.
//
// Why: at a decode step's shapes (24 rows of 576 to 3,072 values) each torch op costs more in
// its dispatch than in its arithmetic, and a layer ran a dozen of them between its matmuls;
// the draw read a step's 24 x 49,152 probabilities four times over (softmax, a float64 copy for
// its block sums, log-softmax) where two passes over the logits do (docs/rollouts.md).
//
// Built at first use with decode_attention.cpp by entrogym.agents.engines.decode_kernel, which
// also holds the Python side's reference for each formula.
#include "decode_kernels.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <tuple>
#include <vector>

namespace {

using namespace entrogym_decode;

typedef float f8v __attribute__((vector_size(32)));
typedef double d8v __attribute__((vector_size(64)));

float horizontal_sum(f16v v) {
  float s = 0.0f;
  for (int j = 0; j < kLanes; ++j) s += v[j];
  return s;
}

// Llama's RMSNorm (Zhang and Sennrich, "Root Mean Square Layer Normalization", 2019, eq. 4) of
// one row of H values: y = x / sqrt(mean(x^2) + eps) * w, in fp32, rounded once to T.
template <typename T>
void rms_norm_row(const T* x, const T* w, T* y, int64_t h, float eps) {
  f16v acc = f16v{};
  int64_t i = 0;
  for (; i + kLanes <= h; i += kLanes) {
    const f16v v = load16(x + i);
    acc += v * v;
  }
  float squares = horizontal_sum(acc);
  for (; i < h; ++i) squares += to_float(x[i]) * to_float(x[i]);
  const float r = 1.0f / std::sqrt(squares / static_cast<float>(h) + eps);
  for (i = 0; i < h; ++i) from_float(to_float(x[i]) * r * to_float(w[i]), y + i);
}

// silu(g) * u (Elfwing et al., "Sigmoid-Weighted Linear Units", 2018: silu(x) = x sigmoid(x))
// for one row of gate | up [2 I]: silu rounded to T, then the product, as torch's two ops round.
// e = exp(-|g|) keeps exp's argument non-positive: sigmoid(g) = 1 / (1 + e) for g >= 0 and
// e / (1 + e) below.
template <typename T>
void silu_mul_row(const T* gu, T* out, int64_t inner) {
  const T* up = gu + inner;
  int64_t i = 0;
  for (; i + kLanes <= inner; i += kLanes) {
    const f16v g = load16(gu + i), u = load16(up + i);
    const f16v zero = f16v{}, one = zero + 1.0f;
    const i16v negative = g < zero;
    const f16v e = exp16(negative ? g : -g);
    const f16v s = g * (negative ? e : one) / (one + e);
    for (int j = 0; j < kLanes; ++j) from_float(rounded<T>(s[j]) * u[j], out + i + j);
  }
  for (; i < inner; ++i) {
    const float g = to_float(gu[i]), e = std::exp(-std::fabs(g));
    const float s = g * (g < 0.0f ? e : 1.0f) / (1.0f + e);
    from_float(rounded<T>(s) * to_float(up[i]), out + i);
  }
}

constexpr int64_t kBlock = 256;  // entries per block of the two-level inverse CDF

float row_max(const float* x, int64_t n) {
  f16v acc = f16v{} - std::numeric_limits<float>::infinity();
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    const f16v v = load16(x + i);
    acc = v > acc ? v : acc;
  }
  float m = -std::numeric_limits<float>::infinity();
  for (int j = 0; j < kLanes; ++j) m = std::max(m, acc[j]);
  for (; i < n; ++i) m = std::max(m, x[i]);
  return m;
}

// exp(x - m) of the (up to 16) entries [i, min(i + 16, end)) of a row, 0 in lanes past `end`
// and where x - m < -87 (-inf: an entry top-k or top-p cut, never drawn; otherwise below
// e^-87 ~ 1.6e-38 of the row's largest, where fp32 has no room anyway). Every caller takes an
// entry's exp from here, so a block's sum and its scan see the same values.
inline f16v shifted_exps(const float* x, int64_t i, int64_t end, float m) {
  f16v v;
  if (i + kLanes <= end) {
    v = load16(x + i);
  } else {
    float lane[kLanes];
    for (int j = 0; j < kLanes; ++j)
      lane[j] = i + j < end ? x[i + j] : -std::numeric_limits<float>::infinity();
    v = load16(lane);
  }
  const f16v z = v - m, floor = f16v{} - 87.0f;
  const i16v keep = z >= floor;
  return keep ? exp16(z) : f16v{};
}

// The sum of exp(x - m) over [begin, end) of a row, accumulated in float64.
double exp_sum(const float* x, int64_t begin, int64_t end, float m) {
  d8v lo = d8v{}, hi = d8v{};
  for (int64_t i = begin; i < end; i += kLanes) {
    const f16v p = shifted_exps(x, i, end, m);
    f8v a, b;
    std::memcpy(&a, &p, sizeof a);
    std::memcpy(&b, reinterpret_cast<const char*>(&p) + sizeof a, sizeof b);
    lo += __builtin_convertvector(a, d8v);
    hi += __builtin_convertvector(b, d8v);
  }
  double s = 0.0;
  for (int j = 0; j < 8; ++j) s += lo[j] + hi[j];
  return s;
}

// One row's draw by inversion, as draws.inverse_cdf_draw does it (Devroye, "Non-Uniform Random
// Variate Generation", 1986, SIII.2 and SIII.2.4): the smallest i with cdf[i] > u total, found
// by blocks of kBlock entries, over p = exp(scores - max) (a softmax's numerators: the row need
// not be normalised); sums in float64. Returns the index and the raw logits' log-softmax at it.
std::pair<int64_t, float> draw_row(const float* scores, const float* logits, int64_t vocab,
                                   double uniform, std::vector<double>& cdf) {
  const float m = row_max(scores, vocab);
  const int64_t blocks = (vocab + kBlock - 1) / kBlock;
  double running = 0.0;
  for (int64_t b = 0; b < blocks; ++b) {
    running += exp_sum(scores, b * kBlock, std::min(vocab, (b + 1) * kBlock), m);
    cdf[b] = running;
  }
  const double total = cdf[blocks - 1], u = uniform * total;  // uniform < 1, so u < total
  if (!(total > 0.0) || !std::isfinite(total)) return {-1, 0.0f};  // no mass: the caller says so
  const int64_t block = std::upper_bound(cdf.begin(), cdf.begin() + blocks, u) - cdf.begin();
  const double before = block > 0 ? cdf[block - 1] : 0.0;
  const int64_t first = block * kBlock, last = std::min(vocab, first + kBlock);
  // the block scanned entry by entry, with the exps its sum took
  double inner[kBlock];
  double acc = 0.0;
  for (int64_t i = first; i < last; i += kLanes) {
    const f16v p = shifted_exps(scores, i, last, m);
    for (int64_t j = 0; j < kLanes && i + j < last; ++j) {
      acc += static_cast<double>(p[j]);
      inner[i + j - first] = acc;
    }
  }
  const int64_t width = last - first;
  // where the scan and the block's summed mass round apart, u's offset stays below the scan's
  // end: at the block's last positive entry
  const double offset = std::min(u - before, std::nextafter(inner[width - 1], 0.0));
  const int64_t index = first + (std::upper_bound(inner, inner + width, offset) - inner);
  if (logits == scores) {
    return {index, static_cast<float>(scores[index] - m - std::log(total))};
  }
  const float lm = row_max(logits, vocab);
  const double norm = exp_sum(logits, 0, vocab, lm);
  return {index, static_cast<float>(logits[index] - lm - std::log(norm))};
}

}  // namespace

// x [N, H]; weight [H]; returns [N, H] in x's dtype.
torch::Tensor decode_rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps) {
  TORCH_CHECK(x.dim() == 2 && weight.dim() == 1 && weight.size(0) == x.size(1),
              "decode_rms_norm: x [N, H] and weight [H]");
  TORCH_CHECK(x.scalar_type() == weight.scalar_type(), "decode_rms_norm: one dtype");
  TORCH_CHECK(x.is_contiguous() && weight.is_contiguous(), "decode_rms_norm: contiguous tensors");
  TORCH_CHECK(x.is_cpu() && weight.is_cpu(), "decode_rms_norm: CPU tensors");
  auto y = torch::empty_like(x);
  const int64_t n = x.size(0), h = x.size(1);
  if (x.scalar_type() == at::kFloat) {
    for (int64_t r = 0; r < n; ++r)
      rms_norm_row(x.data_ptr<float>() + r * h, weight.data_ptr<float>(),
                   y.data_ptr<float>() + r * h, h, static_cast<float>(eps));
  } else if (x.scalar_type() == at::kBFloat16) {
    using bf = at::BFloat16;
    for (int64_t r = 0; r < n; ++r)
      rms_norm_row(x.data_ptr<bf>() + r * h, weight.data_ptr<bf>(), y.data_ptr<bf>() + r * h, h,
                   static_cast<float>(eps));
  } else {
    TORCH_CHECK(false, "decode_rms_norm: unsupported dtype");
  }
  return y;
}

// gate_up [N, 2 I] (gate | up); returns silu(gate) * up [N, I] in its dtype.
torch::Tensor decode_silu_mul(const torch::Tensor& gate_up) {
  TORCH_CHECK(gate_up.dim() == 2 && gate_up.size(1) % 2 == 0,
              "decode_silu_mul: gate_up must be [N, 2 I]");
  TORCH_CHECK(gate_up.is_contiguous() && gate_up.is_cpu(), "decode_silu_mul: a contiguous CPU tensor");
  const int64_t n = gate_up.size(0), inner = gate_up.size(1) / 2;
  auto out = torch::empty({n, inner}, gate_up.options());
  if (gate_up.scalar_type() == at::kFloat) {
    for (int64_t r = 0; r < n; ++r)
      silu_mul_row(gate_up.data_ptr<float>() + r * 2 * inner, out.data_ptr<float>() + r * inner,
                   inner);
  } else if (gate_up.scalar_type() == at::kBFloat16) {
    using bf = at::BFloat16;
    for (int64_t r = 0; r < n; ++r)
      silu_mul_row(gate_up.data_ptr<bf>() + r * 2 * inner, out.data_ptr<bf>() + r * inner, inner);
  } else {
    TORCH_CHECK(false, "decode_silu_mul: unsupported dtype");
  }
  return out;
}

// scores [B, V] (the processed logits the draw is from), logits [B, V] (the raw ones the log-prob
// is of; the same tensor when nothing processes them), uniforms [B] float64 in [0, 1). Returns
// the drawn ids [B] (int64) and their log-probs [B] (fp32).
std::tuple<torch::Tensor, torch::Tensor> decode_cdf_sample(const torch::Tensor& scores,
                                                           const torch::Tensor& logits,
                                                           const torch::Tensor& uniforms) {
  TORCH_CHECK(scores.dim() == 2 && logits.sizes() == scores.sizes(),
              "decode_cdf_sample: scores and logits [B, V]");
  TORCH_CHECK(scores.scalar_type() == at::kFloat && logits.scalar_type() == at::kFloat,
              "decode_cdf_sample: fp32 scores and logits");
  TORCH_CHECK(uniforms.dim() == 1 && uniforms.size(0) == scores.size(0) &&
                  uniforms.scalar_type() == at::kDouble,
              "decode_cdf_sample: uniforms must be float64 [B]");
  TORCH_CHECK(scores.is_contiguous() && logits.is_contiguous() && uniforms.is_contiguous(),
              "decode_cdf_sample: contiguous tensors");
  TORCH_CHECK(scores.is_cpu() && logits.is_cpu() && uniforms.is_cpu(),
              "decode_cdf_sample: CPU tensors");
  const int64_t rows = scores.size(0), vocab = scores.size(1);
  TORCH_CHECK(vocab >= 1, "decode_cdf_sample: an empty vocabulary");
  auto ids = torch::empty({rows}, scores.options().dtype(at::kLong));
  auto logprobs = torch::empty({rows}, scores.options());
  const float* s = scores.data_ptr<float>();
  const float* l = logits.data_ptr<float>();
  const bool same = s == l;
  const double* u = uniforms.data_ptr<double>();
  int64_t* out_ids = ids.data_ptr<int64_t>();
  float* out_lp = logprobs.data_ptr<float>();
  const int threads =
      static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), rows)));
#pragma omp parallel num_threads(threads)
  {
    std::vector<double> cdf((vocab + kBlock - 1) / kBlock);
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const float* row = s + r * vocab;
      const auto [index, lp] = draw_row(row, same ? row : l + r * vocab, vocab, u[r], cdf);
      out_ids[r] = index;
      out_lp[r] = lp;
    }
  }
  TORCH_CHECK(rows == 0 || ids.min().item<int64_t>() >= 0,
              "decode_cdf_sample: a row with no mass to draw from (every score -inf or NaN)");
  return {ids, logprobs};
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("decode_attention", &decode_attention, "one decode step's attention from the KV cache");
  m.def("decode_attention_step", &decode_attention_step,
        "one decode step's rotary embedding, cache writes and attention");
  m.def("decode_rms_norm", &decode_rms_norm, "Llama's RMSNorm of [N, H] rows");
  m.def("decode_silu_mul", &decode_silu_mul, "silu(gate) * up of [N, 2 I] rows");
  m.def("decode_cdf_sample", &decode_cdf_sample, "one inverse-CDF draw per row, with its log-prob");
  m.def("decode_linear_supported", &decode_linear_supported, "whether decode_linear was built");
  m.def("decode_linear_pack", &decode_linear_pack, "an fp32 weight packed for decode_linear");
  m.def("decode_linear_pack_into", &decode_linear_pack_into,
        "rows of a packed weight filled with a weight and a LoRA adapter merged in",
        pybind11::arg("packed"), pybind11::arg("row0"), pybind11::arg("w"),
        pybind11::arg("lora_b") = pybind11::none(), pybind11::arg("lora_a") = pybind11::none(),
        pybind11::arg("scale") = 1.0);
  m.def("decode_linear", &decode_linear, "x W^T (+ a residual) over a packed fp32 weight",
        pybind11::arg("x"), pybind11::arg("packed"), pybind11::arg("n"),
        pybind11::arg("residual") = pybind11::none());
}
