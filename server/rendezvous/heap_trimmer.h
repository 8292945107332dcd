// HeapTrimmer: gives the heap memory the process has freed back to the
// operating system (glibc's malloc_trim) every `period` while it runs.
//
// Why the rendezvous server needs it: gRPC buffers a request whole before
// the service sees it, in many small slices, and the store keeps values of
// up to rendezvous.limits.max_value_bytes; when they are freed - a request
// refused for its credentials or its size, a round's keys deleted - glibc
// keeps the pages in its arenas. Measured on the coordinator (token, no
// TLS): a stranger sending 16 concurrent 31 MiB requests, each refused,
// six times over, left its RSS at 940 MB (from 22 MB) without trimming and
// up to 495 MB with it while glibc's thresholds were dynamic (see
// FixMallocThresholds), 24-39 MB with both; with mutual TLS, where
// strangers fail the handshake, it stayed at 24 MB. So the coordinator's memory
// follows what it holds (the store, bounded by
// rendezvous.limits.max_total_bytes, and the requests in flight), not what it
// once received.
//
// Thread-safety: the constructor starts the trimming thread (the trims run
// there, off every gRPC and engine thread); the destructor stops and joins
// it at once.
#ifndef GRADD_SERVER_RENDEZVOUS_HEAP_TRIMMER_H_
#define GRADD_SERVER_RENDEZVOUS_HEAP_TRIMMER_H_

#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace gradd {

class HeapTrimmer {
 public:
  explicit HeapTrimmer(absl::Duration period = absl::Seconds(2));
  ~HeapTrimmer();
  HeapTrimmer(const HeapTrimmer&) = delete;
  HeapTrimmer& operator=(const HeapTrimmer&) = delete;

  // Trims now (also what the thread does every period).
  static void TrimNow();

  // Fixes glibc's mmap and trim thresholds for the whole process; call
  // once, before any thread starts (the daemon's main). Why: glibc raises
  // both thresholds on its own the first time a large mmapped block is
  // freed (up to 32 MiB and 64 MiB), after which a freed 31 MiB request
  // stays as the top chunk of a thread's arena, which malloc_trim never
  // shrinks outside the main arena. Seen: 16 strangers' refused 31 MiB
  // requests left 13 arenas holding 15-60 MiB each (495 MiB RSS) with the
  // trimmer running. With fixed thresholds, a block of kMmapBytes or more
  // is its own mapping, unmapped when freed, and an arena's free top over
  // kTrimBytes goes back at once. The data path is not affected: its
  // buffers (shared memory, reducer scratch, transport buffers) live for
  // the job, not for an iteration.
  static constexpr int kMmapBytes = 4 << 20;
  static constexpr int kTrimBytes = 8 << 20;
  static void FixMallocThresholds();

 private:
  void Loop();

  const absl::Duration period_;
  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace gradd

#endif  // GRADD_SERVER_RENDEZVOUS_HEAP_TRIMMER_H_
