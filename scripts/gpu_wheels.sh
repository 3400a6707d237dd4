#!/usr/bin/env bash
# Download the wheels the H200 box lacks (Python 3.12, no network there) into .whl/: pure Python,
# plus torchao (an abi3 wheel; float8 linears).
# On the box: python3 -m pip install --no-index --no-deps --target /tmp/site .whl/*.whl
#             export PYTHONPATH=/tmp/site
#
# --tilelang: instead, the wheels of tilelang (fla's TileLang backend, needed to train gated_deltanet
# on Hopper with triton < 3.7.1; see docs/mixers.md) into .whl_tilelang/ and .whl_z3/.
# Two folders because the device tool carries at most 64 MiB per call, and tilelang (49.6 MB) and
# z3-solver (29.3 MB; tilelang's libtvm_compiler needs libz3) do not fit together. They go in two
# calls to one warm machine (/tmp persists while it is warm): call 1 carries .whl_tilelang and
# installs it into /tmp/site, call 2 carries .whl_z3 (and the other wheels), installs them and runs.
# The rest of tilelang's needs (cloudpickle, ml-dtypes, numpy, psutil, tqdm, typing-extensions)
# are on the box's image already.
set -euo pipefail
cd "$(dirname "$0")/.."
download=(python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp
          --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
case "${1:-}" in
  "")
    mkdir -p .whl
    "${download[@]}" -d .whl torchtitan==0.2.2 torchdata==0.11.0 tyro==1.0.17 docstring-parser==0.18.0 \
      typeguard==4.6.1 tomli==2.5.0 datasets==4.7.0 dill==0.4.0 multiprocess==0.70.18 torchao==0.18.0
    ls .whl ;;
  --tilelang)
    mkdir -p .whl_tilelang .whl_z3
    "${download[@]}" -d .whl_tilelang tilelang==0.1.15 apache-tvm-ffi==0.1.12 torch-c-dlpack-ext==0.1.5
    "${download[@]}" -d .whl_z3 z3-solver==4.15.4.0
    ls -l .whl_tilelang .whl_z3 ;;
  *)
    echo "usage: $0 [--tilelang]" >&2
    exit 2 ;;
esac
