#include "server/usage.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "gradd/version.h"

namespace gradd {
namespace {

constexpr size_t kWidth = 80;
constexpr size_t kHelpIndent = 6;

// `text` broken into lines of at most kWidth columns, each indented.
std::string Wrap(absl::string_view text, size_t indent) {
  std::string out, line(indent, ' ');
  for (absl::string_view word : absl::StrSplit(text, ' ', absl::SkipEmpty())) {
    if (line.size() > indent && line.size() + 1 + word.size() > kWidth) {
      absl::StrAppend(&out, line, "\n");
      line.assign(indent, ' ');
    }
    if (line.size() > indent) line += ' ';
    absl::StrAppend(&line, word);
  }
  if (line.size() > indent) absl::StrAppend(&out, line, "\n");
  return out;
}

}  // namespace

std::string VersionText() {
  return absl::StrCat("gradd ", GRADD_VERSION_STRING);
}

std::string UsageText(absl::string_view usage, absl::string_view description,
                      absl::string_view flags_file) {
  std::vector<const absl::CommandLineFlag*> flags;
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (absl::EndsWith(flag->Filename(), flags_file)) flags.push_back(flag);
  }
  std::sort(flags.begin(), flags.end(),
            [](const auto* a, const auto* b) { return a->Name() < b->Name(); });
  std::string out = absl::StrCat("Usage: ", usage, "\n\n");
  absl::StrAppend(&out, Wrap(description, 0), "\nFlags:\n");
  for (const absl::CommandLineFlag* flag : flags) {
    const std::string name = absl::StrReplaceAll(flag->Name(), {{"_", "-"}});
    const std::string def = flag->DefaultValue();
    absl::StrAppend(&out, "  --", name,
                    def.empty() ? "" : absl::StrCat("  (default: ", def, ")"),
                    "\n", Wrap(flag->Help(), kHelpIndent));
  }
  absl::StrAppend(
      &out, "  --help, -h\n", Wrap("Print this help and exit", kHelpIndent),
      "  --version\n", Wrap("Print the version and exit", kHelpIndent));
  return out;
}

std::optional<int> HandleHelpOrVersion(int argc, char** argv,
                                       absl::string_view usage,
                                       absl::string_view description,
                                       absl::string_view flags_file,
                                       std::ostream& out) {
  for (int i = 1; i < argc; ++i) {
    const absl::string_view arg = argv[i];
    if (arg == "--") break;
    if (arg == "--help" || arg == "-h" || arg == "-help") {
      out << UsageText(usage, description, flags_file);
      return 0;
    }
    if (arg == "--version" || arg == "-version") {
      out << VersionText() << "\n";
      return 0;
    }
  }
  return std::nullopt;
}

}  // namespace gradd
