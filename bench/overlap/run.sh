#!/usr/bin/env bash
# ./shoal bench overlap
exec /usr/bin/python3 "$(dirname "$0")/run.py" "$@"
