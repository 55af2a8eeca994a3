#!/usr/bin/env bash
# ./shoal bench largebatch [--record FILE.jsonl --list --epochs 30 --batches 256,4096,8192,16384 --optimizers momentum,lars,lamb,still --cells still_8192,... --seeds 42,43,44 --set OPT.KEY=VALUE,...]
exec "${1:-bazel-bin}/bench/largebatch/largebatch" "${@:2}"
