#!/usr/bin/env bash
# `make test`'s tests, in two steps: the real engines (tests/peers/install.sh) and the nspawn root
# (tests/nspawn/install.sh) build in the background, niced, while the tests that need neither run (on a fresh
# machine that hides most of the 10+ minutes of building; with the caches in place the build is done in a
# second); then the tests marked `peers`, which need them. Both steps always run; the exit status is the first
# failure's. Arguments go to both pytest runs.
set -uo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
MAKE=${MAKE:-make}
log=$(mktemp -t gpuwarden-build.XXXXXX)
nice -n 19 "$MAKE" --no-print-directory -j2 peers nspawn >"$log" 2>&1 &
build=$!
"$VENV/bin/pytest" -m "not peers" "$@"
light=$?
echo "make test: waiting for the engines and the nspawn root to be built (log: $log)"
wait "$build"
built=$?
tail -n 5 "$log"
if [ "$built" -ne 0 ]; then
  echo "make test: building the engines or the nspawn root failed ($built): see $log" >&2
  exit "$built"
fi
"$VENV/bin/pytest" -m peers "$@"
heavy=$?
[ "$light" -ne 0 ] && exit "$light"
exit "$heavy"
