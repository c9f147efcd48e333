#!/usr/bin/env bash
# Start the real services, run the suite against them, stop them; pytest's status wins.
# With no arguments, the whole suite in two runs: every test not marked `serial` over
# $JOBSAPP_TEST_WORKERS pytest-xdist workers (3 on the machine's 2 cores: most modules wait
# on subprocesses and servers; one module per worker at a time, so module fixtures start
# once), then the `serial` ones alone, whose assertions
# are on a cadence or a latency that a second worker on the same cores would stretch.
# Extra arguments replace that: one pytest run with them (e.g. scripts/test.sh tests/unit -x,
# or scripts/test.sh -n 3 --dist loadfile --no-loadscope-reorder tests/e2e).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
# Every pytest process (each xdist worker, the serial run, a test's own pytest) reads the
# compiled and assertion-rewritten modules the first one wrote. With PYTHONDONTWRITEBYTECODE
# set (this machine's shells set it) each recompiled them: 15 s of CPU a collection, not 6.
unset PYTHONDONTWRITEBYTECODE
scripts/install-services.sh
# Servers already up (a developer's) are used as they are, but for RabbitMQ, which the
# suite needs too: without it every test on RabbitMQ would be skipped (failed under CI=true).
# What this script starts, it stops.
started_here=0 rabbitmq_here=0
if ! scripts/services.sh status >/dev/null 2>&1; then
    scripts/services.sh start rabbitmq
    started_here=1
elif ! scripts/services.sh status | grep -q '^rabbitmq *running'; then
    scripts/services.sh start rabbitmq
    rabbitmq_here=1
fi
cleanup() {
    if [[ $started_here == 1 ]]; then
        scripts/services.sh stop >/dev/null 2>&1 || true
    elif [[ $rabbitmq_here == 1 ]]; then
        scripts/services.sh stop rabbitmq >/dev/null 2>&1 || true
    fi
}
trap cleanup EXIT
eval "$(scripts/services.sh env)"
set +e
if [[ $# -gt 0 ]]; then
    .venv/bin/pytest "$@"
    status=$?
else
    # In collection order (chaos, e2e, integration, unit): xdist's default starts the modules
    # with the most tests first, which left the longest ones (the bench smoke, two tests) last.
    .venv/bin/pytest -n "${JOBSAPP_TEST_WORKERS:-3}" --dist loadfile --no-loadscope-reorder \
        -m "not serial"
    parallel=$?
    .venv/bin/pytest -m serial
    serial=$?
    # Either run failing fails the suite; "no test" (5) only when neither ran one.
    status=$parallel
    if [[ $parallel == 0 || $parallel == 5 ]] && [[ $serial != 5 ]]; then status=$serial; fi
fi
set -e
# Exit 5 means no test ran: that is a failure, not a pass.
[[ $status == 5 ]] && echo "pytest collected no tests" >&2
exit "$status"
