#!/usr/bin/env bash
# Download the pure-Python wheels the H200 box lacks (Python 3.12, no network there) into .whl/.
# On the box: python3 -m pip install --no-index --no-deps --target /tmp/site .whl/*.whl
#             export PYTHONPATH=/tmp/site
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d .whl torchtitan==0.2.2 torchdata==0.11.0 tyro==1.0.17 docstring-parser==0.18.0 typeguard==4.6.1 \
  tomli==2.5.0 datasets==4.7.0 dill==0.4.0 multiprocess==0.70.18
ls .whl
