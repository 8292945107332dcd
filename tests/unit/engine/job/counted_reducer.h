// A reducer for the job's hand-off tests: completes every bucket at once,
// counts its destruction (a reducer retired, stopped or dropped), reports
// `buckets` as its totals and describes local rank r's device as global
// rank 100 + r.
#ifndef GRADD_TESTS_UNIT_ENGINE_JOB_COUNTED_REDUCER_H_
#define GRADD_TESTS_UNIT_ENGINE_JOB_COUNTED_REDUCER_H_

#include <atomic>
#include <cstdint>
#include <utility>

#include "server/engine/reduce/bucket_reducer.h"

namespace gradd {

class CountedReducer final : public BucketReducerInterface {
 public:
  explicit CountedReducer(std::atomic<int>* destroyed, uint64_t buckets = 0)
      : destroyed_(destroyed), buckets_(buckets) {}
  ~CountedReducer() override { destroyed_->fetch_add(1); }
  void Start(const BucketWork&, Completion done) override {
    std::move(done)(absl::OkStatus());
  }
  ReducerStats stats() const override {
    ReducerStats s;
    s.buckets = buckets_;
    s.network_ns = 10 * buckets_;
    return s;
  }
  void DescribeDevice(int rank, v1::AttachResponse* response) const override {
    response->set_global_rank(100 + rank);
  }

 private:
  std::atomic<int>* destroyed_;
  const uint64_t buckets_;
};

}  // namespace gradd

#endif  // GRADD_TESTS_UNIT_ENGINE_JOB_COUNTED_REDUCER_H_
