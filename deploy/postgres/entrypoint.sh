#!/bin/sh
# The official image's first start, in short: initdb with POSTGRES_USER and POSTGRES_PASSWORD,
# create POSTGRES_DB, allow password logins over the network; then postgres, as PID 1.
set -eu
user=${POSTGRES_USER:-postgres}
db=${POSTGRES_DB:-$user}
as_postgres() { setpriv --reuid postgres --regid postgres --init-groups "$@"; }
mkdir -p "$PGDATA" /var/run/postgresql
chown postgres:postgres "$PGDATA" /var/run/postgresql
chmod 700 "$PGDATA"
if [ ! -s "$PGDATA/PG_VERSION" ]; then
    if [ -z "${POSTGRES_PASSWORD:-}" ]; then
        echo "postgres-entrypoint: POSTGRES_PASSWORD must be set" >&2
        exit 1
    fi
    secret=$(mktemp)
    printf '%s\n' "$POSTGRES_PASSWORD" > "$secret"
    chown postgres "$secret"
    as_postgres initdb -D "$PGDATA" -U "$user" --pwfile="$secret" --auth-local=trust \
        --auth-host=scram-sha-256 -E UTF8 --locale=C.UTF-8 >/dev/null
    rm -f "$secret"
    echo "host all all all scram-sha-256" >> "$PGDATA/pg_hba.conf"
    as_postgres pg_ctl -D "$PGDATA" -w -o "-c listen_addresses='' -k /tmp" start >/dev/null
    if [ "$db" != postgres ]; then
        as_postgres psql -h /tmp -U "$user" -d postgres -qc "CREATE DATABASE \"$db\""
    fi
    as_postgres pg_ctl -D "$PGDATA" -w stop >/dev/null
fi
exec setpriv --reuid postgres --regid postgres --init-groups \
    postgres -D "$PGDATA" -c listen_addresses='*' -k /var/run/postgresql
