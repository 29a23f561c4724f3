#!/usr/bin/env bash
# Builds the release wheel an index would take: abi3 (CPython >= 3.10),
# manylinux_2_28 x86_64 (glibc 2.28 and later: linked against that glibc's
# symbols by maturin's zig-based cross-linking, then checked by maturin's
# built-in auditwheel), symbols stripped. The wheel lands in dist/.
#
#   scripts/build_wheel.sh            # needs Rust; fetches maturin and ziglang from PyPI
#   scripts/test_wheel.sh dist/*.whl  # installs it where no Rust is and runs it
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q "maturin>=1.9.4,<2" "ziglang>=0.13"
rm -rf dist
python3 -m maturin build --release --strip --zig \
    --compatibility manylinux_2_28 --out dist
ls -l dist/*.whl
