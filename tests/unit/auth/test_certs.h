// Test-only TLS material: tests/tools/make_test_certs.sh run with openssl
// into a fresh temporary directory (nothing private is committed; remove it
// with RemoveTree, tests/support/temp_dir.h). See the script for the files
// it makes.
#ifndef GRADD_TESTS_UNIT_AUTH_TEST_CERTS_H_
#define GRADD_TESTS_UNIT_AUTH_TEST_CERTS_H_

#include <sys/stat.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "gtest/gtest.h"
#include "tests/support/temp_dir.h"

namespace gradd::testing {

// The directory holding the certificates, or "" (with a test failure).
inline std::string MakeTestCerts() {
  TempDir temp("gradd-certs-");
  if (temp.path().empty()) return "";
  const std::string dir = temp.path();
  const std::string cmd = std::string("sh '") + GRADD_SOURCE_DIR +
                          "/tests/tools/make_test_certs.sh' '" + dir + "'";
  if (std::system(cmd.c_str()) != 0) {
    ADD_FAILURE() << "could not make test certificates (is openssl "
                     "installed?): "
                  << cmd;
    return "";
  }
  return temp.Release();
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
