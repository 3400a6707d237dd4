#!/usr/bin/env bash
# Download the wheels that an H200 machine without network access lacks (it has Python 3.12, torch
# 2.11 and triton 3.6) into .whl/: pure Python, plus torchao (an abi3 wheel; float8 linears) and xxhash
# (cp312; checkpoint checksums).
# There: python3 -m pip install --no-index --no-deps --target /tmp/site .whl/*.whl
#        export PYTHONPATH=/tmp/site
#
# --tilelang: instead, the wheels of tilelang (fla's TileLang backend, needed to train gated_deltanet
# on Hopper with triton < 3.7.1; see docs/mixers.md) into .whl_tilelang/ and .whl_z3/.
# Two folders so that each stays under 64 MiB (tilelang is 49.6 MB, z3-solver 29.3 MB; tilelang's
# libtvm_compiler needs libz3) for transfers with a size limit; install both into the same --target.
# The rest of tilelang's needs (cloudpickle, ml-dtypes, numpy, psutil, tqdm, typing-extensions)
# come with the usual CUDA images.
set -euo pipefail
cd "$(dirname "$0")/.."
download=(python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp
          --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
case "${1:-}" in
  "")
    mkdir -p .whl
    "${download[@]}" -d .whl torchtitan==0.2.2 torchdata==0.11.0 tyro==1.0.17 docstring-parser==0.18.0 \
      typeguard==4.6.1 tomli==2.5.0 datasets==4.7.0 dill==0.4.0 multiprocess==0.70.18 torchao==0.18.0 \
      xxhash==4.1.0
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
