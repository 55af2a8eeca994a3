#!/usr/bin/env bash
# ./shoal bench heterogeneous
exec /usr/bin/python3 "$(dirname "$0")/run.py" "$@"
