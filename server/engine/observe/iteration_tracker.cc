#include "server/engine/observe/iteration_tracker.h"

#include <algorithm>

namespace gradd {

std::optional<IterationEvent> IterationTracker::Add(const BucketEvent& b) {
  if (b.iteration != iteration_ || seen_ == 0) {
    iteration_ = b.iteration;
    seen_ = 0;
    last_start_ns_ = 0;
    spans_.clear();
  }
  ++seen_;
  spans_.emplace_back(b.start_ns, std::max(b.start_ns, b.done_ns));
  last_start_ns_ = std::max(last_start_ns_, b.start_ns);
  if (seen_ < b.num_buckets) return std::nullopt;

  IterationEvent e;
  e.iteration = iteration_;
  std::sort(spans_.begin(), spans_.end());
  int64_t end_ns = 0;
  // Union of the spans, and its part before the last hand-over.
  int64_t open = spans_.front().first;
  int64_t close = spans_.front().second;
  auto flush = [&] {
    e.communication_ns += close - open;
    e.overlapped_ns +=
        std::max<int64_t>(0, std::min(close, last_start_ns_) - open);
    end_ns = std::max(end_ns, close);
  };
  for (size_t i = 1; i < spans_.size(); ++i) {
    if (spans_[i].first > close) {
      flush();
      open = spans_[i].first;
      close = spans_[i].second;
    } else {
      close = std::max(close, spans_[i].second);
    }
  }
  flush();
  if (ended_ns_ != 0 && ended_iteration_ + 1 == iteration_) {
    e.step_ns = end_ns - ended_ns_;
  }
  ended_iteration_ = iteration_;
  ended_ns_ = end_ns;
  seen_ = 0;
  spans_.clear();
  return e;
}

}  // namespace gradd
