#!/usr/bin/env bash
# ./shoal bench algorithms
exec /usr/bin/python3 "$(dirname "$0")/run.py" "$@"
