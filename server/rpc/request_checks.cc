#include "server/rpc/request_checks.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/client_strings.h"
#include "google/protobuf/descriptor.h"

namespace gradd {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

// Requests nest a few levels; this only bounds a pathological message.
constexpr int kMaxDepth = 100;

size_t LimitOf(const FieldDescriptor& field) {
  const absl::string_view name = field.full_name();
  if (field.name() == "job_id") return kMaxJobIdBytes;
  if (name == "gradd.v1.ParamSpec.name") return kMaxParamNameBytes;
  if (name == "gradd.v1.AttachRequest.node_id") return kMaxNodeIdBytes;
  if (name == "gradd.v1.AttachRequest.coordinator") {
    return kMaxCoordinatorBytes;
  }
  if (name == "gradd.v1.CommHookSpec.name") return kMaxCommHookNameBytes;
  return kDefaultClientStringBytes;
}

absl::Status CheckMessage(const Message& message, const std::string& path,
                          int depth) {
  if (depth > kMaxDepth) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, " nests deeper than ", kMaxDepth, " messages"));
  }
  const Reflection& reflection = *message.GetReflection();
  std::vector<const FieldDescriptor*> fields;
  reflection.ListFields(message, &fields);  // set fields, by number
  for (const FieldDescriptor* field : fields) {
    const std::string name = absl::StrCat(path, field->name());
    if (field->type() == FieldDescriptor::TYPE_STRING) {
      const size_t limit = LimitOf(*field);
      std::string scratch;
      if (!field->is_repeated()) {
        const std::string& value =
            reflection.GetStringReference(message, field, &scratch);
        if (absl::Status s = CheckClientString(name, value, limit); !s.ok()) {
          return s;
        }
        continue;
      }
      const int n = reflection.FieldSize(message, field);
      for (int i = 0; i < n; ++i) {
        const std::string& value =
            reflection.GetRepeatedStringReference(message, field, i, &scratch);
        if (absl::Status s = CheckClientString(absl::StrCat(name, "[", i, "]"),
                                               value, limit);
            !s.ok()) {
          return s;
        }
      }
    } else if (field->type() == FieldDescriptor::TYPE_MESSAGE) {
      if (!field->is_repeated()) {
        if (absl::Status s = CheckMessage(reflection.GetMessage(message, field),
                                          absl::StrCat(name, "."), depth + 1);
            !s.ok()) {
          return s;
        }
        continue;
      }
      const int n = reflection.FieldSize(message, field);
      for (int i = 0; i < n; ++i) {
        if (absl::Status s =
                CheckMessage(reflection.GetRepeatedMessage(message, field, i),
                             absl::StrCat(name, "[", i, "]."), depth + 1);
            !s.ok()) {
          return s;
        }
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckRequestStrings(const google::protobuf::Message& request) {
  return CheckMessage(request,
                      absl::StrCat(request.GetDescriptor()->name(), "."), 0);
}

}  // namespace gradd
