// Jobs with CUDA parameters, without a GPU: the JobManager over a
// FakeDeviceAllocator (host memfds standing in for device memory). The
// attach checks (no driver, no GPU named, a GPU the daemon cannot see, a
// driver mismatch), the device-aware plan, the fifth fd carrying each
// rank's device memory, and the engine averaging CUDA buckets through it
// (the fake's memory is host memory, so the host reducer runs them).
#include <sys/mman.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common/fake_device_memory.h"
#include "common/shm.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/config.h"
#include "server/engine/manager/job_manager.h"
#include "server/engine/reduce/device_reducer.h"
#include "tests/unit/engine/manager/fake_session_registry.h"
#include "tests/unit/engine/manager/test_rank.h"

namespace gradd {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

const std::string kGpu0(16, '\xa0');
const std::string kGpu1(16, '\xa1');

class DeviceJobTest : public ::testing::Test {
 protected:
  void SetUp() override {
    config_ = DefaultConfig();
    config_.set_attach_timeout_ms(10000);
  }
  void TearDown() override {
    if (manager_) manager_->Stop();
  }
  JobManager& manager(DeviceAllocatorInterface* devices) {
    if (!manager_) {
      manager_ = std::make_unique<JobManager>(
          config_, &sessions_, &pool_, nullptr, nullptr, nullptr, devices);
      sessions_.set_observer(manager_.get());
    }
    return *manager_;
  }

  // "w" (CUDA, 1000 floats) and "b" (CUDA, 8 halves), plus a CPU one.
  v1::AttachRequest Request(int rank, int world, const std::string& gpu,
                            int driver_version = 13000) {
    v1::AttachRequest req =
        MakeRequest("gpu-job", rank, world, sessions_.Open(),
                    {{"w", {10, 100}}, {"b", {8}, v1::FLOAT16}, {"c", {4}}});
    req.mutable_params(0)->set_device(v1::DEVICE_CUDA);
    req.mutable_params(1)->set_device(v1::DEVICE_CUDA);
    req.mutable_cuda_device()->set_ordinal(rank);
    req.mutable_cuda_device()->set_uuid(gpu);
    req.mutable_cuda_device()->set_driver_version(driver_version);
    return req;
  }

  v1::DaemonConfig config_;
  ThreadPool pool_{2};
  FakeSessionRegistry sessions_;
  std::unique_ptr<JobManager> manager_;
};

TEST_F(DeviceJobTest, DaemonWithoutCudaSaysSo) {
  absl::StatusOr<v1::AttachResponse> r =
      StartAttach(manager(nullptr), Request(0, 1, kGpu0))->Get();
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(r.status().message(),
              HasSubstr("CUDA parameters but this daemon has no CUDA driver"));
  EXPECT_THAT(r.status().message(), HasSubstr("local rank 0 of job 'gpu-job'"));
}

TEST_F(DeviceJobTest, CudaParametersNeedAGpu) {
  FakeDeviceAllocator fake({kGpu0});
  v1::AttachRequest req = Request(0, 1, kGpu0);
  req.clear_cuda_device();
  absl::StatusOr<v1::AttachResponse> r =
      StartAttach(manager(&fake), std::move(req))->Get();
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(
      r.status().message(),
      HasSubstr("parameter 'w' is on CUDA but the attach names no GPU"));
}

TEST_F(DeviceJobTest, AGpuTheDaemonCannotSeeIsNamed) {
  FakeDeviceAllocator fake({kGpu0});
  absl::StatusOr<v1::AttachResponse> r =
      StartAttach(manager(&fake), Request(1, 2, kGpu1))->Get();
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(r.status().message(),
              HasSubstr("local rank 1 of job 'gpu-job', device cuda:1 "
                        "(GPU-a1a1a1a1-a1a1-a1a1-a1a1-a1a1a1a1a1a1): GPU "
                        "GPU-a1a1a1a1-a1a1-a1a1-a1a1-a1a1a1a1a1a1 is not "
                        "visible to the daemon"));
}

TEST_F(DeviceJobTest, ADriverMismatchIsRefused) {
  FakeDeviceAllocator fake({kGpu0}, /*driver_version=*/12080);
  absl::StatusOr<v1::AttachResponse> r =
      StartAttach(manager(&fake), Request(0, 1, kGpu0, 13000))->Get();
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(r.status().message(),
              HasSubstr("the trainer's CUDA driver is version 13000 but the "
                        "daemon's is 12080"));
}

TEST_F(DeviceJobTest, ModelsOnDifferentDevicesDoNotMatch) {
  FakeDeviceAllocator fake({kGpu0});
  auto a = StartAttach(manager(&fake), Request(0, 2, kGpu0));
  v1::AttachRequest other = Request(1, 2, kGpu0);
  other.mutable_params(0)->set_device(v1::DEVICE_CPU);
  auto b = StartAttach(manager(&fake), std::move(other));
  absl::StatusOr<v1::AttachResponse> r = a->Get();
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(),
              HasSubstr("parameter 0 is 'w' [10, 100] float32 on cuda on "
                        "local rank 0 but 'w' [10, 100] float32 on local "
                        "rank 1"));
  EXPECT_FALSE(b->Get().ok());
}

// Two ranks sharing one (fake) GPU for 100 iterations: each rank's CUDA
// buckets arrive as a fifth fd, the plan keeps CUDA and CPU parameters in
// separate buckets and memories, and every value is the average.
// Device memory counts against max_job_memory_bytes with the shared memory:
// a job whose shared memory alone fits but whose device buckets do not is
// refused, naming both.
TEST_F(DeviceJobTest, DeviceMemoryCountsAgainstTheJobLimit) {
  // Shared: a page of CPU buckets per rank; device: "w" and "b" (each
  // padded to 256 bytes, 4352 rounded up to two pages) per rank. 3 pages
  // fit the shared memory of both ranks but not the device memory too.
  config_.set_max_job_memory_bytes(3 * 4096);
  FakeDeviceAllocator fake({kGpu0});
  std::vector<std::shared_ptr<PendingAttach>> pending;
  for (int r = 0; r < 2; ++r) {
    pending.push_back(StartAttach(manager(&fake), Request(r, 2, kGpu0)));
  }
  for (int r = 0; r < 2; ++r) {
    absl::StatusOr<v1::AttachResponse> resp = pending[r]->Get();
    EXPECT_EQ(resp.status().code(), absl::StatusCode::kResourceExhausted)
        << resp.status();
    EXPECT_THAT(resp.status().message(),
                AllOf(HasSubstr("job 'gpu-job' needs 8192 bytes of shared "
                                "memory (4096 x 2 ranks) and 16384 bytes of "
                                "device memory (8192 x 2 ranks)"),
                      HasSubstr("max_job_memory_bytes) is 12288")));
  }
  EXPECT_EQ(fake.live_allocations(), 0);
}

TEST_F(DeviceJobTest, TwoRanksOnOneGpuAverageThroughDeviceMemory) {
  FakeDeviceAllocator fake({kGpu0});
  const int world = 2;
  std::vector<std::shared_ptr<PendingAttach>> pending;
  std::vector<uint64_t> sessions;
  for (int r = 0; r < world; ++r) {
    v1::AttachRequest req = Request(r, world, kGpu0);
    sessions.push_back(req.session_id());
    pending.push_back(StartAttach(manager(&fake), std::move(req)));
  }
  std::vector<std::unique_ptr<TestRank>> ranks;
  std::vector<Mapping> device;
  for (int r = 0; r < world; ++r) {
    absl::StatusOr<v1::AttachResponse> resp = pending[r]->Get();
    ASSERT_TRUE(resp.ok()) << resp.status();
    ASSERT_GT(resp->device_memory_bytes(), 0u);
    FakeSessionRegistry::Sent sent = sessions_.TakeSent(sessions[r]);
    ASSERT_EQ(sent.fds.size(), 5u);
    absl::StatusOr<Mapping> m =
        Mapping::Map(sent.fds[4].get(), resp->device_memory_bytes());
    ASSERT_TRUE(m.ok()) << m.status();
    device.push_back(*std::move(m));
    ranks.push_back(
        std::make_unique<TestRank>(r, sessions[r], *resp, std::move(sent)));
  }
  EXPECT_EQ(fake.live_allocations(), world);
  const v1::AttachResponse& plan = ranks[0]->response();
  ASSERT_EQ(plan.buckets_size(), 3);  // float16 cuda, float32 cuda, cpu
  auto base = [&](int r, int b) -> char* {
    const v1::BucketSpec& s = plan.buckets(b);
    return (s.device() == v1::DEVICE_CUDA ? static_cast<char*>(device[r].data())
                                          : ranks[r]->memory()) +
           s.offset();
  };
  int cuda_buckets = 0;
  for (const v1::BucketSpec& s : plan.buckets()) {
    cuda_buckets += s.device() == v1::DEVICE_CUDA;
    for (int p : s.param_indices()) {
      EXPECT_EQ(s.device(), p == 2 ? v1::DEVICE_CPU : v1::DEVICE_CUDA);
    }
  }
  EXPECT_EQ(cuda_buckets, 2);

  for (uint64_t it = 1; it <= 100; ++it) {
    for (int r = 0; r < world; ++r) {
      for (int b = 0; b < plan.buckets_size(); ++b) {
        const v1::BucketSpec& s = plan.buckets(b);
        if (s.dtype() != v1::FLOAT32) continue;
        float* f = reinterpret_cast<float*>(base(r, b));
        for (size_t i = 0; i < s.size_bytes() / 4; ++i) {
          f[i] = static_cast<float>(r * 2 + it + i % 7);
        }
      }
      for (int b = 0; b < plan.buckets_size(); ++b) ranks[r]->Publish(b, it);
    }
    for (int r = 0; r < world; ++r) {
      ASSERT_TRUE(ranks[r]->WaitAllDone(it)) << ranks[r]->Error();
    }
    for (int r = 0; r < world; ++r) {
      for (int b = 0; b < plan.buckets_size(); ++b) {
        const v1::BucketSpec& s = plan.buckets(b);
        if (s.dtype() != v1::FLOAT32) continue;
        const float* f = reinterpret_cast<const float*>(base(r, b));
        for (size_t i = 0; i < s.size_bytes() / 4; ++i) {
          // (it + i%7 + it + 2 + i%7) / 2
          ASSERT_EQ(f[i], static_cast<float>(it + i % 7 + 1))
              << "rank " << r << " bucket " << b << " element " << i
              << " iteration " << it;
        }
      }
    }
  }
  for (int r = 0; r < world; ++r) {
    ASSERT_TRUE(Detach(manager(&fake), "gpu-job", r, sessions[r]).ok());
  }
  ranks.clear();
  manager_->Stop();
  EXPECT_EQ(fake.live_allocations(), 0);
}

// What the device reducer is given of a job (JobSpec::device_spec,
// reduce/device_reducer.h): the job's description, its global world size
// resolved the way the job resolves it.
TEST(DeviceJobSpecTest, CarriesWhatTheDeviceReducerNeeds) {
  FakeDeviceAllocator fake({kGpu0, kGpu1});
  JobSpec spec;
  spec.job_id = "gpu-job";
  spec.local_world_size = 2;
  spec.params = {ParamInfo{"w", {10, 100}, DType::kFloat32, DeviceKind::kCuda},
                 ParamInfo{"c", {4}, DType::kFloat32, DeviceKind::kCpu}};
  absl::StatusOr<BucketPlan> plan = PlanBuckets(spec.params, PlannerOptions{});
  ASSERT_TRUE(plan.ok()) << plan.status();
  spec.plan = *plan;
  spec.devices = &fake;
  spec.rank_devices = {1, 0};
  spec.collective_timeout = std::chrono::milliseconds(1234);
  // One node: the world is the local one.
  EXPECT_EQ(spec.device_spec().world_size, 2);

  spec.node_rank = 1;
  spec.num_nodes = 3;
  spec.world_size = 6;
  spec.nccl_between_nodes = std::make_shared<NcclJobSetup>();
  const DeviceJobSpec d = spec.device_spec();
  EXPECT_EQ(d.job_id, "gpu-job");
  EXPECT_EQ(d.local_world_size, 2);
  EXPECT_EQ(d.node_rank, 1);
  EXPECT_EQ(d.num_nodes, 3);
  EXPECT_EQ(d.world_size, 6);
  ASSERT_EQ(d.params.size(), 2u);
  EXPECT_EQ(d.params[0].name, "w");
  EXPECT_EQ(d.params[0].device, DeviceKind::kCuda);
  EXPECT_EQ(d.plan.buckets.size(), spec.plan.buckets.size());
  EXPECT_EQ(d.plan.device_bytes, spec.plan.device_bytes);
  EXPECT_EQ(d.devices, &fake);
  EXPECT_EQ(d.rank_devices, (std::vector<int>{1, 0}));
  EXPECT_EQ(d.collective_timeout, std::chrono::milliseconds(1234));
  EXPECT_EQ(d.nccl_between_nodes, spec.nccl_between_nodes);
}

// A device reducer only for CUDA parameters in device memory the host
// cannot address; host-addressable fakes keep the host reducer as is.
TEST(DeviceJobSpecTest, OnlyCudaParametersOnRealDevicesGetADeviceReducer) {
  FakeDeviceAllocator fake({kGpu0});
  const std::vector<ParamInfo> cuda = {
      {"w", {4}, DType::kFloat32, DeviceKind::kCuda},
      {"c", {4}, DType::kFloat32, DeviceKind::kCpu}};
  const std::vector<ParamInfo> cpu = {
      {"c", {4}, DType::kFloat32, DeviceKind::kCpu}};
  EXPECT_TRUE(HasCudaParams(cuda));
  EXPECT_FALSE(HasCudaParams(cpu));
  EXPECT_TRUE(UsesDeviceReducer(cuda, nullptr));
  EXPECT_FALSE(UsesDeviceReducer(cuda, &fake));
  EXPECT_FALSE(UsesDeviceReducer(cpu, nullptr));

  DeviceJobSpec spec;
  spec.job_id = "cpu-job";
  spec.params = cpu;
  auto host = std::make_unique<FusedReducer>(nullptr, 1);
  BucketReducerInterface* const host_ptr = host.get();
  absl::StatusOr<std::unique_ptr<BucketReducerInterface>> wrapped =
      WrapDeviceReducer(spec, std::move(host));
  ASSERT_TRUE(wrapped.ok()) << wrapped.status();
  EXPECT_EQ(wrapped->get(), host_ptr);
}

}  // namespace
}  // namespace gradd
