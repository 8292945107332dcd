#include "server/engine/job/bucket_autotune.h"

#include <algorithm>
#include <utility>

namespace gradd {

AutotuneOptions DefaultAutotuneOptions() {
  AutotuneOptions o;
  for (size_t mib : {1, 4, 10, 25, 64}) o.caps.push_back(mib << 20);
  return o;
}

const char* AutotuneStateName(BucketAutotune::State state) {
  switch (state) {
    case BucketAutotune::State::kWaiting:
      return "waiting";
    case BucketAutotune::State::kTuning:
      return "tuning";
    case BucketAutotune::State::kSettled:
      return "settled";
    case BucketAutotune::State::kOff:
      return "off";
  }
  return "unknown";
}

BucketAutotune::BucketAutotune(AutotuneOptions options)
    : options_(std::move(options)) {}

BucketAutotune::Setting BucketAutotune::TrialSetting(uint64_t k) const {
  Setting s;
  if (next_cap_ < caps_.size()) {
    s.cap_bytes = caps_[next_cap_];
  } else {
    s.cap_bytes = best_cap_;
    s.partition_bytes = options_.partitions[next_cap_ - caps_.size()];
  }
  s.next_switch_after = k + static_cast<uint64_t>(options_.warmup_iterations) +
                        static_cast<uint64_t>(options_.measured_iterations);
  s.trial = static_cast<int>(next_cap_) + 1;
  s.trials = static_cast<int>(caps_.size() + options_.partitions.size());
  return s;
}

const BucketAutotune::Trial* BucketAutotune::Best(size_t from) const {
  const Trial* best = nullptr;
  for (size_t i = from; i < done_.size(); ++i) {
    const Trial& d = done_[i];
    if (d.iterations == 0) continue;
    if (best == nullptr || d.step_ns < best->step_ns) best = &d;
  }
  return best;
}

BucketAutotune::Setting BucketAutotune::Start(uint64_t k,
                                              std::vector<size_t> caps) {
  if (state_ != State::kWaiting) return setting_;
  caps_ = std::move(caps);
  if (caps_.size() <= 1 && options_.partitions.empty()) {
    state_ = State::kSettled;
    setting_ = Setting{};
    setting_.cap_bytes =
        caps_.empty() ? options_.fallback_cap_bytes : caps_.front();
    settled_after_ = k;
    note_ = "one distinct plan among the candidate caps: nothing to try";
    return setting_;
  }
  if (caps_.size() <= 1) {
    // Only the partition to try, with the one cap.
    best_cap_ = caps_.empty() ? options_.fallback_cap_bytes : caps_.front();
    caps_.clear();
  }
  state_ = State::kTuning;
  next_cap_ = 0;
  setting_ = TrialSetting(k);
  measure_after_ = k + static_cast<uint64_t>(options_.warmup_iterations);
  times_.clear();
  return setting_;
}

void BucketAutotune::OnStep(uint64_t iteration, int64_t step_ns) {
  if (state_ != State::kTuning || step_ns <= 0) return;
  if (iteration <= measure_after_ || iteration > setting_.next_switch_after) {
    return;
  }
  times_.push_back(step_ns);
}

BucketAutotune::Setting BucketAutotune::Next(uint64_t k) {
  if (state_ != State::kTuning) return setting_;
  Trial t;
  t.cap_bytes = setting_.cap_bytes;
  t.partition_bytes = setting_.partition_bytes;
  t.iterations = static_cast<int>(times_.size());
  if (!times_.empty()) {
    std::vector<int64_t> sorted = times_;
    std::sort(sorted.begin(), sorted.end());
    // The lower median: with an even count, the faster middle one.
    t.step_ns = sorted[(sorted.size() - 1) / 2];
  }
  done_.push_back(t);
  times_.clear();
  ++next_cap_;
  if (next_cap_ == caps_.size()) {
    // The caps are tried: the partition trials run with the best one.
    const Trial* best = Best(0);
    best_cap_ = best != nullptr ? best->cap_bytes
                : caps_.empty() ? options_.fallback_cap_bytes
                                : caps_.front();
  }
  if (next_cap_ < caps_.size() + options_.partitions.size()) {
    setting_ = TrialSetting(k);
    measure_after_ = k + static_cast<uint64_t>(options_.warmup_iterations);
    return setting_;
  }
  // The best measured trial; the first of equals (the smaller cap when the
  // caps were tried in increasing order). With partition trials, the best
  // of them (they all ran the best cap); the best cap alone when none
  // measured anything.
  const Trial* best = Best(0);
  if (!options_.partitions.empty()) best = Best(caps_.size());
  state_ = State::kSettled;
  setting_ = Setting{};
  if (best != nullptr) {
    setting_.cap_bytes = best->cap_bytes;
    setting_.partition_bytes = best->partition_bytes;
  } else if (!options_.partitions.empty() && best_cap_ != 0) {
    setting_.cap_bytes = best_cap_;
  } else {
    setting_.cap_bytes = options_.fallback_cap_bytes;
    note_ = "no trial measured an iteration";
  }
  settled_after_ = k;
  return setting_;
}

void BucketAutotune::Stop(std::string note) {
  if (state_ == State::kSettled || state_ == State::kOff) return;
  state_ = State::kOff;
  note_ = std::move(note);
  setting_.next_switch_after = 0;
  setting_.trial = 0;
}

void BucketAutotune::Follow(uint64_t k, const Setting& setting) {
  if (state_ == State::kSettled || state_ == State::kOff) return;
  if (state_ == State::kTuning && setting_.trial > 0) {
    // What node rank 0 measured is not known here; the trial is listed
    // with its cap only.
    done_.push_back(Trial{setting_.cap_bytes, 0, 0});
  }
  setting_ = setting;
  if (setting.next_switch_after == 0) {
    state_ = State::kSettled;
    settled_after_ = k;
  } else {
    state_ = State::kTuning;
  }
}

AutotuneSnapshot AutotuneRecord::Snapshot() const {
  absl::MutexLock lock(&mu_);
  AutotuneSnapshot s;
  s.state = tune_.state();
  s.setting = tune_.setting();
  s.trials_done = tune_.trials_done();
  s.settled_after = tune_.settled_after();
  s.decided_here = decided_here_;
  s.note = tune_.note();
  return s;
}

}  // namespace gradd
