#!/usr/bin/env bash
# Start the real services, run the suite against them, stop them; pytest's status wins.
# Extra arguments go to pytest (e.g. scripts/test.sh tests/unit -x).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
scripts/install-services.sh
started_here=0
if ! scripts/services.sh status >/dev/null 2>&1; then
    scripts/services.sh start rabbitmq
    started_here=1
fi
cleanup() { [[ $started_here == 1 ]] && scripts/services.sh stop >/dev/null 2>&1 || true; }
trap cleanup EXIT
eval "$(scripts/services.sh env)"
set +e
.venv/bin/pytest "$@"
status=$?
set -e
# Exit 5 means no test ran: that is a failure, not a pass.
[[ $status == 5 ]] && echo "pytest collected no tests" >&2
exit "$status"
