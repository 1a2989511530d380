#!/usr/bin/env bash
# `make test`'s tests, in two steps: the real engines (tests/peers/install.sh) and the nspawn root
# (tests/nspawn/install.sh) build in the background, niced, while the tests that need neither run (on a fresh
# machine that hides most of the 10+ minutes of building; with the caches in place the build is done in a
# second); then the tests marked `peers`, which need them. Both steps always run; the exit status is the first
# failure's. Arguments go to both pytest runs.
#
# Each step runs on $TEST_WORKERS workers (pytest-xdist; 0: one after another, in this process): the first step's
# tests mostly wait on daemon child processes, and those that share something of the host run one after another
# (the `host` group); the second runs in two lanes (tests/conftest.py). Each step prints its 30 slowest tests
# and the time it took (docs/development.md says where the time goes).
set -uo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
MAKE=${MAKE:-make}
WORKERS=${TEST_WORKERS:-2}
started=$SECONDS
log=$(mktemp -t gpuwarden-build.XXXXXX)
(nice -n 19 "$MAKE" --no-print-directory -j2 peers nspawn >"$log" 2>&1; built=$?
 echo "make test: the engines and the nspawn root were ready $((SECONDS - started)) s after the start" >>"$log"
 exit "$built") &
build=$!
"$VENV/bin/pytest" -m "not peers" -n "$WORKERS" --dist loadgroup --durations=30 "$@"
light=$?
echo "make test: step 1 (tests that need no engine) took $((SECONDS - started)) s"
echo "make test: waiting for the engines and the nspawn root to be built (log: $log)"
wait "$build"
built=$?
tail -n 6 "$log"
if [ "$built" -ne 0 ]; then
  echo "make test: building the engines or the nspawn root failed ($built): see $log" >&2
  exit "$built"
fi
step2=$SECONDS
"$VENV/bin/pytest" -m peers -n "$WORKERS" --dist loadgroup --durations=30 "$@"
heavy=$?
echo "make test: step 2 (real engines, Docker, nspawn) took $((SECONDS - step2)) s; the tests $((SECONDS - started)) s in all"
[ "$light" -ne 0 ] && exit "$light"
exit "$heavy"
