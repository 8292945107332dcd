#include "client/src/plan/plan_move.h"

#include <cstring>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gradd {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Device memory the test can read, and a record of what the plan move
// asked of the device.
class RecordingDevice final : public DeviceClient {
 public:
  explicit RecordingDevice(size_t bytes) : memory_(bytes) {}
  char* base() const override { return const_cast<char*>(memory_.data()); }
  size_t size() const override { return memory_.size(); }
  absl::Status RecordReady(int, void*) override { return absl::OkStatus(); }
  absl::Status WaitDone(int, void*) override { return absl::OkStatus(); }
  absl::Status MoveGradients(const std::vector<RegionMove>& moves,
                             const std::vector<int>& done_buckets,
                             absl::string_view who) override {
    ++calls;
    this->moves = moves;
    this->done_buckets = done_buckets;
    this->who = std::string(who);
    if (!fail.ok()) return fail;
    std::vector<char> snapshot = memory_;
    for (const RegionMove& m : moves) {
      std::memcpy(memory_.data() + m.to, snapshot.data() + m.from, m.bytes);
    }
    return absl::OkStatus();
  }

  int calls = 0;
  std::vector<RegionMove> moves;
  std::vector<int> done_buckets;
  std::string who;
  absl::Status fail;

 private:
  std::vector<char> memory_;
};

BucketInfo Bucket(int device, std::vector<int32_t> params) {
  BucketInfo b{};
  b.device = device;
  b.params = std::move(params);
  return b;
}

// Parameters 0 and 2 on the GPU, 1 on the host (the client's used map is
// a host bucket of a CUDA job); the new plan swaps 0 and 2 and moves 1.
class PlanMoveTest : public ::testing::Test {
 protected:
  PlanMoveTest() : device_(64), host_(64) {
    char* d = device_.base();
    std::memcpy(d + 0, "AAAA", 4);
    std::memcpy(d + 4, "CCCCCCCC", 8);
    std::memcpy(host_.data() + 0, "BB", 2);
    now_.data = {d + 0, host_.data() + 0, d + 4};
    now_.on_device = {true, false, true};
    now_.device_buckets = {0};
    next_.buckets = {Bucket(1, {2, 0}), Bucket(0, {1})};
    next_.data = {d + 8, host_.data() + 32, d + 0};
    next_.bucket_of = {0, 1, 0};
  }
  RecordingDevice device_;
  std::vector<char> host_;
  GradientPlaces now_;
  PlanViews next_;
  const std::vector<size_t> bytes_ = {4, 2, 8};
};

TEST_F(PlanMoveTest, HostGradientsByMemcpyDeviceOnesThroughTheDevice) {
  ASSERT_TRUE(
      MoveToPlan(now_, next_, bytes_, &device_, "job 'j', rank 1").ok());
  EXPECT_EQ(std::string(host_.data() + 32, 2), "BB");
  EXPECT_EQ(device_.calls, 1);
  EXPECT_THAT(device_.moves,
              ElementsAre(RegionMove{0, 8, 4}, RegionMove{4, 0, 8}));
  EXPECT_THAT(device_.done_buckets, ElementsAre(0));
  EXPECT_EQ(device_.who, "job 'j', rank 1");
  EXPECT_EQ(std::string(device_.base(), 12), "CCCCCCCCAAAA");
}

TEST_F(PlanMoveTest, AGradientChangingSidesIsRefusedBeforeAnythingMoves) {
  next_.buckets[1].device = 1;  // the host parameter lands on the GPU
  absl::Status s = MoveToPlan(now_, next_, bytes_, &device_, "job 'j', rank 1");
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(s.message(),
              AllOf(HasSubstr("job 'j', rank 1"),
                    HasSubstr("parameter 1 moves from a host bucket to a CUDA "
                              "one")));
  EXPECT_EQ(device_.calls, 0);
  EXPECT_EQ(std::string(host_.data() + 32, 2), std::string(2, '\0'));
}

TEST_F(PlanMoveTest, ADevicePlaceOutsideTheDeviceMemoryIsRefused) {
  next_.data[2] = device_.base() + 60;  // 8 bytes from 60 of 64
  absl::Status s = MoveToPlan(now_, next_, bytes_, &device_, "job 'j', rank 1");
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(s.message(), HasSubstr("outside the 64-byte region"));
  EXPECT_EQ(device_.calls, 0);
  EXPECT_EQ(std::string(host_.data() + 32, 2), std::string(2, '\0'));
}

TEST_F(PlanMoveTest, CudaBucketsWithoutADeviceAreAnInternalError) {
  absl::Status s = MoveToPlan(now_, next_, bytes_, nullptr, "job 'j', rank 1");
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(s.message(), HasSubstr("no device memory"));
}

TEST_F(PlanMoveTest, TheDevicesErrorComesBack) {
  device_.fail = absl::UnavailableError("cuda:0: cuCtxSynchronize failed");
  absl::Status s = MoveToPlan(now_, next_, bytes_, &device_, "job 'j', rank 1");
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(s.message(), HasSubstr("cuCtxSynchronize"));
}

TEST(PlanMoveHostOnlyTest, ACpuJobNeverTouchesADevice) {
  std::vector<char> host(16);
  std::memcpy(host.data(), "xyzw", 4);
  GradientPlaces now;
  now.data = {host.data(), host.data() + 2};
  now.on_device = {false, false};
  PlanViews next;
  next.buckets = {Bucket(0, {1, 0})};
  next.data = {host.data() + 2, host.data()};
  next.bucket_of = {0, 0};
  ASSERT_TRUE(MoveToPlan(now, next, {2, 2}, nullptr, "job 'j', rank 0").ok());
  EXPECT_EQ(std::string(host.data(), 4), "zwxy");
}

TEST(PlanMoveHostOnlyTest, MismatchedSizesAreInternalErrors) {
  GradientPlaces now;
  now.data = {nullptr};
  now.on_device = {false};
  PlanViews next;
  EXPECT_EQ(MoveToPlan(now, next, {4}, nullptr, "w").code(),
            absl::StatusCode::kInternal);
}

}  // namespace
}  // namespace gradd
