#include "server/hooks/torch_random.h"

#include <cmath>

namespace gradd {
namespace {

constexpr double kPi = 3.14159265358979323846;

}  // namespace

int64_t NumpyRandomState::RandInt(int64_t high) {
  if (high <= 1) return 0;
  const uint32_t range = static_cast<uint32_t>(high - 1);
  // numpy's legacy bounded draw: the smallest all-ones mask covering the
  // range, rejecting draws above it.
  uint32_t mask = range;
  mask |= mask >> 1;
  mask |= mask >> 2;
  mask |= mask >> 4;
  mask |= mask >> 8;
  mask |= mask >> 16;
  uint32_t v;
  do {
    v = static_cast<uint32_t>(mt_()) & mask;
  } while (v > range);
  return v;
}

void TorchCpuRandom::ManualSeed(uint64_t seed) {
  mt_.seed(static_cast<uint32_t>(seed));
  next_double_normal_.reset();
}

float TorchCpuRandom::UniformFloat() {
  const uint32_t r = static_cast<uint32_t>(mt_());
  return static_cast<float>(r & ((1u << 24) - 1)) * (1.0f / (1u << 24));
}

double TorchCpuRandom::UniformDouble() {
  const uint64_t hi = static_cast<uint32_t>(mt_());
  const uint64_t lo = static_cast<uint32_t>(mt_());
  const uint64_t r = (hi << 32) | lo;
  return static_cast<double>(r & ((uint64_t{1} << 53) - 1)) *
         (1.0 / static_cast<double>(uint64_t{1} << 53));
}

double TorchCpuRandom::NormalDouble() {
  if (next_double_normal_.has_value()) {
    const double v = *next_double_normal_;
    next_double_normal_.reset();
    return v;
  }
  const double u1 = UniformDouble();
  const double u2 = UniformDouble();
  const double r = std::sqrt(-2.0 * std::log1p(-u2));
  const double theta = 2.0 * kPi * u1;
  next_double_normal_ = r * std::sin(theta);
  return r * std::cos(theta);
}

void TorchCpuRandom::Randn(float* out, size_t n) {
  if (n < 16) {
    for (size_t i = 0; i < n; ++i) out[i] = static_cast<float>(NormalDouble());
    return;
  }
  auto fill16 = [](float* d) {
    for (int j = 0; j < 8; ++j) {
      const float u1 = 1 - d[j];
      const float u2 = d[j + 8];
      const float radius = std::sqrt(-2 * std::log(u1));
      const double theta = 2.0f * kPi * u2;
      d[j] = static_cast<float>(radius * std::cos(theta));
      d[j + 8] = static_cast<float>(radius * std::sin(theta));
    }
  };
  for (size_t i = 0; i < n; ++i) out[i] = UniformFloat();
  for (size_t i = 0; i + 16 <= n; i += 16) fill16(out + i);
  if (n % 16 != 0) {
    float* tail = out + n - 16;
    for (int i = 0; i < 16; ++i) tail[i] = UniformFloat();
    fill16(tail);
  }
}

}  // namespace gradd
