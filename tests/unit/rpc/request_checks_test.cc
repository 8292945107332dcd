// The daemon's edge: client strings in parsed requests
// (server/rpc/request_checks.h) and requests that do not parse because a
// string is not UTF-8 (proto/grpc_request_traits.h).
#include "server/rpc/request_checks.h"

#include <string>

#include "gmock/gmock.h"
#include "gradd/v1/admin.pb.h"
#include "gradd/v1/node.grpc.pb.h"
#include "gtest/gtest.h"
#include "proto/grpc_request_traits.h"

namespace gradd {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

v1::AttachRequest Attach() {
  v1::AttachRequest r;
  r.set_job_id("job");
  r.set_local_world_size(1);
  for (const char* name : {"w", "b", "c"}) {
    v1::ParamSpec* p = r.add_params();
    p->set_name(name);
    p->add_shape(2);
  }
  // bytes: binary, never checked.
  r.mutable_cuda_device()->set_uuid(std::string("\0\n\xff", 3));
  return r;
}

TEST(CheckRequestStringsTest, GoodRequestsPass) {
  EXPECT_TRUE(CheckRequestStrings(Attach()).ok());
  v1::AttachRequest r = Attach();
  r.set_node_id(
      "n\xc3\xb6"
      "de-1");
  r.set_coordinator("[::1]:29600");
  r.mutable_comm_hook()->set_name("powerSGD");
  EXPECT_TRUE(CheckRequestStrings(r).ok());
  EXPECT_TRUE(CheckRequestStrings(v1::GetStatusRequest()).ok());
}

TEST(CheckRequestStringsTest, NamesTheFieldPath) {
  struct Case {
    void (*set)(v1::AttachRequest*);
    const char* message;
  };
  for (const Case& c : std::vector<Case>{
           {[](v1::AttachRequest* r) { r->set_job_id("a\nb"); },
            "AttachRequest.job_id 'a\\nb' contains control character U+000A"},
           {[](v1::AttachRequest* r) {
              r->mutable_params(2)->set_name("c\x1b");
            },
            "AttachRequest.params[2].name 'c\\x1b' contains control character "
            "U+001B at byte 1"},
           {[](v1::AttachRequest* r) { r->set_node_id(std::string(257, 'n')); },
            "AttachRequest.node_id is 257 bytes; the limit is 256"},
           {[](v1::AttachRequest* r) {
              r->set_coordinator(std::string(1025, 'h'));
            },
            "AttachRequest.coordinator is 1025 bytes; the limit is 1024"},
           {[](v1::AttachRequest* r) {
              r->mutable_comm_hook()->set_name(std::string(65, 'k'));
            },
            "AttachRequest.comm_hook.name is 65 bytes; the limit is 64"},
           {[](v1::AttachRequest* r) {
              r->mutable_params(0)->set_name(std::string(4097, 'p'));
            },
            "AttachRequest.params[0].name is 4097 bytes; the limit is 4096"},
       }) {
    v1::AttachRequest r = Attach();
    c.set(&r);
    absl::Status s = CheckRequestStrings(r);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.message;
    EXPECT_THAT(std::string(s.message()), HasSubstr(c.message));
  }
  v1::CommHookSetRequest hook;
  hook.mutable_hook()->set_name("fp16\t");
  EXPECT_THAT(std::string(CheckRequestStrings(hook).message()),
              HasSubstr("CommHookSetRequest.hook.name"));
  v1::GetTraceRequest trace;
  trace.set_job_id(std::string(300, 'j'));
  EXPECT_THAT(std::string(CheckRequestStrings(trace).message()),
              HasSubstr("GetTraceRequest.job_id is 300 bytes"));
}

// What arrives on the wire: protobuf would refuse these requests with no
// word on why (gRPC: INTERNAL, empty message).
std::string Wire(const google::protobuf::Message& m) {
  std::string out;
  EXPECT_TRUE(m.SerializePartialToString(&out));
  return out;
}

TEST(ParseRequestTest, NamesTheFieldThatIsNotUtf8) {
  v1::AttachRequest r = Attach();
  r.mutable_params(1)->set_name("bias\xff\xfe");
  // protobuf logs its own complaint when serializing this; it is expected.
  const std::string wire = Wire(r);
  v1::AttachRequest parsed;
  grpc::Status s = ParseRequestBytes(wire, &parsed);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(),
              AllOf(HasSubstr("AttachRequest.params[1].name is not valid "
                              "UTF-8: byte 4 is 0xFF"),
                    HasSubstr("'bias\\xff\\xfe'")));

  v1::AttachRequest hook = Attach();
  hook.mutable_comm_hook()->set_name("\xc0\xaf");
  s = ParseRequestBytes(Wire(hook), &parsed);
  EXPECT_THAT(s.error_message(),
              HasSubstr("AttachRequest.comm_hook.name is not valid UTF-8"));

  v1::GetJobRequest job;
  job.set_job_id("\x80");
  v1::GetJobRequest job_parsed;
  s = ParseRequestBytes(Wire(job), &job_parsed);
  EXPECT_THAT(s.error_message(),
              HasSubstr("GetJobRequest.job_id is not valid UTF-8: byte 0"));
}

TEST(ParseRequestTest, ParsesGoodRequestsAndRefusesGarbage) {
  v1::AttachRequest r = Attach();
  r.set_node_id("n\xc3\xb6");
  v1::AttachRequest parsed;
  ASSERT_TRUE(ParseRequestBytes(Wire(r), &parsed).ok());
  EXPECT_EQ(parsed.SerializeAsString(), r.SerializeAsString());

  // A length running past the end.
  grpc::Status s = ParseRequestBytes(std::string("\x0a\x7f"
                                                 "abc",
                                                 5),
                                     &parsed);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(),
              HasSubstr("not a valid gradd.v1.AttachRequest"));
}

// Through gRPC's own entry point: generated service code reads requests
// through the traits of MessageLite, their common base.
TEST(ParseRequestTest, GrpcTraitsUseIt) {
  v1::AttachRequest r = Attach();
  r.set_job_id("j\xff");
  const std::string wire = Wire(r);
  grpc::Slice slice(wire);
  grpc::ByteBuffer buffer(&slice, 1);
  v1::AttachRequest parsed;
  grpc::Status s =
      grpc::SerializationTraits<grpc::protobuf::MessageLite>::Deserialize(
          &buffer, &parsed);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("AttachRequest.job_id"));
}

}  // namespace
}  // namespace gradd
