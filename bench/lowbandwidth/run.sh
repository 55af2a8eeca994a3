#!/usr/bin/env bash
# ./shoal bench lowbandwidth
exec /usr/bin/python3 "$(dirname "$0")/run.py" "$@"
