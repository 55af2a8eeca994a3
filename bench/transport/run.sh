#!/usr/bin/env bash
# ./shoal bench transport: push+pull vs raw ZeroMQ echo between two processes on loopback.
exec "${1:-bazel-bin}/bench/transport/transport_bench" "${@:2}"
