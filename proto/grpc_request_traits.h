// How gRPC reads the protobuf messages of gradd's services and stubs: like
// gRPC's own protobuf SerializationTraits, except for what the caller gets
// when a message does not parse.
//
// Why: a proto3 `string` field must hold UTF-8, and protobuf refuses to
// parse a message where one does not. gRPC's sync server answers that
// refusal with INTERNAL and an empty message, so a trainer that sent a
// parameter name with a stray byte read "INTERNAL" and nothing else (issue
// 20). Here the message is first walked for string fields that are not
// UTF-8, and the first one is named: INVALID_ARGUMENT "AttachRequest.
// params[3].name is not valid UTF-8: byte 5 is 0xFF (...)". Any other parse
// failure is INVALID_ARGUMENT too ("... is not a valid gradd.v1.
// AttachRequest"). What a valid request's strings may hold (control
// characters, lengths) is checked at the daemon's edge
// (server/rpc/request_checks.h).
//
// How: SerializationTraits is gRPC's customisation point for message
// types, and gRPC's generated code (1.51) instantiates it for
// protobuf::MessageLite, the common base of every message (its method
// handlers and stubs take <..., MessageLite, MessageLite>), so that is the
// type specialised here. proto/CMakeLists.txt has grpc_cpp_plugin include
// this header in every generated *.grpc.pb.h (additional_header_includes),
// so each translation unit that instantiates gRPC's call code for gradd's
// services sees the specialisation first. Serializing is gRPC's own.
#ifndef GRADD_PROTO_GRPC_REQUEST_TRAITS_H_
#define GRADD_PROTO_GRPC_REQUEST_TRAITS_H_

#include "absl/strings/string_view.h"
#include "google/protobuf/message.h"
#include "google/protobuf/message_lite.h"
#include "grpcpp/impl/codegen/proto_utils.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/status.h"

namespace gradd {

// Parses `buffer` into `message` (clearing the buffer, as gRPC's own traits
// do): OK, or INVALID_ARGUMENT naming the first string field that is not
// UTF-8, or saying that the bytes are not a valid message of its type. A
// message without descriptors (protobuf-lite) gets gRPC's own parse.
grpc::Status ParseMessage(grpc::ByteBuffer* buffer,
                          google::protobuf::MessageLite* message);

// The same over serialized bytes (tests, fuzzing).
grpc::Status ParseRequestBytes(absl::string_view wire,
                               google::protobuf::Message* message);

}  // namespace gradd

namespace grpc {

template <>
class SerializationTraits<protobuf::MessageLite, void> {
 public:
  static Status Serialize(const protobuf::MessageLite& message,
                          ByteBuffer* buffer, bool* own_buffer) {
    return GenericSerialize<ProtoBufferWriter, protobuf::MessageLite>(
        message, buffer, own_buffer);
  }
  static Status Deserialize(ByteBuffer* buffer,
                            protobuf::MessageLite* message) {
    return ::gradd::ParseMessage(buffer, message);
  }
};

}  // namespace grpc

#endif  // GRADD_PROTO_GRPC_REQUEST_TRAITS_H_
