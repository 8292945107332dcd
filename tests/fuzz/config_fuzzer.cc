// The config loader: YAML text -> gradd.v1.DaemonConfig (server/config.h),
// as gradd reads --config. Properties: no crash, hang or sanitizer report
// for any text; a refusal is INVALID_ARGUMENT; a config that parses and
// validates prints (ConfigToText, --print-config) to text that parses back
// to the same config (the printed form is documented to be usable as a
// config file).
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"
#include "google/protobuf/util/message_differencer.h"
#include "server/config.h"
#include "server/logging.h"
#include "tests/fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const bool quiet = [] {
    // Config warnings would flood the fuzzer's output.
    return gradd::InitLogging("off", gradd::LogDestination::kStderr).ok();
  }();
  (void)quiet;
  const absl::string_view text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<gradd::v1::DaemonConfig> parsed =
      gradd::ParseConfigYaml(text, "<fuzz>");
  if (!parsed.ok()) {
    FUZZ_CHECK(parsed.status().code() == absl::StatusCode::kInvalidArgument,
               parsed.status().ToString());
    return 0;
  }
  gradd::v1::DaemonConfig config = *std::move(parsed);
  gradd::ApplyConfigDefaults(&config);
  if (!gradd::ValidateConfig(config).ok()) return 0;

  const std::string printed = gradd::ConfigToText(config);
  absl::StatusOr<gradd::v1::DaemonConfig> again =
      gradd::ParseConfigYaml(printed, "<printed>");
  FUZZ_CHECK(again.ok(), again.status().ToString() + "\nprinted:\n" + printed);
  gradd::ApplyConfigDefaults(&*again);
  FUZZ_CHECK(google::protobuf::util::MessageDifferencer::Equals(config, *again),
             "printed:\n" + printed + "\nreads back as:\n" +
                 gradd::ConfigToText(*again));
  return 0;
}
