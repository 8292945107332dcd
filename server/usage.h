// `gradd --help` and `gradd --version`.
//
// absl's own --help lists flags only from files named like the program and
// exits 1; operators and scripts expect a list of every daemon flag and
// exit 0. The daemon's flags are the ones defined in `flags_file` (main.cc),
// printed with their dashed names (`--log-level`, which main also accepts)
// and defaults.
#ifndef GRADD_SERVER_USAGE_H_
#define GRADD_SERVER_USAGE_H_

#include <optional>
#include <ostream>
#include <string>

#include "absl/strings/string_view.h"

namespace gradd {

// "gradd 0.1.0" (project version, gradd/version.h).
std::string VersionText();

// The usage line, `description`, then every flag defined in a file whose
// path ends with `flags_file`, sorted by name.
std::string UsageText(absl::string_view usage, absl::string_view description,
                      absl::string_view flags_file);

// If argv (before "--") holds --help / -h or --version: prints the text to
// `out` and returns the exit code (0); otherwise nullopt.
std::optional<int> HandleHelpOrVersion(int argc, char** argv,
                                       absl::string_view usage,
                                       absl::string_view description,
                                       absl::string_view flags_file,
                                       std::ostream& out);

}  // namespace gradd

#endif  // GRADD_SERVER_USAGE_H_
