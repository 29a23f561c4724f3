#!/usr/bin/env bash
# Installs a built wheel (scripts/build_wheel.sh) into a fresh virtual
# environment where no Rust toolchain is on PATH, then runs the main job
# and a smoke test from it (not from this checkout).
#
#   scripts/test_wheel.sh [dist/ferrocaffe-*.whl]
set -euo pipefail
cd "$(dirname "$0")/.."
wheel="${1:-$(ls dist/ferrocaffe-*.whl | head -n 1)}"
wheel="$(cd "$(dirname "$wheel")" && pwd)/$(basename "$wheel")"
here="$(pwd)"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
python3 -m venv "$tmp/venv"
# Only the venv and the system's basic tools: no cargo, rustc or maturin.
export PATH="$tmp/venv/bin:/usr/bin:/bin"
if command -v cargo >/dev/null || command -v rustc >/dev/null; then
    echo "a Rust toolchain is still on PATH" >&2
    exit 1
fi
python -m pip install -q --disable-pip-version-check "$wheel" "scikit-learn>=1.3"
cd "$tmp"   # away from the checkout's python/ folder
python - <<'PY'
import numpy as np
import ferrocaffe
from ferrocaffe import core, workspace
assert ferrocaffe.__file__.startswith(__import__("sys").prefix), ferrocaffe.__file__
n = core.Net("smoke")
n.SumElements([n.Mul(["X", "X"], ["Y"])], ["L"])
n.AddGradientOperators(["L"])
workspace.FeedBlob("X", np.array([1.0, 2.0, 3.0], np.float32))
workspace.RunNetOnce(n)
np.testing.assert_allclose(workspace.FetchBlob("X_grad"), [2.0, 4.0, 6.0])
print("smoke test passed:", ferrocaffe.__version__, ferrocaffe.__file__)
PY
python "$here/examples/train_job.py" --workdir "$tmp/job" --epochs 5 --no-progress
echo "the wheel installs and runs without Rust: $(basename "$wheel")"
