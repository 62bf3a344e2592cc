#!/usr/bin/env bash
# Run the shim's real-GPU checks on a GPU machine: build the shim in place, then pytest.
#   tests/gpu/run.sh            (PYTHON=... to pick the interpreter that has CUDA PyTorch)
# Uses a venv that sees the system's packages (a CUDA build of torch, if installed), so
# nothing is downloaded; the shim is compiled by setuptools from shim/ (needs cc).
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON=${PYTHON:-python3}
VENV=${VENV:-/tmp/seedance-gpu-venv}
echo "== host"; nvidia-smi -L 2>/dev/null || echo "nvidia-smi: not available"
if [ ! -x "$VENV/bin/python" ]; then "$PYTHON" -m venv --system-site-packages "$VENV"; fi
"$VENV/bin/python" -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -3 || {
  echo "pip install -e . failed; building the shim standalone"; "$VENV/bin/python" shim/build_shim.py shim/libseedance_shim.so; }
for dep in pyyaml cffi pytest; do "$VENV/bin/python" -c "import ${dep/pyyaml/yaml}" 2>/dev/null || echo "missing python package: $dep"; done
echo "== torch"; "$VENV/bin/python" -c "import torch; print(torch.__version__, torch.cuda.is_available(), torch.cuda.device_count())" || true
echo "== tests"
exec "$VENV/bin/python" -m pytest -v -rs tests/gpu/test_shim_gpu.py tests/gpu/test_profile_gpu.py "$@"
