#!/usr/bin/env bash
# One bounded libFuzzer run (ctest's fuzz.<name>, tests/fuzz/CMakeLists.txt):
#
#   run_fuzzer.sh FUZZER SECONDS WORKDIR INPUT_DIR...
#
# Replays every INPUT_DIR that exists (the seed corpus, the regressions),
# then fuzzes for
# SECONDS. New inputs go to WORKDIR/corpus (kept between runs, never in the
# source tree); a crash is saved in WORKDIR/crashes/ and the run fails,
# saying how to make it a regression input.
set -euo pipefail
fuzzer="$1" seconds="$2" work="$3"
shift 3
mkdir -p "${work}/corpus" "${work}/crashes"
inputs=()
for dir in "$@"; do
  if [[ -d "$dir" ]]; then inputs+=("$dir"); fi
done
# Leaks are reported by the replays under scripts/test --sanitize.
status=0
"$fuzzer" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
  -max_len=16384 -print_final_stats=1 -detect_leaks=0 \
  -artifact_prefix="${work}/crashes/" "${work}/corpus" "${inputs[@]}" ||
  status=$?
if ((status != 0)); then
  name="$(basename "$fuzzer" _fuzzer)"
  echo "[fuzz] ${name} failed (exit ${status}); the input is in" \
    "${work}/crashes/. Fix the bug, then copy the input to" \
    "tests/fuzz/regressions/${name}/ so every build replays it (when it" \
    "already is one of those, the bug it records is back)." >&2
fi
exit "$status"
