// GlooStore: Gloo's Store contract over the rendezvous store.
#include "server/rendezvous/gloo_store.h"

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "gloo/common/error.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/rendezvous/kv_store.h"
#include "server/rendezvous/rendezvous_client.h"
#include "server/rendezvous/rendezvous_service.h"

namespace gradd {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;

TEST(GlooStoreTest, SetGetWaitThroughServiceWithPrefix) {
  auto server = RendezvousServer::Start("127.0.0.1:0");
  ASSERT_TRUE(server.ok()) << server.status();
  RendezvousClient::Options options;
  options.address = (*server)->address();
  auto client = RendezvousClient::Create(options);
  ASSERT_TRUE(client.ok());
  GlooStore store(client->get(), "job", "gloo/7", 5000ms);

  std::vector<char> got;
  std::thread reader([&] { got = store.get("0"); });
  absl::SleepFor(absl::Milliseconds(200));
  const std::vector<char> value = {'a', '\0', 'b'};
  store.set("0", value);
  reader.join();
  EXPECT_EQ(got, value);
  // Stored under the prefix, in the job's namespace.
  EXPECT_EQ(*(*server)->store().Get("job", "gloo/7/0", absl::Seconds(1)),
            std::string("a\0b", 3));
  store.wait({"0"}, 100ms);
  EXPECT_EQ(store.Published("0"), value);
  EXPECT_FALSE(store.Published("1").has_value());
}

TEST(GlooStoreTest, ErrorsBecomeGlooIoExceptionsWithinTimeout) {
  KvStore kv;
  GlooStore store(&kv, "job", "gloo", 300ms);
  const absl::Time start = absl::Now();
  try {
    store.wait({"missing"}, 200ms);
    FAIL() << "wait did not throw";
  } catch (const gloo::IoException& e) {
    EXPECT_THAT(e.what(), HasSubstr("gloo/missing"));
    EXPECT_THAT(e.what(), HasSubstr("DEADLINE_EXCEEDED"));
  }
  EXPECT_THROW(store.get("missing"), gloo::IoException);
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  kv.Shutdown();
  EXPECT_THROW(store.get("other"), gloo::IoException);
}

}  // namespace
}  // namespace gradd
