#!/bin/sh
# `etcd`: one etcd member, named after the container's host name.
# `patroni`: a PostgreSQL node under Patroni, its configuration written from the environment:
#   PATRONI_NAME (this node, resolvable by the others), PATRONI_ETCD (host:port),
#   PATRONI_SUPERUSER_PASSWORD, PATRONI_REPLICATION_PASSWORD, TIDAL_PG_PASSWORD (the tidal
#   role, and its database, made when the cluster is first created).
# Synchronous replication, strict: a COMMIT returns once the synchronous standby has it, so
# a failover keeps every write tidal acknowledged (docs/RELIABILITY.md).
set -eu
case "${1:-patroni}" in
etcd)
    shift
    me=$(hostname)
    exec etcd --name "$me" --data-dir /var/lib/postgresql/data/etcd \
        --listen-client-urls http://0.0.0.0:2379 --advertise-client-urls "http://$me:2379" \
        --listen-peer-urls http://0.0.0.0:2380 --initial-advertise-peer-urls "http://$me:2380" \
        --initial-cluster "$me=http://$me:2380" "$@"
    ;;
patroni) ;;
*) exec "$@" ;;
esac
: "${PATRONI_NAME:?set PATRONI_NAME}" "${PATRONI_ETCD:?set PATRONI_ETCD}"
: "${PATRONI_SUPERUSER_PASSWORD:?set TIDAL_PG_SUPERUSER_PASSWORD}"
: "${PATRONI_REPLICATION_PASSWORD:?set TIDAL_PG_REPLICATION_PASSWORD}"
: "${TIDAL_PG_PASSWORD:?set TIDAL_PG_PASSWORD}"
conf=/etc/patroni
mkdir -p "$conf" "$PGDATA" /var/run/postgresql
cat > "$conf/post-bootstrap.sh" <<'SCRIPT'
#!/bin/sh
set -eu
psql "$1" -v ON_ERROR_STOP=1 -v pw="$TIDAL_PG_PASSWORD" <<'SQL'
CREATE ROLE tidal LOGIN PASSWORD :'pw';
CREATE DATABASE tidal OWNER tidal ENCODING 'UTF8';
SQL
SCRIPT
chmod 755 "$conf/post-bootstrap.sh"
cat > "$conf/patroni.yml" <<YAML
scope: tidal
name: $PATRONI_NAME
restapi: {listen: "0.0.0.0:8008", connect_address: "$PATRONI_NAME:8008"}
etcd3: {hosts: ["$PATRONI_ETCD"]}
bootstrap:
  dcs:
    ttl: 30
    loop_wait: 5
    retry_timeout: 10
    primary_start_timeout: 0
    synchronous_mode: true
    synchronous_mode_strict: true
    postgresql:
      use_pg_rewind: true
      use_slots: true
      parameters: {wal_log_hints: "on"}
  initdb: [{encoding: UTF8}, {locale: C.UTF-8}]
  post_bootstrap: $conf/post-bootstrap.sh
  pg_hba:
    - local all all trust
    - host replication replicator all scram-sha-256
    - host all all all scram-sha-256
postgresql:
  listen: "0.0.0.0:5432"
  connect_address: "$PATRONI_NAME:5432"
  data_dir: $PGDATA/pg
  bin_dir: /usr/lib/postgresql/15/bin
  pgpass: /tmp/pgpass
  authentication:
    superuser: {username: postgres, password: "$PATRONI_SUPERUSER_PASSWORD"}
    replication: {username: replicator, password: "$PATRONI_REPLICATION_PASSWORD"}
    rewind: {username: postgres, password: "$PATRONI_SUPERUSER_PASSWORD"}
  parameters: {unix_socket_directories: /var/run/postgresql, password_encryption: scram-sha-256}
  remove_data_directory_on_rewind_failure: true
  remove_data_directory_on_diverged_timelines: true
YAML
chown -R postgres:postgres "$conf" "$PGDATA" /var/run/postgresql
chmod 700 "$PGDATA"
exec setpriv --reuid postgres --regid postgres --init-groups patroni "$conf/patroni.yml"
