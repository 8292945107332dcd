// Test-only TLS material: tests/tools/make_test_certs.sh run with openssl
// into a fresh temporary directory (nothing private is committed). See the
// script for the files it makes.
#ifndef GRADD_TESTS_UNIT_AUTH_TEST_CERTS_H_
#define GRADD_TESTS_UNIT_AUTH_TEST_CERTS_H_

#include <ftw.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "gtest/gtest.h"

namespace gradd::testing {

// The directory holding the certificates, or "" (with a test failure).
inline std::string MakeTestCerts() {
  char tmpl[] = "/tmp/gradd-certs-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) {
    ADD_FAILURE() << "mkdtemp failed";
    return "";
  }
  const std::string dir = tmpl;
  const std::string cmd = std::string("sh '") + GRADD_SOURCE_DIR +
                          "/tests/tools/make_test_certs.sh' '" + dir + "'";
  if (std::system(cmd.c_str()) != 0) {
    ADD_FAILURE() << "could not make test certificates (is openssl "
                     "installed?): "
                  << cmd;
    return "";
  }
  return dir;
}

// Removes `dir` and everything in it (test keys do not stay in /tmp).
inline void RemoveTree(const std::string& dir) {
  if (dir.empty()) return;
  nftw(
      dir.c_str(),
      [](const char* path, const struct stat*, int, struct FTW*) {
        return ::remove(path);
      },
      16, FTW_DEPTH | FTW_PHYS);
}

// Writes `text` to `path` with mode 0600; false (with a failure) if not.
inline bool WriteSecret(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
  out.close();
  if (!out) {
    ADD_FAILURE() << "cannot write " << path;
    return false;
  }
  return ::chmod(path.c_str(), 0600) == 0;
}

}  // namespace gradd::testing

#endif  // GRADD_TESTS_UNIT_AUTH_TEST_CERTS_H_
