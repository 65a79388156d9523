#!/usr/bin/env bash
# The test targets with root-only tests, run whole as an unprivileged user (nobody), pass:
# each root-only test skips with a printed reason (a root test that forgot require_root!
# fails here); with FERROCE_REQUIRE_ROOT=1 (as tools/test runs the suite) the root-only tests
# fail instead. Runs the test binaries `cargo test --release` built (build them first).
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
fail=0
nobody() { setpriv --reuid=65534 --regid=65534 --clear-groups -- "$@"; }
# Every test target with a root-only test.
targets=$(grep -l 'require_root!' tests/*.rs | xargs -n1 basename | sed 's/\.rs$//')
[ -n "$targets" ] || { echo "FAIL: no test uses require_root!"; exit 1; }
for t in $targets; do
  bin=$(ls -t "$root"/target/release/deps/"$t"-* 2>/dev/null | grep -v '\.d$' | head -1)
  if [ -z "$bin" ]; then
    echo "FAIL $t: no test binary in target/release/deps (run cargo test --release --no-run)"
    fail=1
    continue
  fi
  if ! nobody test -x "$bin"; then
    echo "FAIL $t: user nobody cannot run $bin (a directory above it is not accessible to others); run from a world-readable checkout"
    fail=1
    continue
  fi
  # The root-only tests: those that call require_root!, except #[ignore]d ones (run on demand
  # only, e.g. the soak: the harness does not run them, so they cannot skip).
  mapfile -t filter < <(awk '/^#\[ignore/ { ign = 1 } /^fn [a-z0-9_]+\(\)/ { f = ign ? "" : $2; sub(/\(.*/, "", f); ign = 0 } /require_root!/ && f { print f; f = "" }' "tests/$t.rs")
  filter+=(--exact)
  # The whole target: everything passes, the root-only tests by skipping.
  out=$(cd /tmp && nobody env -u FERROCE_REQUIRE_ROOT "$bin" 2>&1)
  rc=$?
  # (the harness's "test NAME ... ok" lines and these interleave on the terminal)
  skipped=$(grep -oE "skipped $t::[a-z0-9_]+: needs root" <<<"$out" | sort -u | wc -l)
  tests=$((${#filter[@]} - 1))
  if [ $rc -ne 0 ] || [ "$skipped" -eq 0 ] || [ "$skipped" -ne "$tests" ]; then
    echo "FAIL $t as nobody: status $rc, $skipped of its $tests root-only tests skipped"
    grep -E "FAILED|panicked" <<<"$out" | head -10
    echo "$out" | tail -20
    fail=1
  else
    echo "PASS $t as nobody: passes; its $skipped root-only tests skipped with a reason, e.g.:"
    grep -oE -m1 "skipped $t::.*" <<<"$out" | head -1 | sed 's/^/  /'
  fi
  out=$(cd /tmp && nobody env FERROCE_REQUIRE_ROOT=1 "$bin" "${filter[@]}" 2>&1)
  rc=$?
  failed=$(grep -c "must run as root" <<<"$out")
  if [ $rc -eq 0 ] || [ "$failed" -ne "$tests" ]; then
    echo "FAIL $t as nobody with FERROCE_REQUIRE_ROOT=1: status $rc, $failed of $tests failed for want of root (all must)"
    fail=1
  else
    echo "PASS $t as nobody with FERROCE_REQUIRE_ROOT=1: fails instead of skipping"
  fi
done
exit $fail
