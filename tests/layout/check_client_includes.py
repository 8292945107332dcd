#!/usr/bin/env python3
"""The include rule of the client library's components (client/src/*/).

client/src/ is split into component folders (docs/architecture.md, "The
client library", and each folder's README.md). A component's files may
include, besides their own folder's headers, only the headers of the
components listed for it in ALLOWED below, so the includes run one way:

    session ─► data ─► join
                 │
                 ├───► plan ─► device
                 └───────────► device
    api: the public headers only

What this script checks under client/src/ (ctest layout_client_includes):
  - every source file (.h, .cc, .cu) lies in a known component folder, and
    every component folder has a README.md;
  - an include of client library code spells its full path
    ("client/src/<component>/<file>.h"), so that the rule can be read off
    the line, and names a component that ALLOWED lets the includer use;
  - nothing includes the daemon's or the tools' code (server/, tools/,
    bench/, examples/, tests/, client/python/): the library links
    gradd_common and the protos only.

Everything else (common/, the public gradd/*.h and generated gradd/v1/*.pb.h,
absl, gRPC, system headers) is allowed everywhere.

  check_client_includes.py [--self-test] REPO_ROOT

--self-test first runs the rule over small trees that break it in each way
and fails unless every break is reported (and a clean tree passes).
Exit status: 0 clean, 1 violations, 2 usage.
"""

import argparse
import os
import re
import sys
import tempfile

SRC = os.path.join("client", "src")

# component -> the other components whose headers its files may include.
ALLOWED = {
    "api": set(),
    "session": {"data", "join", "plan", "device"},
    "data": {"join", "plan", "device"},
    "join": set(),
    "plan": {"device"},
    "device": set(),
}

# Include prefixes no client library file may use.
FORBIDDEN = ("server/", "tools/", "bench/", "examples/", "tests/",
             "client/python/")

SOURCE_SUFFIXES = (".h", ".cc", ".cu")
INCLUDE_RE = re.compile(r'^\s*#\s*include\s*([<"])([^">]+)[">]')


def _check_acyclic(allowed):
    """The rule itself must be one-way: no component reaches itself."""
    for start in allowed:
        seen, todo = set(), list(allowed[start])
        while todo:
            c = todo.pop()
            if c == start:
                return f"ALLOWED has a cycle through '{start}'"
            if c in seen:
                continue
            if c not in allowed:
                return f"ALLOWED names unknown component '{c}'"
            seen.add(c)
            todo.extend(allowed[c])
    return None


def check(root, allowed=ALLOWED):
    """Returns the list of violations (strings) under root/client/src."""
    problems = []
    src = os.path.join(root, SRC)
    if not os.path.isdir(src):
        return [f"{SRC}: not a directory under {root}"]
    cycle = _check_acyclic(allowed)
    if cycle:
        problems.append(cycle)
    for comp in sorted(allowed):
        folder = os.path.join(src, comp)
        if os.path.isdir(folder) and not os.path.isfile(
                os.path.join(folder, "README.md")):
            problems.append(f"{SRC}/{comp}/: no README.md (what the "
                            "component owns, its thread, what it may include)")
    for dirpath, dirnames, filenames in os.walk(src):
        dirnames.sort()
        rel_dir = os.path.relpath(dirpath, src)
        parts = [] if rel_dir == "." else rel_dir.split(os.sep)
        for name in sorted(filenames):
            if not name.endswith(SOURCE_SUFFIXES):
                continue
            rel = "/".join([SRC.replace(os.sep, "/")] + parts + [name])
            if not parts:
                problems.append(f"{rel}: a source file outside the component "
                                f"folders ({', '.join(sorted(allowed))})")
                continue
            comp = parts[0]
            if comp not in allowed:
                problems.append(f"{rel}: '{comp}' is not a client component; "
                                "add it to ALLOWED in "
                                "tests/layout/check_client_includes.py and to "
                                "docs/architecture.md")
                continue
            with open(os.path.join(dirpath, name), encoding="utf-8") as f:
                lines = f.read().splitlines()
            for number, line in enumerate(lines, 1):
                m = INCLUDE_RE.match(line)
                if not m:
                    continue
                problem = _check_include(comp, m.group(1), m.group(2), allowed)
                if problem:
                    problems.append(f"{rel}:{number}: {line.strip()}: "
                                    f"{problem}")
    return problems


def _check_include(comp, delimiter, path, allowed):
    if path.startswith(FORBIDDEN):
        return ("the client library must not include the daemon's, the "
                "tools' or the tests' code")
    if path.startswith("client/src/"):
        rest = path[len("client/src/"):].split("/")
        if len(rest) < 2:
            return ("client/src/ has no files at its top; include "
                    "client/src/<component>/<file>")
        target = rest[0]
        if target == comp:
            return None
        if target not in allowed:
            return f"'{target}' is not a client component"
        if target not in allowed[comp]:
            may = ", ".join(sorted(allowed[comp])) or "no other component"
            return (f"{comp}/ may not include {target}/ (it may include: "
                    f"{may}; docs/architecture.md)")
        return None
    if delimiter == '"' and "/" not in path:
        return ("spell the full path (client/src/<component>/" + path +
                ") so the include rule can be checked")
    return None


def self_test():
    """Runs check() over trees that break the rule; returns failures."""
    with tempfile.TemporaryDirectory(prefix="layout-client-") as scratch:
        return _self_test(scratch)


def _self_test(scratch):
    failures = []

    def tree(files):
        d = tempfile.mkdtemp(dir=scratch)
        for rel, text in files.items():
            path = os.path.join(d, SRC, rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
        return d

    readmes = {f"{c}/README.md": "x\n" for c in ALLOWED}
    clean = dict(readmes)
    clean.update({
        "device/dev.h": '#include "common/shm.h"\n#include <vector>\n',
        "plan/p.cc": '#include "client/src/plan/p.h"\n'
                     '#include "client/src/device/dev.h"\n',
        "data/d.cc": '#include "client/src/join/j.h"\n'
                     '#include "gradd/client.h"\n',
        "session/s.cc": '#include "client/src/data/d.h"\n'
                        '#include "gradd/v1/node.grpc.pb.h"\n',
        "api/c.cc": '#include "gradd/gradd.h"\n',
    })
    got = check(tree(clean))
    if got:
        failures.append(f"a clean tree was rejected: {got}")

    bad_cases = {
        "upward include": {"device/dev.cc": '#include "client/src/data/d.h"\n'},
        "sideways include": {"join/j.cc": '#include "client/src/plan/p.h"\n'},
        "api includes a component":
            {"api/c.cc": '#include "client/src/session/s.h"\n'},
        "bare include": {"data/d.cc": '#include "d.h"\n'},
        "daemon include": {"data/d.cc": '#include "server/engine/job.h"\n'},
        "daemon include with <>":
            {"plan/p.cc": '#include <server/config.h>\n'},
        "python include": {"data/d.cc": '#include "client/python/x.h"\n'},
        "file at the top": {"client.cc": "\n"},
        "unknown folder": {"misc/m.cc": "\n"},
        "unknown component included":
            {"data/d.cc": '#include "client/src/misc/m.h"\n'},
        "spaced directive": {"device/d.h": '  #  include "client/src/data/x.h"\n'},
    }
    for what, files in bad_cases.items():
        files = dict(files, **readmes)
        if not check(tree(files)):
            failures.append(f"not reported: {what}")
    no_readme = {"join/j.h": "\n"}
    if not check(tree(no_readme)):
        failures.append("not reported: a component without README.md")
    cyclic = dict(ALLOWED, device={"data"})
    if not check(tree(readmes), cyclic):
        failures.append("not reported: a cycle in the rule")
    return failures


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("root", help="the repository's root")
    parser.add_argument("--self-test", action="store_true",
                        help="first check that the rule catches every break")
    args = parser.parse_args()
    if args.self_test:
        failures = self_test()
        for f in failures:
            print(f"check_client_includes self-test: {f}", file=sys.stderr)
        if failures:
            return 1
        print("check_client_includes: self-test passed")
    problems = check(args.root)
    for p in problems:
        print(p, file=sys.stderr)
    if problems:
        print(f"check_client_includes: {len(problems)} violation(s) of the "
              "client include rule (docs/architecture.md)", file=sys.stderr)
        return 1
    print("check_client_includes: client/src follows the include rule")
    return 0


if __name__ == "__main__":
    sys.exit(main())
