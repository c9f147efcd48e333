#!/usr/bin/env bash
# Install the Debian packages of the test services when this machine lacks them (needs root).
set -euo pipefail
missing=()
command -v redis-server >/dev/null || missing+=(redis-server)
[[ -x /usr/lib/rabbitmq/bin/rabbitmq-server ]] || missing+=(rabbitmq-server)
[[ -x /usr/lib/postgresql/15/bin/initdb ]] || missing+=(postgresql-15)
[[ -x /usr/bin/chromium ]] || missing+=(chromium)
command -v pgbouncer >/dev/null || missing+=(pgbouncer)
# libfaketime skews a worker's clock in the clock-skew tests.
command -v faketime >/dev/null || missing+=(faketime)
# openssl makes the throwaway CA of the TLS listeners (scripts/services.sh).
command -v openssl >/dev/null || missing+=(openssl)
if ((${#missing[@]})); then
    echo "installing ${missing[*]} with apt-get" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq "${missing[@]}" >/dev/null
fi
