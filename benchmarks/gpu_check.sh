#!/usr/bin/env bash
# benchmarks/gpu_check.py on a machine whose Python lacks some of minidist's dependencies and has no network
# (the workplace's H200): wheels carried in .whl/ (see benchmarks/README.md, "GPU") are installed
# into /tmp/gpu_check_site first; the mpich wheel's mpiexec and libmpi are put on PATH / LD_LIBRARY_PATH.
set -u
cd "$(dirname "$0")/.." || exit 2
PY=${PYTHON:-python3}
WHEELS=${GPU_CHECK_WHEELS:-.whl}  # the folder of carried wheels
if ls "$WHEELS"/*.whl >/dev/null 2>&1; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --prefix /tmp/gpu_check_site "$WHEELS"/*.whl || exit 2
  site=$(echo /tmp/gpu_check_site/lib/python3*/site-packages)
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}" PATH="/tmp/gpu_check_site/bin:$PATH"
  export LD_LIBRARY_PATH="/tmp/gpu_check_site/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
exec "$PY" benchmarks/gpu_check.py "$@"
