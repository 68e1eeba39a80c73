// The static decoder's fp32 projections on CPU: y = x W^T (+ a residual) for the few rows of a
// decode step, streaming each weight from memory once per step.
//
// Why: at a decode step's 24 rows a step reads every weight once (537 MB for SmolLM2 in fp32),
// and oneDNN's kernel ran those reads at 293 GFLOP/s against 446 for one weight held in cache
// (2 threads, AMD EPYC, idle). Here the weight is packed in blocks of 16 output columns, [K, 16]
// each, so a block is one sequential stream; each 16-wide load of it feeds one FMA per row (up
// to 24 rows, whose accumulators stay in registers over the whole K), and the stream is
// prefetched 64 loads (4 KB) ahead: 430 GFLOP/s on the same machine, idle (docs/results.md).
// More rows go in chunks of 24 while a block is in cache, so the weight is still read once.
//
// It needs AVX-512's 32 vector registers for 24 accumulators: linear_supported() is false
// elsewhere, and the decoder keeps oneDNN's kernel there.
#include "decode_kernels.h"

#include <algorithm>
#include <array>
#include <utility>
#include <vector>

namespace {

using namespace entrogym_decode;

constexpr int64_t kRows = 24;     // rows per chunk: accumulators held in registers
constexpr int64_t kAhead = 64;    // loads of the weight stream prefetched ahead (4 KB)

// One block of 16 output columns for R (<= kRows) rows: xt [K, kRows] (the rows' chunk
// transposed, so that a step of K broadcasts from one or two cache lines), wp [K, 16] (the
// block of the packed weight). y and residual [R, n] at column `col`, `width` of the 16
// columns real (the last block of a width not a multiple of 16).
template <int R>
void block(const float* xt, const float* wp, float* y, const float* residual, int64_t k,
           int64_t n, int64_t col, int64_t width) {
  f16v acc[R];
  for (int m = 0; m < R; ++m) {
    acc[m] = f16v{};
    if (residual != nullptr)
      for (int64_t j = 0; j < width; ++j) acc[m][j] = residual[m * n + col + j];
  }
  for (int64_t i = 0; i < k; ++i) {
    __builtin_prefetch(wp + (i + kAhead) * kLanes, 0, 0);
    const f16v w = load16(wp + i * kLanes);
    const float* xr = xt + i * kRows;
#pragma GCC unroll 24
    for (int m = 0; m < R; ++m) acc[m] += xr[m] * w;
  }
  for (int m = 0; m < R; ++m) {
    if (width == kLanes) {
      std::memcpy(y + m * n + col, &acc[m], sizeof(f16v));
    } else {
      for (int64_t j = 0; j < width; ++j) y[m * n + col + j] = acc[m][j];
    }
  }
}

typedef void (*BlockFn)(const float*, const float*, float*, const float*, int64_t, int64_t,
                        int64_t, int64_t);

template <int... R>
constexpr std::array<BlockFn, sizeof...(R)> block_table(std::integer_sequence<int, R...>) {
  return {&block<R + 1>...};
}

}  // namespace

bool decode_linear_supported() {
#ifdef __AVX512F__
  return true;
#else
  return false;
#endif
}

// w [N, K] fp32 -> [ceil(N / 16), K, 16], the columns past N zero.
torch::Tensor decode_linear_pack(const torch::Tensor& w) {
  TORCH_CHECK(w.dim() == 2 && w.scalar_type() == at::kFloat && w.is_cpu(),
              "decode_linear_pack: an fp32 [N, K] weight on the CPU");
  const auto weight = w.contiguous();
  const int64_t n = weight.size(0), k = weight.size(1), blocks = (n + kLanes - 1) / kLanes;
  auto out = torch::zeros({blocks, k, kLanes}, weight.options());
  const float* src = weight.data_ptr<float>();
  float* dst = out.data_ptr<float>();
  at::parallel_for(0, blocks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      const int64_t width = std::min<int64_t>(kLanes, n - b * kLanes);
      // written in order, read from 16 rows at once
      for (int64_t i = 0; i < k; ++i)
        for (int64_t j = 0; j < width; ++j) dst[(b * k + i) * kLanes + j] = src[(b * kLanes + j) * k + i];
    }
  });
  return out;
}

// Rows [row0, row0 + N) of a stacked packed weight ([ceil(total / 16), K, 16], row0 and N
// multiples of 16) filled with w [N, K] + scale * lora_b [N, r] @ lora_a [r, K] (a LoRA
// adapter merged in: Hu et al., "LoRA", 2021, eq. 3), or w alone without lora_b/lora_a. One pass
// over w: each block of 16 rows is merged into a buffer in cache, then written transposed, where
// peft's merge, the sum, the concatenation and the packing read and wrote the weights five times.
void decode_linear_pack_into(torch::Tensor& packed, int64_t row0, const torch::Tensor& w,
                             const c10::optional<torch::Tensor>& lora_b,
                             const c10::optional<torch::Tensor>& lora_a, double scale) {
  TORCH_CHECK(packed.dim() == 3 && packed.size(2) == kLanes && packed.is_contiguous() &&
                  packed.scalar_type() == at::kFloat && packed.is_cpu(),
              "decode_linear_pack_into: packed must be fp32 [blocks, K, 16]");
  TORCH_CHECK(w.dim() == 2 && w.scalar_type() == at::kFloat && w.is_cpu() &&
                  w.size(1) == packed.size(1),
              "decode_linear_pack_into: w must be fp32 [N, K] with the packed weight's K");
  const int64_t n = w.size(0), k = w.size(1);
  TORCH_CHECK(row0 % kLanes == 0 && n % kLanes == 0 && row0 >= 0 &&
                  (row0 + n) / kLanes <= packed.size(0),
              "decode_linear_pack_into: rows must be whole blocks of 16 inside packed");
  TORCH_CHECK(lora_b.has_value() == lora_a.has_value(),
              "decode_linear_pack_into: lora_b and lora_a together");
  const auto weight = w.contiguous();
  torch::Tensor b, a;
  int64_t rank = 0;
  if (lora_b.has_value()) {
    b = lora_b->to(at::kFloat).contiguous();
    a = lora_a->to(at::kFloat).contiguous();
    rank = a.size(0);
    TORCH_CHECK(b.dim() == 2 && a.dim() == 2 && b.size(0) == n && b.size(1) == rank &&
                    a.size(1) == k,
                "decode_linear_pack_into: lora_b [N, r] and lora_a [r, K]");
  }
  const float* src = weight.data_ptr<float>();
  const float* bp = rank ? b.data_ptr<float>() : nullptr;
  const float* ap = rank ? a.data_ptr<float>() : nullptr;
  float* dst = packed.data_ptr<float>() + (row0 / kLanes) * k * kLanes;
  const float s = static_cast<float>(scale);
  at::parallel_for(0, n / kLanes, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> rows(kLanes * k);
    for (int64_t blk = begin; blk < end; ++blk) {
      for (int64_t j = 0; j < kLanes; ++j) {
        const int64_t row = blk * kLanes + j;
        float* out = rows.data() + j * k;
        std::memcpy(out, src + row * k, k * sizeof(float));
        for (int64_t r = 0; r < rank; ++r) {  // out += (scale * b[row, r]) * a[r, :]
          const float coef = s * bp[row * rank + r];
          const float* ar = ap + r * k;
          for (int64_t i = 0; i < k; ++i) out[i] += coef * ar[i];
        }
      }
      float* block = dst + blk * k * kLanes;
      for (int64_t i = 0; i < k; ++i)
        for (int64_t j = 0; j < kLanes; ++j) block[i * kLanes + j] = rows[j * k + i];
    }
  });
}

// x [M, K] fp32; packed from decode_linear_pack of a [n, K] weight; residual [M, n] or None.
// Returns x W^T (+ residual) [M, n].
torch::Tensor decode_linear(const torch::Tensor& x, const torch::Tensor& packed, int64_t n,
                            const c10::optional<torch::Tensor>& residual) {
  TORCH_CHECK(decode_linear_supported(), "decode_linear: built without AVX-512");
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_cpu(),
              "decode_linear: x must be fp32 [M, K] on the CPU");
  TORCH_CHECK(packed.dim() == 3 && packed.scalar_type() == at::kFloat && packed.size(2) == kLanes &&
                  packed.size(1) == x.size(1) && packed.size(0) == (n + kLanes - 1) / kLanes &&
                  packed.is_contiguous(),
              "decode_linear: packed must be decode_linear_pack's [ceil(n / 16), K, 16]");
  const int64_t m = x.size(0), k = x.size(1), chunks = (m + kRows - 1) / kRows;
  const float* res = nullptr;
  torch::Tensor r;
  if (residual.has_value()) {
    r = residual->contiguous();
    TORCH_CHECK(r.scalar_type() == at::kFloat && r.dim() == 2 && r.size(0) == m && r.size(1) == n,
                "decode_linear: residual must be fp32 [M, n]");
    res = r.data_ptr<float>();
  }
  // x's rows in chunks of kRows, each transposed to [K, kRows] (written in order)
  const auto xc = x.contiguous();
  const float* xp = xc.data_ptr<float>();
  std::vector<float> xt(chunks * k * kRows);
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t rows = std::min(kRows, m - c * kRows);
    for (int64_t i = 0; i < k; ++i)
      for (int64_t r = 0; r < rows; ++r) xt[(c * k + i) * kRows + r] = xp[(c * kRows + r) * k + i];
  }
  auto y = torch::empty({m, n}, x.options());
  float* yp = y.data_ptr<float>();
  const float* wp = packed.data_ptr<float>();
  static const auto table = block_table(std::make_integer_sequence<int, kRows>{});
  const int64_t blocks = packed.size(0);
  at::parallel_for(0, blocks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      const int64_t col = b * kLanes, width = std::min<int64_t>(kLanes, n - col);
      for (int64_t c = 0; c < chunks; ++c) {
        const int64_t rows = std::min(kRows, m - c * kRows);
        table[rows - 1](xt.data() + c * k * kRows, wp + b * k * kLanes, yp + c * kRows * n,
                        res == nullptr ? nullptr : res + c * kRows * n, k, n, col, width);
      }
    }
  });
  return y;
}
