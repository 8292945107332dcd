// Client's default implementations of the CUDA-stream calls, for clients
// that have no device buckets (wrappers override them to forward).
#include "gradd/client.h"

namespace gradd {

absl::Status Client::MarkReadyOn(int param, void*) { return MarkReady(param); }

absl::Status Client::WaitAllOn(void*) { return WaitAll(); }

}  // namespace gradd
