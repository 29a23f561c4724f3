#!/usr/bin/env bash
# Runs the fuzzers for longer than CI does (tests/plan/test_properties.py: valid
# plans with exact counts, random and mutated protobuf bytes at every entry
# point that accepts them; tests/train/test_gradient_fuzz.py: random nets'
# gradients against central differences; and the Rust proptests of plan.rs).
#
#   scripts/fuzz.sh [SECONDS_PER_FUZZER] [PROPTEST_CASES]
#
# Each Python fuzzer keeps drawing fresh examples for SECONDS_PER_FUZZER
# (default 300); the Rust proptests run PROPTEST_CASES cases (default
# 20000). Any crash, hang, untyped error or broken invariant fails the run
# with hypothesis's (or proptest's) minimal failing example. Needs a built
# extension (scripts/dev_build.sh, or PROFILE=release for more examples).
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_PER_FUZZER="${1:-300}"
CASES="${2:-20000}"
FERROCAFFE_FUZZ_SECONDS="$SECONDS_PER_FUZZER" PYTHONPATH=python \
    python -m pytest -q -p no:cacheprovider tests/plan/test_properties.py \
    tests/train/test_gradient_fuzz.py
PROPTEST_CASES="$CASES" cargo test -p ferrocaffe --lib proptests
