#!/usr/bin/env bash
# Runs every fuzz target for the given number of seconds each (default 20) on
# stable Rust (no sanitizer) and prints one line per target with its execution
# count. Exits non-zero if any target finds a crash; the reproducer is left in
# fuzz/artifacts/<target>/.
#
#   fuzz/run.sh [seconds]
set -euo pipefail
secs="${1:-20}"
cd "$(dirname "$0")"
# The targets build stores in temporary directories and fsync them; on a
# memory file system fsync is free, so each second runs more inputs.
if [ -z "${TMPDIR:-}" ] && [ -d /dev/shm ] && [ -w /dev/shm ]; then
    export TMPDIR=/dev/shm
fi
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
targets=$(cargo fuzz list)
cargo fuzz build --sanitizer=none >/dev/null
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
status=0
summary=()
for t in $targets; do
    log="$logs/$t.log"
    if cargo fuzz run "$t" --sanitizer=none -- -max_total_time="$secs" -print_final_stats=1 >"$log" 2>&1; then
        result=ok
    else
        result=FAILED
        status=1
        tail -n 40 "$log" >&2
    fi
    # libFuzzer's final stats, else its "#N DONE" line.
    execs=$(sed -n 's/^stat::number_of_executed_units: *\([0-9]*\).*/\1/p' "$log" | tail -n 1)
    if [ -z "$execs" ]; then
        execs=$(sed -n 's/^#\([0-9]*\)[[:space:]]*DONE.*/\1/p' "$log" | tail -n 1)
    fi
    line="fuzz $t: ${execs:-?} executions in ${secs}s, $result"
    echo "$line"
    summary+=("$line")
done
exit "$status"
