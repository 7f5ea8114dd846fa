#!/bin/sh
# One member of the gate's Redis, highly available through Sentinel: `redis-member.sh redis`
# runs the data server, `redis-member.sh sentinel` the sentinel beside it (a container each
# in every pod of the pd-gateway-redis StatefulSet, redis.yaml).
#
# Environment: SELF, this member's address; PEERS, every member's address (SELF among
# them), in order; MASTER_NAME, what the sentinels call the master (the gate's URL names
# it); REDIS_PASSWORD; DATA, a writable folder (the pod's volume); REDIS_PORT (6379),
# SENTINEL_PORT (26379), DOWN_AFTER_MS (5000: how long the master may stay silent before
# the sentinels fail over); BIND, if set, the one address to listen on.
#
# Who is the master: what the sentinels say now; if none answers (the very first start,
# or every pod restarting at once), the first of PEERS. A member that was the master and
# comes back after a failover thus starts as a replica of the new one.
set -eu
unset REDISCLI_AUTH  # the sentinels take no password: redis-cli must not offer one
REDIS_PORT="${REDIS_PORT:-6379}"
SENTINEL_PORT="${SENTINEL_PORT:-26379}"
DOWN_AFTER_MS="${DOWN_AFTER_MS:-5000}"

current_master() {
  for peer in $PEERS; do
    answer=$(timeout 3 redis-cli -h "$peer" -p "$SENTINEL_PORT" \
      sentinel get-master-addr-by-name "$MASTER_NAME" 2>/dev/null | head -n 1) || true
    if [ -n "$answer" ]; then
      echo "$answer"
      return
    fi
  done
  set -- $PEERS
  echo "$1"
}

umask 077
master=$(current_master)
case "${1:-}" in
  redis)
    # The password in a file on the pod's own volume, not on the command line.
    printf 'requirepass "%s"\nmasterauth "%s"\n' "$REDIS_PASSWORD" "$REDIS_PASSWORD" \
      > "$DATA/auth.conf"
    set -- "$DATA/auth.conf" --port "$REDIS_PORT" --dir "$DATA" \
      --appendonly yes --appendfsync everysec --save "" \
      --maxmemory 256mb --maxmemory-policy noeviction \
      --replica-announce-ip "$SELF"
    if [ -n "${BIND:-}" ]; then set -- "$@" --bind "$BIND"; fi
    if [ "$master" != "$SELF" ]; then set -- "$@" --replicaof "$master" "$REDIS_PORT"; fi
    exec redis-server "$@"
    ;;
  sentinel)
    {
      echo "port $SENTINEL_PORT"
      if [ -n "${BIND:-}" ]; then echo "bind $BIND"; fi
      echo "dir $DATA"
      echo "sentinel resolve-hostnames yes"
      echo "sentinel announce-hostnames yes"
      echo "sentinel announce-ip $SELF"
      echo "sentinel monitor $MASTER_NAME $master $REDIS_PORT 2"
      echo "sentinel auth-pass $MASTER_NAME $REDIS_PASSWORD"
      echo "sentinel down-after-milliseconds $MASTER_NAME $DOWN_AFTER_MS"
      echo "sentinel failover-timeout $MASTER_NAME 60000"
    } > "$DATA/sentinel.conf"
    exec redis-server "$DATA/sentinel.conf" --sentinel
    ;;
  *)
    echo "usage: redis-member.sh redis|sentinel" >&2
    exit 2
    ;;
esac
