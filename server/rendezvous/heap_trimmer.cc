#include "server/rendezvous/heap_trimmer.h"

#include <malloc.h>

namespace gradd {

HeapTrimmer::HeapTrimmer(absl::Duration period) : period_(period) {
  thread_ = std::thread([this] { Loop(); });
}

HeapTrimmer::~HeapTrimmer() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

void HeapTrimmer::TrimNow() { malloc_trim(0); }

void HeapTrimmer::FixMallocThresholds() {
  mallopt(M_MMAP_THRESHOLD, kMmapBytes);
  mallopt(M_TRIM_THRESHOLD, kTrimBytes);
}

void HeapTrimmer::Loop() {
  absl::MutexLock lock(&mu_);
  while (!stop_) {
    // Wakes early only to stop.
    mu_.AwaitWithTimeout(absl::Condition(&stop_), period_);
    if (stop_) break;
    mu_.Unlock();
    TrimNow();
    mu_.Lock();
  }
}

}  // namespace gradd
