// Temporary directories for tests, unit and integration alike: made under
// /tmp (not $TMPDIR: the tests put Unix sockets in them, whose paths must
// stay short) and removed with everything in them.
//
// Here rather than in common/: it fakes no interface of the project, and
// common/ is built into the daemon and the client library.
#ifndef GRADD_TESTS_SUPPORT_TEMP_DIR_H_
#define GRADD_TESTS_SUPPORT_TEMP_DIR_H_

#include <ftw.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>

#include "gtest/gtest.h"

namespace gradd::testing {

// A fresh directory "/tmp/<prefix>XXXXXX"; "" (with a test failure naming
// the reason) if it cannot be made.
inline std::string MakeTempDir(const std::string& prefix) {
  std::string path = "/tmp/" + prefix + "XXXXXX";
  if (mkdtemp(path.data()) == nullptr) {
    ADD_FAILURE() << "mkdtemp " << path << ": " << std::strerror(errno);
    return "";
  }
  return path;
}

// Removes `dir` and everything in it ("" does nothing).
inline void RemoveTree(const std::string& dir) {
  if (dir.empty()) return;
  nftw(
      dir.c_str(),
      [](const char* path, const struct stat*, int, struct FTW*) {
        return ::remove(path);
      },
      16, FTW_DEPTH | FTW_PHYS);
}

// MakeTempDir's directory, removed (RemoveTree) when this goes.
class TempDir {
 public:
  explicit TempDir(const std::string& prefix) : path_(MakeTempDir(prefix)) {}
  ~TempDir() { RemoveTree(path_); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  // "" when it could not be made (the test has failed already).
  const std::string& path() const { return path_; }
  // Keeps the directory: whoever holds the path removes it.
  std::string Release() { return std::exchange(path_, ""); }

 private:
  std::string path_;
};

}  // namespace gradd::testing

#endif  // GRADD_TESTS_SUPPORT_TEMP_DIR_H_
