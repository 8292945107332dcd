// Shared by the fuzz targets (tests/fuzz/*_fuzzer.cc): reading structured
// values off the fuzzer's bytes, and checks that stop the run on a broken
// property (libFuzzer saves the input; a replay fails its test).
//
// Every target defines LLVMFuzzerTestOneInput. Built with clang and
// -fsanitize=fuzzer it is a libFuzzer binary (tests/fuzz/CMakeLists.txt,
// GRADD_FUZZ); built with replay_main.cc it replays files (the corpus and
// the regressions, in the ordinary build's ctest).
#ifndef GRADD_TESTS_FUZZ_FUZZ_SUPPORT_H_
#define GRADD_TESTS_FUZZ_FUZZ_SUPPORT_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>

// Aborts with `what` when `cond` does not hold: a property of the code
// under test is broken for this input.
#define FUZZ_CHECK(cond, what)                                             \
  do {                                                                     \
    if (!(cond)) {                                                         \
      std::fprintf(stderr, "%s:%d: FUZZ_CHECK(%s) failed: %s\n", __FILE__, \
                   __LINE__, #cond, std::string(what).c_str());            \
      std::abort();                                                        \
    }                                                                      \
  } while (false)

namespace gradd::fuzz {

// Takes values off the front of the input; past its end every read yields
// zeros / empty strings, so any input is a complete script.
class Input {
 public:
  Input(const uint8_t* data, size_t size) : data_(data), size_(size) {}

  bool empty() const { return pos_ >= size_; }

  template <typename T>
  T Take() {
    T value{};
    const size_t n = std::min(sizeof(T), size_ - pos_);
    std::memcpy(&value, data_ + pos_, n);
    pos_ += n;
    return value;
  }

  // A string of up to `max` bytes whose length comes from the input.
  std::string TakeString(size_t max) {
    const size_t want = Take<uint16_t>() % (max + 1);
    const size_t n = std::min(want, size_ - pos_);
    std::string out(reinterpret_cast<const char*>(data_ + pos_), n);
    pos_ += n;
    return out;
  }

  // Whatever is left.
  std::string_view Rest() {
    std::string_view out(reinterpret_cast<const char*>(data_ + pos_),
                         size_ - pos_);
    pos_ = size_;
    return out;
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

}  // namespace gradd::fuzz

#endif  // GRADD_TESTS_FUZZ_FUZZ_SUPPORT_H_
