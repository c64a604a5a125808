#!/usr/bin/env bash
# The one command a device call runs, from the repository root, on a GPU machine without network:
#
#   OUT=<folder> bash benchmarks/device/run.sh            # run.log, figures.json, profile*.txt into $OUT
#   OUT=<folder> DEVICE=cpu TINY=1 bash benchmarks/device/run.sh    # dry run of every step on a CPU
#
# Installs the wheels benchmarks/device/fetch_wheels.sh put in .whl/ (what the device image lacks) into
# $SITE, runs the project from this working tree through PYTHONPATH (no install), then the steps of
# benchmarks/device/run.py within its budget (under 8 minutes). Exit status 0 when every step is ok.
# Optional: PYTHON (default python3), WORK (default a fresh temporary folder), WHEELS (default .whl),
# SITE (default /tmp/site), TIME_SCALE (multiplies every time limit; default 1), ONLY (step names to run, e.g.
# ONLY="gpu_step_gpt_compile gpu_step_t5_compile" in a second call).
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:?OUT must name the folder for the log and the figures}
python=${PYTHON:-python3}
wheels=${WHEELS:-.whl}
site=${SITE:-/tmp/site}
mkdir -p "$out"
work=${WORK:-$(mktemp -d)}

if compgen -G "$wheels/*.whl" >/dev/null; then
  "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" \
    "$wheels"/*.whl 2>&1 | tee -a "$out/run.log" || exit 1
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

options=()
[ "${TINY:-0}" = 1 ] && options+=(--tiny)
# shellcheck disable=SC2206 # ONLY is a list of step names
[ -n "${ONLY:-}" ] && options+=(--only $ONLY)
exec "$python" -m benchmarks.device.run --out "$out" --work "$work" --device "${DEVICE:-cuda}" \
  --time-scale "${TIME_SCALE:-1}" "${options[@]}"
