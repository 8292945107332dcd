// A test fixture base for unit tests that drive a real Job through its
// control block as its two local ranks would: both ranks mapped in this
// process (the job block read-only, as trainers get it), a bucket handed
// over by writing its ready row and ringing the rank's bell.
//
// The Job itself stays in the derived fixture (declared there, so it is
// destroyed before this mapping and before anything the fixture lent it).
#ifndef GRADD_TESTS_UNIT_ENGINE_JOB_JOB_CONTROL_TEST_H_
#define GRADD_TESTS_UNIT_ENGINE_JOB_JOB_CONTROL_TEST_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/bucket_planner.h"
#include "common/control_block.h"
#include "common/control_mapping.h"
#include "common/doorbell.h"
#include "gtest/gtest.h"
#include "server/engine/job/job.h"

namespace gradd {

class JobControlTest : public ::testing::Test {
 protected:
  // What these fixtures' jobs share: `id`, two local ranks, a 4 KiB
  // broadcast area and two float32 parameters of 64 bytes, planned into one
  // bucket each (64-byte caps). Callers set the nodes and what else they test.
  static JobSpec TwoBucketSpec(std::string id) {
    JobSpec spec;
    spec.job_id = std::move(id);
    spec.local_world_size = 2;
    spec.broadcast_bytes = 4096;
    for (int i = 0; i < 2; ++i) {
      spec.params.push_back({"p" + std::to_string(i), {16}, DType::kFloat32});
    }
    spec.planner.first_bucket_cap_bytes = 64;
    spec.planner.bucket_cap_bytes = 64;
    spec.plan = *PlanBuckets(spec.params, spec.planner);
    return spec;
  }
  // Maps `job`'s control block for its two local ranks (before Start).
  void MapControl(Job& job) {
    layout_ = std::make_unique<ControlLayout>(2, job.bucket_slots());
    std::vector<int> rank_blocks;
    for (int r = 0; r < 2; ++r) {
      rank_blocks.push_back(job.FdsFor(r)[2]);
      bells_.push_back(job.FdsFor(r)[3]);
    }
    control_ = *ControlMapping::Map(*layout_, job.FdsFor(0)[0],
                                    /*job_writable=*/false, rank_blocks);
    header_ = layout_->header(control_.data());
    me_ = layout_->rank_header(control_.data(), 0);
  }
  // Local rank `rank` hands bucket `bucket` of `iteration` over.
  void Publish(int rank, int bucket, uint64_t iteration) {
    layout_->ready_row(control_.data(), rank)[bucket].store(
        iteration, std::memory_order_release);
    RingDaemon(header_, layout_->rank_header(control_.data(), rank),
               bells_[rank]);
  }
  // The last iteration of bucket `bucket` the job completed.
  uint64_t Done(int bucket) {
    return layout_->done_seq(control_.data())[bucket].load(
        std::memory_order_acquire);
  }

  std::unique_ptr<ControlLayout> layout_;
  ControlMapping control_;
  ControlHeader* header_ = nullptr;
  RankHeader* me_ = nullptr;  // local rank 0's header
  std::vector<int> bells_;
};

}  // namespace gradd

#endif  // GRADD_TESTS_UNIT_ENGINE_JOB_JOB_CONTROL_TEST_H_
