#!/usr/bin/env bash
# ./shoal bench largebatch [--epochs N --batches 256,2048,8192 --optimizers momentum,lars,lamb,still]
exec "${1:-bazel-bin}/bench/largebatch/largebatch" "${@:2}"
