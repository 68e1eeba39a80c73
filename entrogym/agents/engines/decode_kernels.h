// The static decoder's CPU kernels (decode_attention.cpp, decode_linear.cpp, decode_ops.cpp): what they share
// (16-lane fp32 vectors, bf16 loads, rounding to a dtype, a vectorised exp for non-positive
// inputs) and the entry points the module binds.
#pragma once

#include <torch/extension.h>

#include <cstdint>
#include <cstring>

namespace entrogym_decode {

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

// x rounded to T's precision and back: an fp32 op's result as torch's kernels store it in T
// (round to nearest even for bf16), so that a chain of such ops rounds as torch's chain does.
inline float round_to(float x, float*) { return x; }
inline float round_to(float x, at::BFloat16*) { return static_cast<float>(at::BFloat16(x)); }
template <typename T>
inline float rounded(float x) {
  return round_to(x, static_cast<T*>(nullptr));
}

}  // namespace entrogym_decode

// The entry points (decode_attention.cpp, decode_linear.cpp, decode_ops.cpp), bound in
// decode_ops.cpp.
torch::Tensor decode_attention(const torch::Tensor& q, const torch::Tensor& keys_t,
                               const torch::Tensor& values, const torch::Tensor& valid,
                               int64_t end);
torch::Tensor decode_attention_step(const torch::Tensor& qkv, const torch::Tensor& cos,
                                    const torch::Tensor& sin, torch::Tensor& keys_t,
                                    torch::Tensor& values, const torch::Tensor& valid,
                                    int64_t column);
bool decode_linear_supported();
torch::Tensor decode_linear_pack(const torch::Tensor& w);
void decode_linear_pack_into(torch::Tensor& packed, int64_t row0, const torch::Tensor& w,
                             const c10::optional<torch::Tensor>& lora_b,
                             const c10::optional<torch::Tensor>& lora_a, double scale);
torch::Tensor decode_linear(const torch::Tensor& x, const torch::Tensor& packed, int64_t n,
                            const c10::optional<torch::Tensor>& residual);
