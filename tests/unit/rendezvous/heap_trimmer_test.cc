// HeapTrimmer (server/rendezvous/heap_trimmer.h): memory freed in small
// pieces in the middle of the heap - what gRPC's receive buffers leave -
// stays in the process until trimmed, and the trimmer's thread returns it.
#include "server/rendezvous/heap_trimmer.h"

#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace gradd {
namespace {

// Resident memory of this process, bytes.
long Rss() {
  std::ifstream in("/proc/self/statm");
  long size = 0;
  long resident = 0;
  in >> size >> resident;
  return resident * sysconf(_SC_PAGESIZE);
}

// 256 MiB in 16 KiB pieces, each followed by a small block that stays
// (as other allocations sit between gRPC's receive slices), then the
// pieces freed: they cannot merge into the top of the heap, so glibc keeps
// them. Returns the resident memory while they were all allocated.
std::vector<void*> pins;
long FreeInTheMiddleOfTheHeap() {
  std::vector<char*> pieces;
  for (int i = 0; i < 16384; ++i) {
    char* p = static_cast<char*>(std::malloc(16 << 10));
    for (int j = 0; j < (16 << 10); j += 4096) p[j] = 1;
    pieces.push_back(p);
    pins.push_back(std::malloc(16));
  }
  const long held = Rss();
  for (char* p : pieces) std::free(p);
  return held;
}

void Unpin() {
  for (void* p : pins) std::free(p);
  pins.clear();
}

TEST(HeapTrimmerTest, FreedMemoryGoesBackToTheSystem) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "AddressSanitizer's allocator replaces malloc: freed memory "
                  "is quarantined, and malloc_trim has nothing to hand back";
#endif
  const long held = FreeInTheMiddleOfTheHeap();
  // glibc keeps what was freed below the top of the heap...
  EXPECT_GT(Rss(), held - (64 << 20));
  HeapTrimmer::TrimNow();
  EXPECT_LT(Rss(), held - (128 << 20));
  Unpin();
}

TEST(HeapTrimmerTest, ItsThreadTrimsEveryPeriod) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "AddressSanitizer's allocator replaces malloc: freed memory "
                  "is quarantined, and malloc_trim has nothing to hand back";
#endif
  HeapTrimmer trimmer(absl::Milliseconds(20));
  const long held = FreeInTheMiddleOfTheHeap();
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (Rss() > held - (128 << 20) && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_LT(Rss(), held - (128 << 20));
  Unpin();
}

}  // namespace
}  // namespace gradd
