// The device-memory protocol without a GPU: device kinds and UUIDs, the
// daemon's answer when it has no CUDA, and FakeDeviceAllocator's memory
// crossing a Unix socket by SCM_RIGHTS as the session socket carries it.
#include "common/device_memory.h"

#include <sys/mman.h>
#include <sys/socket.h>

#include <chrono>
#include <cstring>
#include <string>

#include "common/device.h"
#include "common/fake_device_memory.h"
#include "common/shm.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gradd {
namespace {

using ::testing::HasSubstr;

const std::string kUuid0(16, '\x01');
const std::string kUuid1 = "0123456789abcdef";

TEST(DeviceKindTest, NamesAndWireValues) {
  EXPECT_EQ(DeviceKindName(DeviceKind::kCpu), "cpu");
  EXPECT_EQ(DeviceKindName(DeviceKind::kCuda), "cuda");
  EXPECT_EQ(*DeviceKindFromInt(1), DeviceKind::kCuda);
  absl::StatusOr<DeviceKind> bad = DeviceKindFromInt(7);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("unknown device kind 7"));
}

TEST(DeviceKindTest, FormatsUuidsAsNvidiaSmi) {
  EXPECT_EQ(FormatGpuUuid(kUuid0), "GPU-01010101-0101-0101-0101-010101010101");
  EXPECT_EQ(FormatGpuUuid("\xab"), "ab");
}

TEST(NoDeviceAllocatorTest, SaysTheDaemonHasNoDriver) {
  NoDeviceAllocator none("cannot load libcuda.so.1");
  absl::StatusOr<int> found = none.FindDevice(kUuid0);
  EXPECT_EQ(found.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(found.status().message(),
              HasSubstr("CUDA parameters but this daemon has no CUDA driver "
                        "(cannot load libcuda.so.1)"));
  EXPECT_EQ(none.Allocate(0, 4096).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(FakeDeviceAllocatorTest, FindsDevicesByUuid) {
  FakeDeviceAllocator fake({kUuid0, kUuid1});
  EXPECT_EQ(*fake.FindDevice(kUuid1), 1);
  absl::StatusOr<int> missing = fake.FindDevice(std::string(16, '\x02'));
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(),
              HasSubstr("GPU-02020202-0202-0202-0202-020202020202 is not "
                        "visible to the daemon"));
}

TEST(FakeDeviceAllocatorTest, RejectsBadRequestsAndReportsExhaustion) {
  FakeDeviceAllocator fake({kUuid0});
  EXPECT_EQ(fake.Allocate(1, 4096).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(fake.Allocate(0, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  fake.FailNextAllocation();
  EXPECT_EQ(fake.Allocate(0, 4096).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(fake.Allocate(0, 4096).ok());
}

TEST(FakeDeviceAllocatorTest, ExportedMemoryCrossesASocketAndIsReleased) {
  FakeDeviceAllocator fake({kUuid0});
  absl::StatusOr<std::unique_ptr<DeviceMemoryInterface>> mem =
      fake.Allocate(0, 5000);
  ASSERT_TRUE(mem.ok()) << mem.status();
  EXPECT_EQ(fake.live_allocations(), 1);
  EXPECT_GE((*mem)->size(), 5000u);
  EXPECT_EQ((*mem)->device(), 0);

  int sv[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
  UniqueFd daemon_end(sv[0]), trainer_end(sv[1]);
  absl::StatusOr<UniqueFd> exported = (*mem)->Export();
  ASSERT_TRUE(exported.ok()) << exported.status();
  ASSERT_TRUE(SendWithFds(daemon_end.get(), "device", {exported->get()}).ok());
  absl::StatusOr<ReceivedMessage> got =
      ReceiveWithFds(trainer_end.get(), 16, 1, std::chrono::milliseconds(5000));
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->fds.size(), 1u);
  absl::StatusOr<Mapping> trainer_view =
      Mapping::Map(got->fds[0].get(), (*mem)->size());
  ASSERT_TRUE(trainer_view.ok()) << trainer_view.status();

  // The trainer writes a gradient; the daemon reads it at its own address.
  float grad = 2.5f;
  std::memcpy(static_cast<char*>(trainer_view->data()) + 256, &grad, 4);
  float seen = 0;
  std::memcpy(&seen, reinterpret_cast<char*>((*mem)->address()) + 256, 4);
  EXPECT_EQ(seen, 2.5f);

  mem->reset();
  EXPECT_EQ(fake.live_allocations(), 0);
}

}  // namespace
}  // namespace gradd
