#!/usr/bin/env bash
# Makes sure what the test suite talks to is up: PostgreSQL, Redis and (unless --no-browser)
# Debian's Chromium at /usr/bin/chromium. Starts what is down where it can; otherwise prints the
# command to run and exits non-zero, so that no test ever passes against a stand-in.
#
#   scripts/ensure_services.sh [--no-browser]
#
# Hosts and ports come from TEST_DATABASE_URL and TEST_BROKER_URL (the same variables `make test`
# reads), defaulting to 127.0.0.1:5432 and 127.0.0.1:6379.
set -euo pipefail

want_browser=1
for arg in "$@"; do
    case "$arg" in
        --no-browser) want_browser=0 ;;
        *) echo "usage: $0 [--no-browser]" >&2; exit 2 ;;
    esac
done

database_url=${TEST_DATABASE_URL:-postgres://postgres@127.0.0.1:5432/runwatch}
broker_url=${TEST_BROKER_URL:-redis://127.0.0.1:6379/14}

# host_port URL DEFAULT_PORT -> "host port"
host_port() {
    if [[ $1 =~ ^[a-z0-9+]+://([^@/]*@)?([^:/?]+)(:([0-9]+))? ]]; then
        echo "${BASH_REMATCH[2]} ${BASH_REMATCH[4]:-$2}"
    else
        echo "cannot read a host from '$1'" >&2
        exit 2
    fi
}
read -r pg_host pg_port < <(host_port "$database_url" 5432)
read -r redis_host redis_port < <(host_port "$broker_url" 6379)
pg_user=postgres
if [[ $database_url =~ ://([^:@/]+)(:[^@]*)?@ ]]; then pg_user=${BASH_REMATCH[1]}; fi
db_name=${database_url##*/}
db_name=${db_name%%\?*}

is_local() { [[ $1 == 127.0.0.1 || $1 == localhost || $1 == ::1 ]]; }
is_root() { [[ $(id -u) == 0 ]]; }

postgres_up() {
    if command -v pg_isready >/dev/null; then
        pg_isready -q -h "$pg_host" -p "$pg_port" -t 2
    else
        (exec 3<>"/dev/tcp/$pg_host/$pg_port") 2>/dev/null
    fi
}

redis_up() {
    if command -v redis-cli >/dev/null; then
        [[ $(redis-cli -h "$redis_host" -p "$redis_port" ping 2>/dev/null) == PONG ]]
    else
        # No client: speak the inline protocol over bash's /dev/tcp.
        local reply
        exec 3<>"/dev/tcp/$redis_host/$redis_port" 2>/dev/null || return 1
        printf 'PING\r\n' >&3
        read -r -t 2 reply <&3 || true
        exec 3<&- 3>&-
        [[ $reply == "+PONG"* ]]
    fi
}

wait_for() {  # wait_for CHECK SECONDS
    local deadline=$((SECONDS + $2))
    until "$1"; do
        ((SECONDS < deadline)) || return 1
        sleep 0.5
    done
}

start_postgres() {
    ls /etc/postgresql >/dev/null 2>&1 || return 1
    pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql)" main start
}
postgres_start_hint='pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start'

start_redis() {
    command -v redis-server >/dev/null || return 1
    if is_root; then mkdir -p /var/lib/redis /var/log/redis; fi
    redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
        --dir /var/lib/redis --logfile /var/log/redis/ci.log
}
redis_start_hint='redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no --dir /var/lib/redis --logfile /var/log/redis/ci.log'

failed=0

# ensure NAME CHECK START HINT HOST PORT
ensure() {
    local name=$1 check=$2 start=$3 hint=$4 host=$5 port=$6
    if "$check"; then
        echo "ensure_services: $name is up at $host:$port"
        return 0
    fi
    if is_local "$host" && [[ $port == "$7" ]]; then
        echo "ensure_services: $name is down at $host:$port; starting it"
        if "$start" && wait_for "$check" 20; then
            echo "ensure_services: $name started"
            return 0
        fi
        echo "ensure_services: could not start $name. Run, as root:  $hint" >&2
    else
        echo "ensure_services: $name is not answering at $host:$port; start it there" >&2
    fi
    failed=1
}

ensure PostgreSQL postgres_up start_postgres "$postgres_start_hint" "$pg_host" "$pg_port" 5432
ensure Redis redis_up start_redis "$redis_start_hint" "$redis_host" "$redis_port" 6379

# The suite's own database: pytest-django makes test_<name> itself, but the dashboard and a manual
# `manage.py migrate` with the same DATABASE_URL want <name> to exist.
if ((failed == 0)) && command -v psql >/dev/null && [[ -n $db_name ]]; then
    psql_args=(-h "$pg_host" -p "$pg_port" -U "$pg_user" -d postgres -v ON_ERROR_STOP=1 -tAq)
    if ! exists=$(psql "${psql_args[@]}" -c "select 1 from pg_database where datname = '$db_name'" 2>&1); then
        echo "ensure_services: PostgreSQL refused user '$pg_user': $exists" >&2
        failed=1
    elif [[ $exists != 1 ]]; then
        psql "${psql_args[@]}" -c "create database \"$db_name\"" && echo "ensure_services: created database $db_name"
    fi
fi

if ((want_browser)); then
    if [[ -x /usr/bin/chromium ]]; then
        echo "ensure_services: chromium is at /usr/bin/chromium"
    elif is_root && command -v apt-get >/dev/null; then
        echo "ensure_services: installing Debian's chromium for the browser tests"
        if ! { DEBIAN_FRONTEND=noninteractive apt-get update -qq &&
               DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; }; then
            echo "ensure_services: could not install chromium. Run, as root:  apt-get update && apt-get install -y chromium" >&2
            failed=1
        fi
    else
        echo "ensure_services: the browser tests need /usr/bin/chromium. Run, as root:  apt-get update && apt-get install -y chromium  (or use make test-fast)" >&2
        failed=1
    fi
fi

exit "$failed"
