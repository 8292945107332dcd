// Names of the client API renamed to the engine's glossary
// (server/engine/README.md: "join" is only uneven inputs) keep working for
// one release and warn where they are used: these tests compile small
// programs against the public headers with the project's own C and C++
// compilers, once as they are (they build) and once with
// -Werror=deprecated-declarations (they fail, and the message names the
// new name). Linking and calling are covered by the C trainer
// (tests/integration/c_trainer.c calls gradd_rejoined and gradd_restarted).
#include <sys/wait.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/temp_dir.h"

namespace gradd {
namespace {

using ::testing::HasSubstr;

struct Compiled {
  int status = -1;
  std::string output;
};

// Compiles `source` (written to `file` in a fresh temp dir) with `compiler`
// and `flags`, syntax only.
Compiled Compile(const std::string& compiler, const std::string& file,
                 const std::string& source, const std::string& flags) {
  testing::TempDir dir("gradd-deprecated-names-");
  const std::string path = dir.path() + "/" + file;
  std::ofstream(path) << source;
  const std::string command = compiler + " -fsyntax-only " + flags +
                              " -I" GRADD_CLIENT_INCLUDE_DIR
                              " -I" GRADD_CLIENT_GENERATED_INCLUDE_DIR " " +
                              path + " 2>&1";
  Compiled out;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), pipe)) > 0) out.output.append(buf, n);
  const int status = pclose(pipe);
  out.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return out;
}

constexpr char kCSource[] = R"(#include "gradd/gradd.h"
int restarted_twice(const gradd_client* c) {
  return gradd_rejoined(c) + gradd_restarted(c);
}
)";

constexpr char kCxxSource[] = R"(#include "gradd/client.h"
bool restarted_twice(const gradd::Client& c) {
  return c.rejoined() && c.restarted();
}
)";

TEST(DeprecatedNamesTest, COldNameBuildsAndWarnsNamingTheNewOne) {
  Compiled plain = Compile(GRADD_C_COMPILER, "old.c", kCSource, "-std=c11");
  EXPECT_EQ(plain.status, 0) << plain.output;
  EXPECT_THAT(plain.output, HasSubstr("gradd_rejoined"));
  Compiled strict = Compile(GRADD_C_COMPILER, "old.c", kCSource,
                            "-std=c11 -Werror=deprecated-declarations");
  EXPECT_NE(strict.status, 0) << strict.output;
  EXPECT_THAT(strict.output, HasSubstr("use gradd_restarted"));
}

TEST(DeprecatedNamesTest, CxxOldNameBuildsAndWarnsNamingTheNewOne) {
  Compiled plain =
      Compile(GRADD_CXX_COMPILER, "old.cc", kCxxSource, "-std=c++17");
  EXPECT_EQ(plain.status, 0) << plain.output;
  EXPECT_THAT(plain.output, HasSubstr("rejoined"));
  Compiled strict = Compile(GRADD_CXX_COMPILER, "old.cc", kCxxSource,
                            "-std=c++17 -Werror=deprecated-declarations");
  EXPECT_NE(strict.status, 0) << strict.output;
  EXPECT_THAT(strict.output, HasSubstr("use restarted()"));
}

TEST(DeprecatedNamesTest, NewNamesBuildWithoutWarnings) {
  Compiled c = Compile(GRADD_C_COMPILER, "new.c",
                       "#include \"gradd/gradd.h\"\n"
                       "int f(const gradd_client* c) { return "
                       "gradd_restarted(c); }\n",
                       "-std=c11 -Werror");
  EXPECT_EQ(c.status, 0) << c.output;
  Compiled cxx = Compile(GRADD_CXX_COMPILER, "new.cc",
                         "#include \"gradd/client.h\"\n"
                         "bool f(const gradd::Client& c) { return "
                         "c.restarted(); }\n",
                         "-std=c++17 -Werror");
  EXPECT_EQ(cxx.status, 0) << cxx.output;
}

}  // namespace
}  // namespace gradd
