# Shared by the cluster tests (sourced): counting results, and an unpacked bundle per host.
# Expects R (the runfiles root) and T (the test's temporary directory).
passed=0
failed=0
ok() { echo "ok: $*"; passed=$((passed + 1)); }
bad() { echo "FAIL: $*" >&2; failed=$((failed + 1)); }
# Prints the closing count and exits with the verdict.
finish() {
  echo "$passed passed, $failed failed"
  [[ $failed -eq 0 ]]
  exit
}
# Builds the bundle once and unpacks it into each given directory; prints nothing.
unpack_bundle() {
  local archive dir
  archive="$(bash "$R/tools/bundle.sh" "$R" "$T/dist" | tail -1)"
  for dir in "$@"; do
    mkdir -p "$dir"
    tar -C "$dir" -xzf "$archive"
  done
}
