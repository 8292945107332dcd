#include "client/src/rebuild.h"

#include <cstring>

namespace gradd {

ReadyOrderRecorder::ReadyOrderRecorder(size_t num_params, bool enabled)
    : size_(num_params),
      enabled_(enabled),
      order_(std::make_unique<std::atomic<int32_t>[]>(num_params)) {}

void ReadyOrderRecorder::EndIteration() {
  if (!enabled_.load(std::memory_order_relaxed)) return;
  const size_t n = next_.exchange(0, std::memory_order_relaxed);
  if (n != size_) return;
  std::vector<int32_t> order(size_);
  std::vector<bool> seen(size_, false);
  for (size_t k = 0; k < size_; ++k) {
    const int32_t p = order_[k].load(std::memory_order_relaxed);
    if (p < 0 || static_cast<size_t>(p) >= size_ || seen[p]) return;
    seen[p] = true;
    order[k] = p;
  }
  last_ = std::move(order);
  if (++iterations_ == kRecordedIterations) Stop();
}

void MoveGradients(const std::vector<char*>& from, const std::vector<char*>& to,
                   const std::vector<size_t>& bytes) {
  size_t total = 0;
  for (size_t b : bytes) total += b;
  std::vector<char> staging(total);
  size_t at = 0;
  for (size_t i = 0; i < bytes.size(); ++i) {
    if (bytes[i] > 0) std::memcpy(staging.data() + at, from[i], bytes[i]);
    at += bytes[i];
  }
  at = 0;
  for (size_t i = 0; i < bytes.size(); ++i) {
    if (bytes[i] > 0) std::memcpy(to[i], staging.data() + at, bytes[i]);
    at += bytes[i];
  }
}

}  // namespace gradd
