#!/usr/bin/env bash
# Start a throwaway PostgreSQL server for the store's contract tests and print its URL.
# Installs Debian's postgresql package when the machine lacks it. With an argument FILE, writes
# there the command that stops the server again (for a trap in .ci/run).
set -euo pipefail
if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql) >&2
fi
bin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)
port=${CUTLASS_TUNE_CI_PG_PORT:-54329}
data=$(mktemp -d /tmp/cutlass-tune-pg.XXXXXX)
run() { if [ "$(id -u)" = 0 ]; then su postgres -s /bin/sh -c "$*"; else sh -c "$*"; fi; }
[ "$(id -u)" = 0 ] && chown postgres "$data"
run "$bin/initdb -D $data -A trust -U postgres" >/dev/null
run "$bin/pg_ctl -D $data -o '-p $port -k /tmp -c listen_addresses=localhost' -l $data/log -w start" >/dev/null
if [ $# -gt 0 ]; then  # stop the server, then remove its data directory
  if [ "$(id -u)" = 0 ]; then
    echo "su postgres -s /bin/sh -c '$bin/pg_ctl -D $data -m fast stop'; rm -rf $data" > "$1"
  else
    echo "$bin/pg_ctl -D $data -m fast stop; rm -rf $data" > "$1"
  fi
fi
echo "postgresql+psycopg://postgres@localhost:$port/postgres"
