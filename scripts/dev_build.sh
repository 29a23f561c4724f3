#!/usr/bin/env bash
# Fast debug build of the extension, placed where `PYTHONPATH=python` finds it.
# (For installs use `pip install .`; this is for the edit-test loop only.)
# The extension is the crate rust/python (package ferrocaffe-python); the
# pure core (rust/core) is built as its dependency.
set -euo pipefail
cd "$(dirname "$0")/.."
PYO3_BUILD_EXTENSION_MODULE=1 cargo build -p ferrocaffe-python ${PROFILE:+--profile "$PROFILE"} "$@"
# Copy then rename: a running process that has the old library mapped keeps it.
cp "target/${PROFILE:-debug}/libferrocaffe_python.so" python/ferrocaffe/.core.so.tmp
mv -f python/ferrocaffe/.core.so.tmp python/ferrocaffe/_core.abi3.so
