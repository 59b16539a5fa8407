#!/usr/bin/env bash
# A throw-away PostgreSQL cluster for the store tests (issue 9: CI runs them against a real server).
#
#   url=$(bash scripts/pg_test_server.sh start DIR)   # prints postgresql://... on stdout
#   ISPLAN_TEST_DATABASE_URL=$url pytest tests/web/test_security_store.py tests/web/test_persistence.py
#   bash scripts/pg_test_server.sh stop DIR
#
# Installs Debian's `postgresql` with apt-get when no server binaries are present. The cluster
# lives in DIR (created if missing), runs as an unprivileged user (`postgres` when started by
# root, else the caller), trusts local connections, and listens only on a unix socket in DIR
# (no TCP port), so nothing outside this machine's root and that user can reach it.
set -euo pipefail

cmd=${1:-}
dir=${2:-}
if [[ -z "$cmd" || -z "$dir" || ( "$cmd" != start && "$cmd" != stop ) ]]; then
  echo "usage: $0 start|stop DIR" >&2
  exit 2
fi

server_bin() {
  ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1
}

if [[ -z "$(server_bin)" ]]; then
  if [[ "$(id -u)" != 0 ]]; then
    echo "PostgreSQL server binaries are missing; install Debian's postgresql package (as root)" >&2
    exit 1
  fi
  echo "installing Debian's postgresql package ..." >&2
  apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends postgresql >&2
fi
bin=$(server_bin)

if [[ "$(id -u)" == 0 ]]; then
  owner=postgres
  as_owner() { runuser -u "$owner" -- "$@"; }
else
  owner=$(id -un)
  as_owner() { "$@"; }
fi

if [[ "$cmd" == stop ]]; then
  if [[ -f "$dir/data/postmaster.pid" ]]; then
    as_owner "$bin/pg_ctl" -D "$dir/data" -m immediate -w stop >&2 || true
  fi
  rm -rf "$dir"
  exit 0
fi

mkdir -p "$dir"
chown "$owner" "$dir"
chmod 700 "$dir"
port=5432
if [[ ! -f "$dir/data/PG_VERSION" ]]; then
  as_owner "$bin/initdb" -D "$dir/data" -A trust -U isplan -E UTF8 --no-instructions >"$dir/initdb.log" 2>&1 \
    || { cat "$dir/initdb.log" >&2; exit 1; }
fi
as_owner "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 \
  -o "-c listen_addresses='' -k $dir -p $port -c max_connections=200" start >&2 \
  || { cat "$dir/server.log" >&2; exit 1; }
echo "postgresql://isplan@/postgres?host=$dir&port=$port"
