#!/usr/bin/env bash
# A throwaway PostgreSQL server for the history tests: Debian's `postgresql` package (installed when missing), a
# fresh cluster in a temporary directory, run as the `postgres` user, reachable only through a Unix socket in that
# directory (no TCP port). Prints shell `export` lines; .ci/run does:
#   eval "$(scripts/ci-postgres.sh start)"
#   trap 'scripts/ci-postgres.sh stop "$MOEPERF_TEST_PG_DIR"' EXIT
# and the tests read MOEPERF_TEST_PG_URL (they skip, saying why, only when it is unset).
set -euo pipefail

bindir() {
    local found
    found=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)
    if [ -z "$found" ] || [ ! -x "$found/initdb" ]; then
        echo "ci-postgres: installing Debian's postgresql package" >&2
        apt-get update -qq >&2
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >&2
        found=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)
    fi
    echo "$found"
}

as_postgres() {  # initdb and postgres refuse to run as root
    if [ "$(id -u)" = 0 ]; then
        runuser -u postgres -- "$@"
    else
        "$@"
    fi
}

start() {
    local bin dir db=moeperf_test port=5432
    bin=$(bindir)
    dir=$(mktemp -d /tmp/moeperf-pg.XXXXXX)
    chmod 755 "$dir"
    [ "$(id -u)" = 0 ] && chown postgres: "$dir"
    as_postgres "$bin/initdb" -D "$dir/data" -U postgres -A trust -E UTF8 --no-sync >"$dir/initdb.log" 2>&1 \
        || { cat "$dir/initdb.log" >&2; exit 1; }
    as_postgres "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 \
        -o "-k $dir -p $port -c listen_addresses='' -c fsync=off -c full_page_writes=off" start >&2 \
        || { cat "$dir/server.log" >&2; exit 1; }
    "$bin/createdb" -h "$dir" -p "$port" -U postgres "$db" >&2
    echo "export MOEPERF_TEST_PG_URL='postgresql://postgres@/$db?host=$dir&port=$port'"
    echo "export MOEPERF_TEST_PG_DIR='$dir'"
}

stop() {
    local dir=${1:-${MOEPERF_TEST_PG_DIR:-}}
    [ -n "$dir" ] && [ -d "$dir/data" ] || { echo "ci-postgres: no cluster directory given" >&2; exit 2; }
    as_postgres "$(bindir)/pg_ctl" -D "$dir/data" -m fast -w stop >&2 || true
    rm -rf "$dir"
}

case "${1:-start}" in
    start) start ;;
    stop) stop "${2:-}" ;;
    *) echo "usage: $0 start | stop [DIR]" >&2; exit 2 ;;
esac
