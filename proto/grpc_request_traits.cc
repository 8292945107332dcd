#include "proto/grpc_request_traits.h"

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/client_strings.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "google/protobuf/wire_format_lite.h"
#include "grpcpp/impl/codegen/proto_buffer_reader.h"

namespace gradd {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::internal::WireFormatLite;
using google::protobuf::io::CodedInputStream;

// As deep as protobuf itself parses (its default recursion limit).
constexpr int kMaxDepth = 100;
// How much of a bad string the message quotes.
constexpr size_t kQuotedBytes = 64;

// The first string field of `type` (at any depth) whose bytes are not
// UTF-8, as "<path> is not valid UTF-8 ...", or nullopt: none, or the bytes
// are not a well-formed message (the strict parse then says so). `path` is
// the field path so far ("params[3]."). Reads `in` up to its current limit.
std::optional<std::string> FindNonUtf8Field(CodedInputStream* in,
                                            const Descriptor& type,
                                            const std::string& path,
                                            int depth) {
  if (depth > kMaxDepth) return std::nullopt;
  // Occurrences so far of each repeated field, for its index.
  absl::flat_hash_map<int, int> seen;
  while (true) {
    const uint32_t tag = in->ReadTag();
    if (tag == 0) return std::nullopt;  // end, limit or malformed
    const FieldDescriptor* field =
        type.FindFieldByNumber(WireFormatLite::GetTagFieldNumber(tag));
    const bool nested =
        field != nullptr && (field->type() == FieldDescriptor::TYPE_STRING ||
                             field->type() == FieldDescriptor::TYPE_MESSAGE);
    if (!nested || WireFormatLite::GetTagWireType(tag) !=
                       WireFormatLite::WIRETYPE_LENGTH_DELIMITED) {
      if (!WireFormatLite::SkipField(in, tag)) return std::nullopt;
      continue;
    }
    std::string name = absl::StrCat(path, field->name());
    if (field->is_repeated()) {
      absl::StrAppend(&name, "[", seen[field->number()]++, "]");
    }
    uint32_t length = 0;
    if (!in->ReadVarint32(&length)) return std::nullopt;
    if (field->type() == FieldDescriptor::TYPE_STRING) {
      std::string value;
      if (!in->ReadString(&value, static_cast<int>(length))) {
        return std::nullopt;
      }
      const size_t bad = FindInvalidUtf8(value);
      if (bad == absl::string_view::npos) continue;
      const absl::string_view shown =
          absl::string_view(value).substr(0, kQuotedBytes);
      return absl::StrFormat("%s is not valid UTF-8: byte %d is 0x%02X ('%s%s)",
                             name, bad, static_cast<uint8_t>(value[bad]),
                             EscapeForLog(shown),
                             shown.size() < value.size() ? "'..." : "'");
    }
    if (length > static_cast<uint32_t>(INT32_MAX)) return std::nullopt;
    const CodedInputStream::Limit limit =
        in->PushLimit(static_cast<int>(length));
    std::optional<std::string> found = FindNonUtf8Field(
        in, *field->message_type(), absl::StrCat(name, "."), depth + 1);
    if (found.has_value()) return found;
    // Read to its end, not stopped by a malformed byte or the depth.
    if (!in->ConsumedEntireMessage()) return std::nullopt;
    in->PopLimit(limit);
  }
}

grpc::Status Parse(google::protobuf::io::ZeroCopyInputStream* walk_input,
                   google::protobuf::io::ZeroCopyInputStream* parse_input,
                   google::protobuf::Message* message) {
  const Descriptor& type = *message->GetDescriptor();
  {
    CodedInputStream in(walk_input);
    std::optional<std::string> bad =
        FindNonUtf8Field(&in, type, absl::StrCat(type.name(), "."), 0);
    if (bad.has_value()) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, *bad);
    }
  }
  if (!message->ParseFromZeroCopyStream(parse_input)) {
    return grpc::Status(
        grpc::StatusCode::INVALID_ARGUMENT,
        absl::StrCat("the message is not a valid ", type.full_name(),
                     " (malformed protobuf encoding)"));
  }
  return grpc::Status::OK;
}

}  // namespace

grpc::Status ParseMessage(grpc::ByteBuffer* buffer,
                          google::protobuf::MessageLite* message) {
  auto* full = dynamic_cast<google::protobuf::Message*>(message);
  if (full == nullptr) {
    return grpc::GenericDeserialize<grpc::ProtoBufferReader,
                                    google::protobuf::MessageLite>(buffer,
                                                                   message);
  }
  if (buffer == nullptr) {
    return grpc::Status(grpc::StatusCode::INTERNAL, "No payload");
  }
  grpc::Status result;
  {
    // Two readers over the same slices: reading does not consume them.
    grpc::ProtoBufferReader walk(buffer);
    grpc::ProtoBufferReader parse(buffer);
    if (!walk.status().ok()) return walk.status();
    if (!parse.status().ok()) return parse.status();
    result = Parse(&walk, &parse, full);
  }
  buffer->Clear();
  return result;
}

grpc::Status ParseRequestBytes(absl::string_view wire,
                               google::protobuf::Message* message) {
  google::protobuf::io::ArrayInputStream walk(wire.data(),
                                              static_cast<int>(wire.size()));
  google::protobuf::io::ArrayInputStream parse(wire.data(),
                                               static_cast<int>(wire.size()));
  return Parse(&walk, &parse, message);
}

}  // namespace gradd
