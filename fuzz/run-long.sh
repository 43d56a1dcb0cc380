#!/usr/bin/env bash
# Runs the cargo-fuzz targets of fuzz/ one after another, each for a given time, starting from the
# seed corpus in fuzz/corpus/<target>/. New inputs go to a working corpus (fuzz/work/<target>/ by
# default, not tracked), so the seed corpus in the repository only changes when someone copies a
# finding into it on purpose. Crashing inputs land in fuzz/artifacts/<target>/; each one becomes a
# regression test (tests/fuzz_regressions.rs) or a corpus file, then is deleted.
#
#   fuzz/run-long.sh                      every target, 10 minutes each
#   fuzz/run-long.sh --seconds 3600 udp_relay client_query
#   fuzz/run-long.sh --seconds 6 --work /tmp/x   what CI runs (tests/run.sh)
#
#   fuzz/run-long.sh --build-only         build the targets, run nothing
#
# Builds with cargo itself, with the instrumentation cargo-fuzz passes (so cargo-fuzz need not be
# installed; `cargo fuzz run` builds the same targets its own way). There is no nightly toolchain
# here: RUSTC_BOOTSTRAP=1 lets stable rustc take AddressSanitizer's -Z flag.
set -euo pipefail
cd "$(dirname "$0")"

usage() {
    sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'
}

seconds=600
work=work
targets=()
build_only=""
jobs=1
while (($#)); do
    case $1 in
        --seconds) seconds=${2:?--seconds needs a number}; shift 2 ;;
        --work) work=${2:?--work needs a directory}; shift 2 ;;
        --jobs) jobs=${2:?--jobs needs a number}; shift 2 ;;
        --build-only) build_only=1; shift ;;
        -h | --help) usage; exit 0 ;;
        -*) echo "run-long.sh: unknown option $1" >&2; usage >&2; exit 2 ;;
        *) targets+=("$1"); shift ;;
    esac
done
[[ $seconds =~ ^[0-9]+$ ]] || { echo "run-long.sh: --seconds takes whole seconds, not $seconds" >&2; exit 2; }
export RUSTC_BOOTSTRAP=1
triple=$(rustc -vV | sed -n 's/^host: //p')
bin=target/$triple/release

# The targets: the [[bin]] sections of Cargo.toml.
mapfile -t all < <(awk '/^\[\[bin\]\]/ { b = 1; next } b && /^name/ { gsub(/.*= *"|"/, ""); print; b = 0 }' Cargo.toml)
if ((${#targets[@]} == 0)); then
    targets=("${all[@]}")
fi
for t in "${targets[@]}"; do
    printf '%s\n' "${all[@]}" | grep -qx "$t" || { echo "run-long.sh: no fuzz target $t (have: ${all[*]})" >&2; exit 2; }
done

started=$(date +%s)
# cargo-fuzz's flags (its project.rs) but for codegen-units=1, which it sets for the speed of long
# runs and which makes a build from scratch several times slower. --target keeps the flags off
# build scripts and proc-macros.
RUSTFLAGS="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares --cfg fuzzing \
-Cllvm-args=-simplifycfg-branch-fold-threshold=0 -Zsanitizer=address \
-Cllvm-args=-sanitizer-coverage-stack-depth ${RUSTFLAGS:-}" \
    cargo build --locked --release --target "$triple" --bins
export ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_odr_violation=0
echo "fuzz: built ${#all[@]} targets in $(($(date +%s) - started)) s"
[[ -z $build_only ]] || exit 0
echo "fuzz: running ${#targets[@]} for ${seconds} s each, $jobs at a time"

# One target: its verdict on stdout, its log in $work/<target>.log.
one() {
    local t=$1 log="$work/$1.log"
    mkdir -p "$work/$t" "artifacts/$t"
    # -timeout: one input taking over 10 s is a hang; -rss_limit_mb: over 2 GiB is unbounded
    # growth (the daemon lives in a 128 MiB slice). The seed corpus is read, never written.
    if "$bin/$t" -artifact_prefix="artifacts/$t/" -max_total_time="$seconds" -timeout=10 \
        -rss_limit_mb=2048 -print_final_stats=1 "$work/$t" "corpus/$t" >"$log" 2>&1; then
        runs=$(grep -o 'stat::number_of_executed_units: [0-9]*' "$log" | grep -o '[0-9]*$' || echo '?')
        cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | grep -o '[0-9]*$' || echo '?')
        echo "fuzz: $t: ok, $runs runs, coverage $cov"
    else
        [[ $log = /* ]] || log=$PWD/$log
        echo "fuzz: $t: FAILED (log: $log)"
        grep -E 'panicked at|ERROR: libFuzzer|ERROR: AddressSanitizer|SUMMARY|Test unit written to' "$log" | head -8 | sed 's/^/    /'
    fi
}
export -f one
export work seconds bin
results=$(printf '%s\n' "${targets[@]}" | xargs -P "$jobs" -I{} bash -c 'one {}')
echo "$results"
mapfile -t failed < <(sed -n 's/^fuzz: \([^:]*\): FAILED.*/\1/p' <<<"$results")
echo "fuzz: done in $(($(date +%s) - started)) s"
if ((${#failed[@]})); then
    echo "fuzz: crashes in ${failed[*]}; reproduce with: fuzz/target/$triple/release/<target> fuzz/artifacts/<target>/<file>" >&2
    exit 1
fi
