#!/usr/bin/env bash
# The README's quick start against an installed (non-editable) minidist: .ci/run calls it with the wheel's
# environment first on PATH and from a folder outside the checkout. Fails if minidist is imported from the
# checkout, if a tool is missing from the wheel, or if the run does not end at the README's accuracy.
set -euo pipefail
REPO="$1"
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
where="$(python -c 'import minidist; print(minidist.__file__)')"
case "$where" in
    "$REPO"/minidist/*) echo "minidist was imported from the checkout ($where), not the wheel" >&2; exit 1 ;;
esac
echo "minidist from the wheel: $where"
minidist --version
minidist info
out="$(mpirun -n 8 python "$REPO/examples/train_ddp.py")"
echo "$out" | tail -n 3
echo "$out" | grep -q "final test accuracy: 0.9663" || { echo "the quick start did not end at 0.9663" >&2; exit 1; }
