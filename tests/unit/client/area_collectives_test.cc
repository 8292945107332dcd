// area_collectives.h over a fake job: N ranks as threads, each with its own
// area, whose rounds meet in FakeJob, which does what the daemon does with
// the areas (common/control_block.h) using the daemon's reduction kernels.
#include "client/src/data/area_collectives.h"

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/collective_reduce.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gradd {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr int32_t kF32 = static_cast<int32_t>(CollectiveDType::kFloat32);
constexpr int32_t kF64 = static_cast<int32_t>(CollectiveDType::kFloat64);
constexpr int32_t kI32 = static_cast<int32_t>(CollectiveDType::kInt32);
// Bytes after each area that no call may write.
constexpr size_t kGuard = 16;
constexpr char kGuardByte = 0x5a;

// One round as every rank described it, with each rank's area contents
// (its first `bytes`) when it published the round.
struct RoundRecord {
  CollectiveKind kind;
  int32_t dtype;
  int32_t op;
  uint64_t bytes;
  int32_t root;
  std::vector<std::string> inputs;  // by rank
};

class FakeJob;

// One rank's area; its rounds go to the job.
class FakeCollectiveArea final : public CollectiveAreaInterface {
 public:
  FakeCollectiveArea(FakeJob* job, int rank, size_t area_bytes)
      : job_(job), rank_(rank), area_bytes_(area_bytes) {
    memory_.assign(area_bytes + kGuard, kGuardByte);
  }
  char* area() override { return area_bytes_ == 0 ? nullptr : memory_.data(); }
  size_t area_bytes() const override { return area_bytes_; }
  int global_rank() const override { return rank_; }
  int world_size() const override;
  std::string Who() const override {
    return absl::StrCat("job 'fake', local rank ", rank_);
  }
  absl::Status Usable(absl::string_view what) const override {
    ++usable_calls_;
    return usable_;
  }
  absl::Status Round(CollectiveKind kind, int32_t dtype, int32_t op,
                     uint64_t bytes, int32_t root) override;

  void set_usable(absl::Status s) { usable_ = std::move(s); }
  int usable_calls() const { return usable_calls_; }
  bool GuardIntact() const {
    for (size_t i = area_bytes_; i < memory_.size(); ++i) {
      if (memory_[i] != kGuardByte) return false;
    }
    return true;
  }

 private:
  FakeJob* const job_;
  const int rank_;
  const size_t area_bytes_;
  std::vector<char> memory_;
  absl::Status usable_;
  mutable int usable_calls_ = 0;
};

// The daemon's side: a round starts when every rank published it, and all
// must agree on its description.
class FakeJob {
 public:
  FakeJob(int world, size_t area_bytes) : world_(world) {
    for (int r = 0; r < world; ++r) {
      ranks_.push_back(
          std::make_unique<FakeCollectiveArea>(this, r, area_bytes));
    }
    published_.resize(world);
    areas_.resize(world);
  }
  int world() const { return world_; }
  FakeCollectiveArea& rank(int r) { return *ranks_[r]; }
  const std::vector<RoundRecord>& rounds() const { return rounds_; }

  // Runs fn(rank, area) on one thread per rank; each rank's status.
  std::vector<absl::Status> Run(
      const std::function<absl::Status(int, CollectiveAreaInterface&)>& fn) {
    std::vector<absl::Status> statuses(world_);
    std::vector<std::thread> threads;
    for (int r = 0; r < world_; ++r) {
      threads.emplace_back([&, r] { statuses[r] = fn(r, *ranks_[r]); });
    }
    for (std::thread& t : threads) t.join();
    return statuses;
  }

  absl::Status Round(int rank, char* area, const RoundRecord& round) {
    std::unique_lock<std::mutex> lock(mu_);
    const uint64_t generation = generation_;
    published_[rank] = round;
    areas_[rank] = area;
    if (++arrived_ == world_) {
      status_ = Finish();
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
    } else if (!cv_.wait_for(lock, std::chrono::seconds(10),
                             [&] { return generation_ != generation; })) {
      return absl::DeadlineExceededError(
          absl::StrCat("rank ", rank, " waited 10 s for the other ranks"));
    }
    return status_;
  }

 private:
  absl::Status Finish() {
    RoundRecord round = published_[0];
    for (int r = 0; r < world_; ++r) {
      const RoundRecord& p = published_[r];
      if (p.kind != round.kind || p.dtype != round.dtype || p.op != round.op ||
          p.bytes != round.bytes || p.root != round.root) {
        return absl::InvalidArgumentError(
            absl::StrCat("rank ", r, " disagrees with rank 0"));
      }
      round.inputs.push_back(round.bytes == 0
                                 ? std::string()
                                 : std::string(areas_[r], round.bytes));
    }
    rounds_.push_back(round);
    const size_t bytes = round.bytes;
    switch (round.kind) {
      case CollectiveKind::kBroadcast:
        for (int r = 0; r < world_ && bytes > 0; ++r) {
          if (r != round.root)
            std::memcpy(areas_[r], areas_[round.root], bytes);
        }
        break;
      case CollectiveKind::kAllreduce:
      case CollectiveKind::kReduceScatter: {
        const auto dtype = static_cast<CollectiveDType>(round.dtype);
        const auto op = static_cast<CollectiveOp>(round.op);
        const size_t n = bytes / CollectiveDTypeSize(dtype);
        std::vector<const void*> srcs(areas_.begin(), areas_.end());
        std::vector<void*> dsts(areas_.begin(), areas_.end());
        std::vector<char> acc(n *
                              CollectiveDTypeSize(ReductionAccumulator(dtype)));
        ReduceToAccumulator(dtype, op, srcs.data(), world_, acc.data(), 0, n);
        WriteFromAccumulator(dtype, op, acc.data(), world_, dsts.data(), world_,
                             0, n);
        break;
      }
      case CollectiveKind::kAllgather: {
        if (world_ * bytes > ranks_[0]->area_bytes()) {
          return absl::InvalidArgumentError("allgather overflows the area");
        }
        for (int r = 0; r < world_; ++r) {
          for (int j = 0; j < world_; ++j) {
            std::memcpy(areas_[r] + j * bytes, round.inputs[j].data(), bytes);
          }
        }
        break;
      }
      case CollectiveKind::kBarrier:
        break;
    }
    return absl::OkStatus();
  }

  const int world_;
  std::vector<std::unique_ptr<FakeCollectiveArea>> ranks_;
  std::mutex mu_;
  std::condition_variable cv_;
  uint64_t generation_ = 0;
  int arrived_ = 0;
  std::vector<RoundRecord> published_;
  std::vector<char*> areas_;
  absl::Status status_;
  std::vector<RoundRecord> rounds_;
};

int FakeCollectiveArea::world_size() const { return job_->world(); }

absl::Status FakeCollectiveArea::Round(CollectiveKind kind, int32_t dtype,
                                       int32_t op, uint64_t bytes,
                                       int32_t root) {
  if (bytes > area_bytes_) {
    return absl::InvalidArgumentError(
        absl::StrCat("round of ", bytes, " bytes overflows the area"));
  }
  return job_->Round(rank_, area(),
                     RoundRecord{kind, dtype, op, bytes, root, {}});
}

// (kind, dtype, op, bytes, root) of every round.
std::vector<std::string> Descriptions(const FakeJob& job) {
  std::vector<std::string> out;
  for (const RoundRecord& r : job.rounds()) {
    out.push_back(absl::StrCat(CollectiveKindName(static_cast<int32_t>(r.kind)),
                               " ", r.dtype, " ", r.op, " ", r.bytes, " ",
                               r.root));
  }
  return out;
}

void ExpectAllOk(const std::vector<absl::Status>& statuses) {
  for (size_t r = 0; r < statuses.size(); ++r) {
    EXPECT_TRUE(statuses[r].ok()) << "rank " << r << ": " << statuses[r];
  }
}

void ExpectGuardsIntact(FakeJob& job) {
  for (int r = 0; r < job.world(); ++r) {
    EXPECT_TRUE(job.rank(r).GuardIntact()) << "rank " << r;
  }
}

// --- Allreduce ---

TEST(AreaCollectivesAllreduceTest, SplitsIntoRoundsOfWholeElements) {
  // 10 bytes hold 2 float32s: 5 elements go in rounds of 2, 2, 1.
  FakeJob job(3, 10);
  std::vector<std::vector<float>> data(3);
  for (int r = 0; r < 3; ++r) {
    for (int i = 0; i < 5; ++i) data[r].push_back(100.0f * r + i);
  }
  ExpectAllOk(job.Run([&](int r, CollectiveAreaInterface& a) {
    return AreaAllreduce(a, data[r].data(), 5, kF32, ReduceOp::kSum);
  }));
  EXPECT_THAT(Descriptions(job),
              ElementsAre("allreduce 1 0 8 0", "allreduce 1 0 8 0",
                          "allreduce 1 0 4 0"));
  for (int r = 0; r < 3; ++r) {
    EXPECT_THAT(data[r], ElementsAre(300, 303, 306, 309, 312)) << "rank " << r;
  }
  ExpectGuardsIntact(job);
}

TEST(AreaCollectivesAllreduceTest, OpAndDtypeReachEveryRound) {
  FakeJob job(2, 8);
  std::vector<std::vector<int32_t>> data = {{5, -1, 7}, {2, 9, 7}};
  ExpectAllOk(job.Run([&](int r, CollectiveAreaInterface& a) {
    return AreaAllreduce(a, data[r].data(), 3, kI32, ReduceOp::kMax);
  }));
  EXPECT_THAT(Descriptions(job),
              ElementsAre("allreduce 5 3 8 0", "allreduce 5 3 4 0"));
  EXPECT_THAT(data[0], ElementsAre(5, 9, 7));
  EXPECT_THAT(data[1], ElementsAre(5, 9, 7));
}

TEST(AreaCollectivesAllreduceTest, ZeroCountRunsOneEmptyRound) {
  FakeJob job(2, 16);
  ExpectAllOk(job.Run([&](int, CollectiveAreaInterface& a) {
    return AreaAllreduce(a, nullptr, 0, kF32, ReduceOp::kSum);
  }));
  EXPECT_THAT(Descriptions(job), ElementsAre("allreduce 1 0 0 0"));
}

TEST(AreaCollectivesAllreduceTest, AreaSmallerThanAnElementIsRefused) {
  FakeJob job(2, 4);
  double x = 1;
  absl::Status s = AreaAllreduce(job.rank(1), &x, 1, kF64, ReduceOp::kSum);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.message(),
            "Allreduce: the collective area of 4 bytes holds no element "
            "(job 'fake', local rank 1)");
  EXPECT_TRUE(job.rounds().empty());
}

TEST(AreaCollectivesAllreduceTest, NoAreaIsRefused) {
  FakeJob job(1, 0);
  float x = 1;
  absl::Status s = AreaAllreduce(job.rank(0), &x, 1, kF32, ReduceOp::kSum);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.message(),
            "Allreduce needs a collective area: attach with "
            "ClientOptions::collective_bytes > 0 (job 'fake', local rank 0)");
}

TEST(AreaCollectivesAllreduceTest, BadDtypeOrOpIsCheckedFirst) {
  FakeJob job(1, 16);
  job.rank(0).set_usable(absl::FailedPreconditionError("job failed"));
  float x = 1;
  absl::Status s = AreaAllreduce(job.rank(0), &x, 1, 99, ReduceOp::kSum);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("Allreduce: "));
  EXPECT_THAT(s.message(), HasSubstr("99"));
  EXPECT_THAT(s.message(), HasSubstr("(job 'fake', local rank 0)"));
  s = AreaAllreduce(job.rank(0), &x, 1, kI32, ReduceOp::kAvg);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("Allreduce: "));
  EXPECT_EQ(job.rank(0).usable_calls(), 0);
  // A good reduction then meets the client's state.
  s = AreaAllreduce(job.rank(0), &x, 1, kF32, ReduceOp::kSum);
  EXPECT_EQ(s, absl::FailedPreconditionError("job failed"));
  EXPECT_TRUE(job.rounds().empty());
}

TEST(AreaCollectivesAllreduceTest, NullBufferIsRefused) {
  FakeJob job(1, 16);
  absl::Status s = AreaAllreduce(job.rank(0), nullptr, 1, kF32, ReduceOp::kSum);
  EXPECT_EQ(s, absl::InvalidArgumentError("Allreduce of a null buffer"));
  EXPECT_TRUE(job.rounds().empty());
}

// --- Allgather ---

TEST(AreaCollectivesAllgatherTest, RanksBlocksInRankOrderOverRounds) {
  // 3 ranks in 8 bytes: 2 bytes of each rank's block per round.
  FakeJob job(3, 8);
  std::vector<std::string> in = {"abcde", "fghij", "klmno"};
  std::vector<std::string> out(3, std::string(15, '?'));
  ExpectAllOk(job.Run([&](int r, CollectiveAreaInterface& a) {
    return AreaAllgather(a, in[r].data(), 5, out[r].data());
  }));
  EXPECT_THAT(Descriptions(job),
              ElementsAre("allgather 0 0 2 0", "allgather 0 0 2 0",
                          "allgather 0 0 1 0"));
  // Each round carries the same slice of each rank's block.
  EXPECT_THAT(job.rounds()[1].inputs, ElementsAre("cd", "hi", "mn"));
  for (int r = 0; r < 3; ++r) EXPECT_EQ(out[r], "abcdefghijklmno");
  ExpectGuardsIntact(job);
}

TEST(AreaCollectivesAllgatherTest, ZeroBytesRunsOneEmptyRound) {
  FakeJob job(2, 8);
  ExpectAllOk(job.Run([&](int, CollectiveAreaInterface& a) {
    return AreaAllgather(a, nullptr, 0, nullptr);
  }));
  EXPECT_THAT(Descriptions(job), ElementsAre("allgather 0 0 0 0"));
}

TEST(AreaCollectivesAllgatherTest, AreaSmallerThanTheWorldIsRefused) {
  FakeJob job(3, 2);
  char in = 'x';
  char out[3];
  absl::Status s = AreaAllgather(job.rank(2), &in, 1, out);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.message(),
            "Allgather: the collective area of 2 bytes is smaller than the "
            "world size 3 (job 'fake', local rank 2)");
  EXPECT_TRUE(job.rounds().empty());
}

TEST(AreaCollectivesAllgatherTest, NullBufferAndClientStateAreChecked) {
  FakeJob job(1, 8);
  char in = 'x';
  EXPECT_EQ(AreaAllgather(job.rank(0), &in, 1, nullptr),
            absl::InvalidArgumentError("Allgather of a null buffer"));
  job.rank(0).set_usable(absl::FailedPreconditionError("in join mode"));
  char out = 0;
  EXPECT_EQ(AreaAllgather(job.rank(0), &in, 1, &out),
            absl::FailedPreconditionError("in join mode"));
  EXPECT_TRUE(job.rounds().empty());
}

// --- ReduceScatter ---

TEST(AreaCollectivesReduceScatterTest, PacksTheSameSliceOfEveryBlock) {
  // 2 ranks, float32, 24 bytes: 3 elements of each of the 2 blocks per
  // round; blocks of 7 go in rounds of 3, 3, 1 elements.
  FakeJob job(2, 24);
  std::vector<std::vector<float>> in(2);
  for (int r = 0; r < 2; ++r) {
    for (int i = 0; i < 14; ++i) in[r].push_back(1000.0f * r + i);
  }
  std::vector<std::vector<float>> out(2, std::vector<float>(7, -1));
  ExpectAllOk(job.Run([&](int r, CollectiveAreaInterface& a) {
    return AreaReduceScatter(a, in[r].data(), out[r].data(), 7, kF32,
                             ReduceOp::kSum);
  }));
  EXPECT_THAT(Descriptions(job),
              ElementsAre("reduce_scatter 1 0 24 0", "reduce_scatter 1 0 24 0",
                          "reduce_scatter 1 0 8 0"));
  // Round 2 of rank 1: elements [3, 6) of block 0, then of block 1.
  std::vector<float> packed(6);
  ASSERT_EQ(job.rounds()[1].inputs[1].size(), 24u);
  std::memcpy(packed.data(), job.rounds()[1].inputs[1].data(), 24);
  EXPECT_THAT(packed, ElementsAre(1003, 1004, 1005, 1010, 1011, 1012));
  // The last round packs one element per block.
  std::vector<float> last(2);
  std::memcpy(last.data(), job.rounds()[2].inputs[0].data(), 8);
  EXPECT_THAT(last, ElementsAre(6, 13));
  // Rank r keeps the sum of block r.
  EXPECT_THAT(out[0], ElementsAre(1000, 1002, 1004, 1006, 1008, 1010, 1012));
  EXPECT_THAT(out[1], ElementsAre(1014, 1016, 1018, 1020, 1022, 1024, 1026));
  ExpectGuardsIntact(job);
}

TEST(AreaCollectivesReduceScatterTest, AvgDividesByTheWorld) {
  FakeJob job(2, 64);
  std::vector<std::vector<double>> in = {{2, 4, 6, 8}, {4, 8, 12, 16}};
  std::vector<std::vector<double>> out(2, std::vector<double>(2));
  ExpectAllOk(job.Run([&](int r, CollectiveAreaInterface& a) {
    return AreaReduceScatter(a, in[r].data(), out[r].data(), 2, kF64,
                             ReduceOp::kAvg);
  }));
  EXPECT_THAT(Descriptions(job), ElementsAre("reduce_scatter 2 1 32 0"));
  EXPECT_THAT(out[0], ElementsAre(3, 6));
  EXPECT_THAT(out[1], ElementsAre(9, 12));
}

TEST(AreaCollectivesReduceScatterTest, ZeroCountRunsOneEmptyRound) {
  FakeJob job(3, 64);
  ExpectAllOk(job.Run([&](int, CollectiveAreaInterface& a) {
    return AreaReduceScatter(a, nullptr, nullptr, 0, kF32, ReduceOp::kMin);
  }));
  EXPECT_THAT(Descriptions(job), ElementsAre("reduce_scatter 1 2 0 0"));
}

TEST(AreaCollectivesReduceScatterTest, AreaWithoutAnElementPerRankIsRefused) {
  FakeJob job(2, 12);
  double in[2] = {1, 2};
  double out = 0;
  absl::Status s =
      AreaReduceScatter(job.rank(0), in, &out, 1, kF64, ReduceOp::kSum);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.message(),
            "ReduceScatter: the collective area of 12 bytes holds no element "
            "per rank (world size 2, job 'fake', local rank 0)");
  s = AreaReduceScatter(job.rank(0), in, nullptr, 1, kF64, ReduceOp::kSum);
  EXPECT_EQ(s, absl::InvalidArgumentError("ReduceScatter of a null buffer"));
  s = AreaReduceScatter(job.rank(0), in, &out, 1, kI32, ReduceOp::kAvg);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("ReduceScatter: "));
  EXPECT_TRUE(job.rounds().empty());
}

// --- Barrier ---

TEST(AreaCollectivesBarrierTest, OneEmptyRound) {
  FakeJob job(3, 8);
  ExpectAllOk(
      job.Run([&](int, CollectiveAreaInterface& a) { return AreaBarrier(a); }));
  EXPECT_THAT(Descriptions(job), ElementsAre("barrier 0 0 0 0"));
}

TEST(AreaCollectivesBarrierTest, NeedsAnAreaAndAUsableClient) {
  FakeJob job(1, 0);
  EXPECT_EQ(AreaBarrier(job.rank(0)),
            absl::FailedPreconditionError(
                "Barrier needs a collective area: attach with "
                "ClientOptions::collective_bytes > 0 (job 'fake', local rank "
                "0)"));
  job.rank(0).set_usable(absl::UnavailableError("daemon gone"));
  EXPECT_EQ(AreaBarrier(job.rank(0)), absl::UnavailableError("daemon gone"));
  EXPECT_TRUE(job.rounds().empty());
}

// --- Broadcast ---

TEST(AreaCollectivesBroadcastTest, RootsDataInRoundsOfTheArea) {
  FakeJob job(3, 4);
  std::vector<std::string> data = {std::string(10, '0'), "0123456789",
                                   std::string(10, '2')};
  ExpectAllOk(job.Run([&](int r, CollectiveAreaInterface& a) {
    return AreaBroadcast(a, data[r].data(), 10, 1);
  }));
  EXPECT_THAT(Descriptions(job),
              ElementsAre("broadcast 0 0 4 1", "broadcast 0 0 4 1",
                          "broadcast 0 0 2 1"));
  EXPECT_EQ(job.rounds()[2].inputs[1], "89");
  for (int r = 0; r < 3; ++r) EXPECT_EQ(data[r], "0123456789") << r;
  ExpectGuardsIntact(job);
}

TEST(AreaCollectivesBroadcastTest, ZeroBytesRunsOneEmptyRound) {
  FakeJob job(2, 4);
  ExpectAllOk(job.Run([&](int, CollectiveAreaInterface& a) {
    return AreaBroadcast(a, nullptr, 0, 0);
  }));
  EXPECT_THAT(Descriptions(job), ElementsAre("broadcast 0 0 0 0"));
}

TEST(AreaCollectivesBroadcastTest, DoesNotAskUsable) {
  // Broadcast is join mode's sync: the caller checks its own state.
  FakeJob job(1, 4);
  job.rank(0).set_usable(absl::FailedPreconditionError("in join mode"));
  char x = 'a';
  EXPECT_TRUE(AreaBroadcast(job.rank(0), &x, 1, 0).ok());
  EXPECT_EQ(job.rank(0).usable_calls(), 0);
  EXPECT_EQ(job.rounds().size(), 1u);
}

TEST(AreaCollectivesBroadcastTest, BadRootNullBufferAndNoAreaAreRefused) {
  FakeJob job(3, 4);
  char x = 'a';
  EXPECT_EQ(AreaBroadcast(job.rank(2), &x, 1, 3),
            absl::InvalidArgumentError(
                "Broadcast root 3 is not a rank of the job (world size 3, "
                "job 'fake', local rank 2)"));
  EXPECT_EQ(AreaBroadcast(job.rank(2), &x, 1, -1).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(AreaBroadcast(job.rank(2), nullptr, 1, 0),
            absl::InvalidArgumentError("Broadcast of a null buffer"));
  FakeJob none(1, 0);
  EXPECT_EQ(AreaBroadcast(none.rank(0), &x, 1, 0),
            absl::FailedPreconditionError(
                "Broadcast needs a broadcast area: attach with "
                "ClientOptions::broadcast_bytes or collective_bytes > 0 (job "
                "'fake', local rank 0)"));
  EXPECT_TRUE(job.rounds().empty());
  EXPECT_TRUE(none.rounds().empty());
}

// A round's error ends the call at that round.
TEST(AreaCollectivesTest, RoundErrorStopsTheSplit) {
  FakeJob job(2, 4);
  std::vector<std::string> data = {"abcdefghij", "abcdefghijkl"};
  std::vector<absl::Status> s = job.Run([&](int r, CollectiveAreaInterface& a) {
    // Rank 1 broadcasts 12 bytes where rank 0 broadcasts 10: the third
    // round's sizes (2 and 4) disagree.
    return AreaBroadcast(a, data[r].data(), data[r].size(), 0);
  });
  EXPECT_EQ(s[0].code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s[1].code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(job.rounds().size(), 2u);
}

}  // namespace
}  // namespace gradd
