// The two random number generators torch's PowerSGD hooks draw their
// initial Q matrices from, reproduced so the daemon draws the same values
// (up to the last bit of the transcendental functions) without the trainer
// sending them:
//
//   NumpyRandomState  numpy.random.RandomState(seed).randint(high): MT19937
//                     seeded by init_genrand, bounded by masked rejection
//                     (PowerSGDState.rng, one draw per bucket per
//                     randomisation)
//   TorchCpuRandom    torch.manual_seed(s); torch.randn(n) on CPU, float32:
//                     MT19937 (init_genrand), 24-bit uniforms, Box-Muller in
//                     blocks of 16 (n >= 16; the last block recomputed over
//                     the final 16 elements) or torch's double
//                     normal_distribution with its cached second sample
//                     (n < 16)
//
// torch's AVX2 build computes log/sin/cos of the 16-blocks with Sleef
// (1 ulp); these use the C library's, so values can differ in the last
// bit. Thread-compatible.
#ifndef GRADD_SERVER_HOOKS_TORCH_RANDOM_H_
#define GRADD_SERVER_HOOKS_TORCH_RANDOM_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <random>

namespace gradd {

class NumpyRandomState {
 public:
  explicit NumpyRandomState(uint32_t seed) : mt_(seed) {}
  // A uniform integer in [0, high), high in 1..2^32.
  int64_t RandInt(int64_t high);

 private:
  std::mt19937 mt_;
};

class TorchCpuRandom {
 public:
  void ManualSeed(uint64_t seed);
  // torch.randn(n) (float32, contiguous) into out[0, n).
  void Randn(float* out, size_t n);

 private:
  float UniformFloat();
  double UniformDouble();
  double NormalDouble();

  std::mt19937 mt_{5489};
  std::optional<double> next_double_normal_;
};

}  // namespace gradd

#endif  // GRADD_SERVER_HOOKS_TORCH_RANDOM_H_
