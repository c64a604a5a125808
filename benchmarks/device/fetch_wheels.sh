#!/usr/bin/env bash
# Download the wheels benchmarks/device/run.sh installs on the GPU machine (no network there) into .whl/
# (git-ignored; carry it: `run` with carry [".whl"]). The packages and versions are in wheels.txt beside this
# script; --no-deps everywhere: wheels.txt names each missing dependency itself. A package published only as a
# source archive (pure Python) is built into a wheel here.
#
#   bash benchmarks/device/fetch_wheels.sh          # PYTHON=python3 by default; WHEELS=.whl by default
set -euo pipefail
cd "$(dirname "$0")/../.."
python=${PYTHON:-python3}
wheels=${WHEELS:-.whl}
mkdir -p "$wheels"
platforms=()
for platform in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64 \
                manylinux2014_x86_64 manylinux1_x86_64; do
  platforms+=(--platform "$platform")
done
grep -v -e '^#' -e '^$' benchmarks/device/wheels.txt | while read -r requirement; do
  if ! "$python" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
       "${platforms[@]}" -d "$wheels" "$requirement" 2>/dev/null; then
    # no wheel for the device: a pure-Python source archive, built here
    "$python" -m pip wheel -q --no-deps --no-binary=:all: -w "$wheels" "$requirement"
  fi
done
ls -l "$wheels"
