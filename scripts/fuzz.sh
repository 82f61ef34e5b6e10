#!/usr/bin/env bash
# Runs every coverage-guided fuzz target (fuzz/fuzz_targets/*.rs) for SECONDS each (default 60),
# keeping each target's corpus in fuzz/corpus/TARGET (seeded from fuzz/seeds/TARGET), and prints
# per target libFuzzer's executions, the corpus size and whether it found a crash (the input is
# then in fuzz/artifacts/TARGET/; replay it with `fuzz/target/*/release/TARGET FILE`).
#
# It builds the targets with the nightly toolchain and the flags cargo-fuzz uses (coverage
# counters, compare tracing, `--cfg fuzzing`), plus debug assertions, without a sanitizer (our
# code is safe Rust; twice the executions), so nothing needs installing; `cargo +nightly fuzz run
# --fuzz-dir fuzz TARGET` works on the same crate too.
# Usage: scripts/fuzz.sh [SECONDS] [TARGET...]
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=${1:-60}
shift || true
case "$seconds" in
    ''|*[!0-9]*) echo "usage: scripts/fuzz.sh [SECONDS] [TARGET...] (SECONDS a whole number)" >&2; exit 2 ;;
esac

if ! rustup run nightly rustc --version >/dev/null 2>&1; then
    echo "fuzz: the nightly toolchain is missing (rustup toolchain install nightly)" >&2
    exit 2
fi
triple=$(rustup run nightly rustc -vV | sed -n 's/^host: //p')

targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
    for file in fuzz/fuzz_targets/*.rs; do
        targets+=("$(basename "$file" .rs)")
    done
fi
for target in "${targets[@]}"; do
    [ -f "fuzz/fuzz_targets/$target.rs" ] || { echo "fuzz: no target $target (fuzz/fuzz_targets/)" >&2; exit 2; }
done

echo "== build ${#targets[@]} fuzz targets (nightly, $triple)"
bins=()
for target in "${targets[@]}"; do bins+=(--bin "$target"); done
# --target keeps the instrumentation off build scripts and proc macros.
RUSTFLAGS="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares -Cllvm-args=-sanitizer-coverage-stack-depth \
-Cllvm-args=-simplifycfg-branch-fold-threshold=0 --cfg fuzzing -Cdebug-assertions -Ccodegen-units=1" \
    cargo +nightly build --release --manifest-path fuzz/Cargo.toml --target-dir fuzz/target \
    --target "$triple" "${bins[@]}"

mkdir -p fuzz/logs
failed=0
for target in "${targets[@]}"; do
    corpus=fuzz/corpus/$target
    artifacts=fuzz/artifacts/$target
    mkdir -p "$corpus" "$artifacts"
    seeds=()
    [ -d "fuzz/seeds/$target" ] && seeds=("fuzz/seeds/$target")
    log=fuzz/logs/$target.log
    set +e
    "fuzz/target/$triple/release/$target" -artifact_prefix="$artifacts/" -max_total_time="$seconds" \
        -max_len=4096 -rss_limit_mb=2048 -timeout=10 -print_final_stats=1 "$corpus" "${seeds[@]}" >"$log" 2>&1
    status=$?
    set -e
    runs=$(grep -oE '^stat::number_of_executed_units: *[0-9]+' "$log" | grep -oE '[0-9]+$' || echo 0)
    size=$(find "$corpus" -type f | wc -l)
    if [ "$status" -eq 0 ]; then
        echo "fuzz: $target: $runs executions in $seconds s, corpus $size inputs, no crash"
    else
        failed=$((failed + 1))
        echo "fuzz: $target: FAILED after $runs executions (exit $status); the log is $log:"
        grep -E 'panicked|ERROR|SUMMARY|Test unit written' "$log" | head -20 || tail -20 "$log"
    fi
done
echo "fuzz: ${#targets[@]} targets, $failed failed"
[ "$failed" -eq 0 ]
