// The rendezvous store's bounds (server/rendezvous/kv_store.h): every limit
// refuses with the config key in the message, memory stays within
// max_total_bytes whatever a client stores, formation rounds are rate
// limited per job, a round's keys go when its nodes release it, and a job
// nobody touches is dropped after its TTL. Time is a fake clock.
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gradd/v1/rendezvous.pb.h"
#include "gtest/gtest.h"
#include "server/engine/formation/node_formation.h"
#include "server/rendezvous/kv_store.h"

namespace gradd {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

std::string Message(const absl::Status& s) { return std::string(s.message()); }

class KvStoreLimitsTest : public ::testing::Test {
 protected:
  KvStore::Options Options() {
    KvStore::Options o;
    o.clock = [this] { return now_; };
    return o;
  }
  absl::Time now_ = absl::FromUnixSeconds(1000000);
};

TEST_F(KvStoreLimitsTest, KeyAndValueSizesAreRefusedNamingTheLimit) {
  KvStore::Options o = Options();
  o.max_key_bytes = 16;
  o.max_value_bytes = 100;
  KvStore store(o);
  const absl::Status key = store.Set("job", std::string(17, 'k'), "v");
  EXPECT_EQ(key.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(key), HasSubstr("rendezvous.limits.max_key_bytes = 16"));
  const absl::Status job = store.Set(std::string(17, 'j'), "k", "v");
  EXPECT_THAT(Message(job), HasSubstr("job id"));
  const absl::Status value = store.Set("job", "k", std::string(101, 'x'));
  EXPECT_EQ(value.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(Message(value),
              HasSubstr("rendezvous.limits.max_value_bytes = 100"));
  EXPECT_TRUE(store.Set("job", "k", std::string(100, 'x')).ok());
  EXPECT_EQ(store.Add("job", std::string(17, 'c'), 1).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(KvStoreLimitsTest, KeysAndBytesPerJobAreBounded) {
  KvStore::Options o = Options();
  o.max_keys_per_job = 3;
  KvStore store(o);
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(store.Set("job", absl::StrCat("k", i), "v").ok());
  }
  const absl::Status s = store.Set("job", "k3", "v");
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(Message(s), AllOf(HasSubstr("already holds 3 keys"),
                                HasSubstr("max_keys_per_job = 3")));
  EXPECT_EQ(store.Add("job", "counter", 1).status().code(),
            absl::StatusCode::kResourceExhausted);
  // Overwriting an existing key is not a new key; other jobs have their own.
  EXPECT_TRUE(store.Set("job", "k0", "w").ok());
  EXPECT_TRUE(store.Set("other", "k3", "v").ok());
  // A deleted key frees its place.
  ASSERT_TRUE(*store.Delete("job", "k1"));
  EXPECT_TRUE(store.Set("job", "k3", "v").ok());

  KvStore::Options b = Options();
  b.max_value_bytes = 1000;
  b.max_job_bytes = 2500;
  KvStore bytes(b);
  ASSERT_TRUE(bytes.Set("job", "a", std::string(1000, 'x')).ok());
  ASSERT_TRUE(bytes.Set("job", "b", std::string(1000, 'x')).ok());
  const absl::Status over = bytes.Set("job", "c", std::string(1000, 'x'));
  EXPECT_EQ(over.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(Message(over),
              HasSubstr("rendezvous.limits.max_job_bytes = 2500"));
  // Growing a value is counted too; shrinking one frees bytes.
  EXPECT_FALSE(bytes.Set("job", "x", std::string(900, 'x')).ok());
  ASSERT_TRUE(bytes.Set("job", "a", "small").ok());
  EXPECT_TRUE(bytes.Set("job", "c", std::string(900, 'x')).ok());
}

// The bloating attack: clients store as much as they can, in as many jobs
// as they like; the store never holds more than max_total_bytes.
TEST_F(KvStoreLimitsTest, MemoryStaysWithinTheTotalWhateverClientsStore) {
  KvStore::Options o = Options();
  o.max_value_bytes = 1 << 20;
  o.max_job_bytes = 4 << 20;
  o.max_total_bytes = 16 << 20;
  KvStore store(o);
  int refused = 0;
  for (int job = 0; job < 16; ++job) {
    for (int k = 0; k < 16; ++k) {
      const absl::Status s =
          store.Set(absl::StrCat("job", job), absl::StrCat("k", k),
                    std::string(1 << 20, 'x'));
      if (!s.ok()) {
        ++refused;
        EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
        EXPECT_THAT(Message(s), HasSubstr("rendezvous.limits.max_"));
      }
      EXPECT_LE(store.TotalBytes(), o.max_total_bytes);
    }
  }
  EXPECT_GT(refused, 200);
  EXPECT_GE(store.TotalBytes(), o.max_total_bytes - (2 << 20));
  const absl::Status total =
      store.Set("fresh-job", "k", std::string(1 << 20, 'x'));
  EXPECT_THAT(Message(total),
              HasSubstr("rendezvous.limits.max_total_bytes = 16777216"));
  // Tiny keys are charged their overhead, so they cannot get around it.
  KvStore::Options tiny = Options();
  tiny.max_total_bytes =
      100 * (KvStore::kKeyOverheadBytes + 8) + KvStore::kJobOverheadBytes + 3;
  KvStore small(tiny);
  int stored = 0;
  while (small.Set("job", absl::StrFormat("k%07d", stored), "").ok()) {
    ++stored;
  }
  EXPECT_EQ(stored, 100);
  EXPECT_LE(small.TotalBytes(), tiny.max_total_bytes);
  // Deleting gives everything back.
  for (int i = 0; i < stored; ++i) {
    ASSERT_TRUE(*small.Delete("job", absl::StrFormat("k%07d", i)));
  }
  EXPECT_EQ(small.TotalBytes(), 0u);
  EXPECT_EQ(small.NumJobs(), 0u);
}

// The attack that used up a job id's formation rounds: a client opening
// round after round is stopped at max_rounds_per_minute, for that job only,
// and may go on a minute later.
TEST_F(KvStoreLimitsTest, FormationRoundsPerJobPerMinuteAreLimited) {
  KvStore::Options o = Options();
  o.max_rounds_per_minute = 5;
  KvStore store(o);
  for (int k = 1; k <= 5; ++k) {
    ASSERT_TRUE(
        store.Set("job", absl::StrCat("round", k, "/closed"), "x").ok());
    // More keys of a round already started are not new rounds.
    ASSERT_TRUE(
        store.Set("job", absl::StrCat("round", k, "/member/a"), "").ok());
  }
  const absl::Status s = store.Set("job", "round6/closed", "x");
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(Message(s),
              AllOf(HasSubstr("started 5 formation rounds within the last "
                              "minute"),
                    HasSubstr("round 'round6'"),
                    HasSubstr("max_rounds_per_job_per_minute = 5")));
  EXPECT_EQ(store.Add("job", "round6/joined", 1).status().code(),
            absl::StatusCode::kResourceExhausted);
  // Keys without '/' belong to no round; other jobs are not affected.
  EXPECT_TRUE(store.Set("job", "plain", "x").ok());
  EXPECT_TRUE(store.Set("other", "round6/closed", "x").ok());
  now_ += absl::Seconds(61);
  EXPECT_TRUE(store.Set("job", "round6/closed", "x").ok());
}

TEST_F(KvStoreLimitsTest, ReleaseDeletesARoundOnceEveryNodeEndedIt) {
  KvStore store(Options());
  for (const char* k :
       {"round1/closed", "round1/member/a", "round1/member/b", "round1/slot/0",
        "round1/gloo/x", "round2/member/a", "rounds/probe"}) {
    ASSERT_TRUE(store.Set("job", k, "v").ok());
  }
  const size_t before = store.JobBytes("job");
  EXPECT_FALSE(*store.Release("job", "round1", "a", 2));
  EXPECT_FALSE(*store.Release("job", "round1", "a", 2));  // twice: one node
  EXPECT_TRUE(*store.Release("job", "round1", "b", 2));
  // The closed mark stays (OpenRound skips the round); the newer round and
  // other keys are untouched.
  EXPECT_TRUE(store.Get("job", "round1/closed", absl::ZeroDuration()).ok());
  EXPECT_FALSE(store.Get("job", "round1/member/a", absl::ZeroDuration()).ok());
  EXPECT_FALSE(
      store.Get("job", "round1/released/a", absl::ZeroDuration()).ok());
  EXPECT_TRUE(store.Get("job", "round2/member/a", absl::ZeroDuration()).ok());
  EXPECT_EQ(store.NumKeys("job"), 3u);
  EXPECT_LT(store.JobBytes("job"), before);
  // Unknown rounds and jobs: nothing to do.
  EXPECT_FALSE(*store.Release("job", "round9", "a", 1));
  EXPECT_FALSE(*store.Release("nojob", "round1", "a", 1));
  EXPECT_EQ(store.Release("job", "a/b", "a", 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store.Release("job", "round2", "a", 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store.Release("job", "round2", "", 1).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// The engine's rounds (server/engine/formation/node_formation.h) and the
// store's release agree: after a released round the next formation of the job
// meets in a fresh round, never in the deleted one.
TEST_F(KvStoreLimitsTest, AReleasedRoundIsNotOpenedAgain) {
  KvStore store(Options());
  absl::StatusOr<std::string> first = OpenRound(store, "job");
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(*first, "round1");
  ASSERT_TRUE(store.Set("job", "round1/member/a", "m").ok());
  CloseRound(store, "job", *first, "formed");
  ASSERT_TRUE(*store.Release("job", "round1", "a", 1));
  absl::StatusOr<std::string> next = OpenRound(store, "job");
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(*next, "round2");
}

// Where the default max_value_bytes (32 MiB) comes from: the largest value
// formation stores is a node's membership, whose model fingerprint grows
// with the parameters. For max_params (100,000) parameters with 64-byte
// names it is about 8 MiB, the bucket plan about 1 MiB: a 4x margin.
TEST_F(KvStoreLimitsTest, TheDefaultValueLimitFitsTheLargestFormationValues) {
  std::vector<ParamInfo> params;
  for (int i = 0; i < 100000; ++i) {
    std::string name = absl::StrFormat("model.layers.%05d.mlp.weight", i);
    name.resize(64, 'x');
    params.push_back(ParamInfo{name, {1024, 256}, DType::kFloat32});
  }
  v1::JobMember member;
  member.set_node_id(std::string(256, 'n'));
  member.set_requested_node_rank(-1);
  member.set_local_world_size(8);
  member.set_num_nodes(1024);
  for (const v1::ParamSpec& p : Fingerprint(params)) *member.add_params() = p;
  const size_t member_bytes = member.ByteSizeLong();
  absl::StatusOr<BucketPlan> plan = PlanBuckets(params, PlannerOptions{});
  ASSERT_TRUE(plan.ok()) << plan.status();
  const size_t plan_bytes = SerializePlan(*plan).size();
  std::cout << "largest formation values for 100000 parameters: membership "
            << member_bytes << " bytes, plan " << plan_bytes << " bytes\n";
  const size_t limit = KvStore::Options().max_value_bytes;
  EXPECT_LE(4 * member_bytes, limit);
  EXPECT_LE(4 * plan_bytes, limit);
  KvStore store(Options());
  EXPECT_TRUE(
      store.Set("job", "round1/member/n", member.SerializeAsString()).ok());
}

TEST_F(KvStoreLimitsTest, AJobNobodyTouchesIsDroppedAfterItsTtl) {
  KvStore::Options o = Options();
  o.job_ttl = absl::Hours(1);
  KvStore store(o);
  ASSERT_TRUE(
      store.Set("idle", "round1/member/a", std::string(1000, 'x')).ok());
  ASSERT_TRUE(store.Set("busy", "k", "v").ok());
  for (int i = 0; i < 6; ++i) {
    now_ += absl::Minutes(15);
    // Reading keeps a job alive as writing does.
    ASSERT_TRUE(store.Get("busy", "k", absl::ZeroDuration()).ok());
  }
  EXPECT_EQ(store.NumKeys("idle"), 0u);
  EXPECT_EQ(store.NumKeys("busy"), 1u);
  EXPECT_EQ(store.NumJobs(), 1u);
  EXPECT_LT(store.TotalBytes(), 1000u);
}

}  // namespace
}  // namespace gradd
