"""The `gradd` command of the Python package (its console script):

    gradd run [torchrun's flags] script.py ...   -> the launcher (gradd.run)
    gradd [the daemon's flags]                   -> the daemon itself (exec)

Why one command with a dispatcher, and where the daemon is: the daemon is a
C++ executable that `cmake --install` puts in bin/gradd (systemd's unit,
the Docker image and the DaemonSet run it by that path) and also in
libexec/gradd/gradd. The wheel's `gradd` script may land in the same bin/
(pip into the same prefix) and replace the first copy; everything that ran
`gradd [FLAGS]` still gets the daemon, because this script execs it
(the same process: systemd's Type=notify and signals are unaffected), found
as $GRADD_BINARY, the build tree's, or an ELF `gradd` / libexec/gradd/gradd
beside a PATH directory. Without the wheel, `python3 -m gradd.run` is the
same launcher.
"""
from __future__ import annotations

import os
import sys
from typing import List, Optional


def main(argv: Optional[List[str]] = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args and args[0] == "run":
        from gradd.run import main as run_main

        return run_main(args[1:])
    from gradd.run._daemon import find_binary

    binary = find_binary(None)
    if binary is None:
        print("gradd: the gradd daemon executable is not installed (cmake --install puts it "
              "in bin/ and libexec/gradd/; or set GRADD_BINARY); `gradd run` launches "
              "training", file=sys.stderr)
        return 127
    os.execv(binary, [binary, *args])
    return 127  # not reached


if __name__ == "__main__":
    sys.exit(main())
