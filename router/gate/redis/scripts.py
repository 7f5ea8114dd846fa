"""The Redis gate's state changes, each one Lua script run atomically by the server.

Every script gets the pool's queue key as KEYS[1] and the same six leading arguments:
the key prefix, the lease TTL (ms), the failure threshold, the pool's node ids (one a line,
in grant order), the caller's replica id and the pool's state epoch as the caller knows it
("" at first). Its own arguments follow from ARGV[7].

Keys (P = the deployment's key prefix, Q = KEYS[1] = P:pool:<pool id>:queue):

    P:node:<id>      hash   failures, out_ms + reason (out of service), drained, token
                            (the fencing counter, HINCRBY on every grant), held (the
                            holder of a lease granted and not yet released)
    P:probe:<id>     string the replica flushing an out node before readmitting it
    P:lease:<id>     hash   owner, holder, token, since (ms); expires after the lease TTL
    P:alive:<rep>    string a replica's heartbeat; expires after the lease TTL
    P:wake           channel published to when a waiter must look again
    Q                zset   waiters: member <replica>|<n>, score -priority * 2^40 + arrival
    Q:wait           hash   member -> "<deadline ms>|<holder>"
    Q:seq            string the arrival counter
    Q:grant:<member> string the node handed to a queued waiter, until it claims it
    Q:gone:<member>  string a waiter that gave up: a late ACQUIRE or CLAIM of it is void
    Q:held           list   recent hold times (seconds), newest first
    Q:epoch          string set when the pool's state is first found empty

The queue is per pool (its id hashes the node ids the gate was built with); leases and
health are per node, so two pools that name one node never both hold it.

A node is free when it is in service and has no lease. A node whose lease expired without a
release (its holder died or lost Redis) may hold an orphaned transfer: the first script to
look at it takes it out (`lease_expired`) until a prober has flushed it. `fill` hands every
free node to the live head of the queue (a waiter whose replica's heartbeat is gone, or
whose deadline has passed, is dropped on the way), records the grant and names the
grantees on P:wake.

A Redis that lost the pool's state (restarted without persistence, a failover that lost
writes) no longer knows the leases still being served. The first script of a replica that
knew the old epoch notices: every node without a lease goes out (`state_lost`) until a
prober has found it idle and flushed it, so no node still decoding a forgotten lease is
granted again; the script then fails with `EPOCH <epoch>`, and the caller, having learnt
the epoch, runs it again.
"""

from __future__ import annotations

_COMMON = """
local P, QUEUE = ARGV[1], KEYS[1]
local TTL, THRESHOLD = tonumber(ARGV[2]), tonumber(ARGV[3])
local REPLICA = ARGV[5]
local NODES = {}
for id in string.gmatch(ARGV[4], "[^\\n]+") do NODES[#NODES + 1] = id end
local WAIT = QUEUE .. ":wait"
local clock = redis.call("TIME")
local NOW = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local granted = {}

local function node_key(id) return P .. ":node:" .. id end
local function lease_key(id) return P .. ":lease:" .. id end
local function grant_key(member) return QUEUE .. ":grant:" .. member end
local function gone_key(member) return QUEUE .. ":gone:" .. member end
local function alive_key(replica) return P .. ":alive:" .. replica end
local function probe_key(id) return P .. ":probe:" .. id end
local function replica_of(member) return string.match(member, "^[^|]*") end

local function usable(id)
  local state = redis.call("HMGET", node_key(id), "out_ms", "drained")
  return not state[1] and not state[2]
end

-- Nodes that serve, or will once flushed (an expired lease, a lost state): waiters keep
-- waiting for them.
local function in_service()
  local n = 0
  for _, id in ipairs(NODES) do
    local state = redis.call("HMGET", node_key(id), "out_ms", "drained", "reason")
    local flush_only = state[3] == "lease_expired" or state[3] == "state_lost"
    if not state[2] and (not state[1] or flush_only) then n = n + 1 end
  end
  return n
end

local function free_node()
  for _, id in ipairs(NODES) do
    if usable(id) and redis.call("EXISTS", lease_key(id)) == 0 then
      if redis.call("HEXISTS", node_key(id), "held") == 0 then return id end
      redis.call("HSET", node_key(id), "out_ms", NOW, "reason", "lease_expired")
      redis.call("HDEL", node_key(id), "held")
    end
  end
  return nil
end

local function enqueue(member, holder, score, wait_ms)
  redis.call("ZADD", QUEUE, score, member)
  redis.call("HSET", WAIT, member, string.format("%d|%s", NOW + wait_ms + TTL, holder))
end

local function drop(member)
  redis.call("ZREM", QUEUE, member)
  redis.call("HDEL", WAIT, member)
end

local function stale(member)
  local meta = redis.call("HGET", WAIT, member)
  if not meta or tonumber(string.match(meta, "^%d+")) < NOW then return true end
  return redis.call("EXISTS", alive_key(replica_of(member))) == 0
end

local function prune()
  for _, member in ipairs(redis.call("ZRANGE", QUEUE, 0, -1)) do
    if stale(member) then drop(member) end
  end
end

local function head()
  while true do
    local member = redis.call("ZRANGE", QUEUE, 0, 0)[1]
    if not member or not stale(member) then return member end
    drop(member)
  end
end

local function lease(id, owner, holder)
  local token = redis.call("HINCRBY", node_key(id), "token", 1)
  redis.call("HSET", lease_key(id), "owner", owner, "holder", holder, "token", token,
             "since", NOW)
  redis.call("PEXPIRE", lease_key(id), TTL)
  redis.call("HSET", node_key(id), "held", holder)
  return token
end

local function unlease(id)
  redis.call("DEL", lease_key(id))
  redis.call("HDEL", node_key(id), "held")
end

local function fill()
  local id = free_node()
  while id do
    local member = head()
    if not member then return end
    lease(id, member, string.match(redis.call("HGET", WAIT, member), "|(.*)$"))
    drop(member)
    redis.call("SET", grant_key(member), id, "PX", TTL)
    granted[#granted + 1] = member
    id = free_node()
  end
end

-- Hand free nodes on, tell the grantees (everyone, if no node is left to wait for).
local function finish(reply)
  fill()
  if in_service() == 0 and redis.call("ZCARD", QUEUE) > 0 then
    redis.call("PUBLISH", P .. ":wake", "*")
  elseif #granted > 0 then
    redis.call("PUBLISH", P .. ":wake", table.concat(granted, " "))
  end
  return reply
end

local function release_owned_by(owner)
  for _, id in ipairs(NODES) do
    if redis.call("HGET", lease_key(id), "owner") == owner then unlease(id) end
  end
end

local EPOCH = redis.call("GET", QUEUE .. ":epoch")
if not EPOCH then
  EPOCH = string.format("%d-%s", NOW, REPLICA)
  redis.call("SET", QUEUE .. ":epoch", EPOCH)
end
if ARGV[6] ~= EPOCH then
  if ARGV[6] ~= "" then
    for _, id in ipairs(NODES) do
      if redis.call("EXISTS", lease_key(id)) == 0
          and redis.call("HEXISTS", node_key(id), "out_ms") == 0 then
        redis.call("HSET", node_key(id), "out_ms", NOW, "reason", "state_lost")
      end
    end
  end
  return redis.error_reply("EPOCH " .. EPOCH)
end
"""

# ARGV: owner, holder, priority, wait_ms, max_queue.
# A free node goes to the caller only if nobody waits; else it queues (or is refused).
ACQUIRE = """
local owner, holder = ARGV[7], ARGV[8]
local priority, wait_ms, max_queue = tonumber(ARGV[9]), tonumber(ARGV[10]), tonumber(ARGV[11])
redis.call("SET", alive_key(REPLICA), "1", "PX", TTL)
if redis.call("EXISTS", gone_key(owner)) == 1 then return {"gone"} end
fill()
prune()
if redis.call("ZCARD", QUEUE) == 0 then
  local id = free_node()
  if id then return finish({"granted", id, lease(id, owner, holder)}) end
end
if in_service() == 0 then return finish({"no_node"}) end
if redis.call("ZCARD", QUEUE) >= max_queue then return finish({"queue_full"}) end
if wait_ms <= 0 then return finish({"pool_saturated"}) end
local arrival = redis.call("INCR", QUEUE .. ":seq")
local score = string.format("%.17g", -priority * 2^40 + arrival)
enqueue(owner, holder, score, wait_ms)
return finish({"queued", score})
"""

# ARGV: owner, holder, score, remaining_ms.
# A queued waiter looks for its grant; an entry lost meanwhile (its replica looked dead,
# or the server restarted) is put back at its old place.
CLAIM = """
local owner, holder, score, remaining = ARGV[7], ARGV[8], ARGV[9], tonumber(ARGV[10])
redis.call("SET", alive_key(REPLICA), "1", "PX", TTL)
if redis.call("EXISTS", gone_key(owner)) == 1 then return {"gone"} end
local function claim()
  local id = redis.call("GET", grant_key(owner))
  if not id then return nil end
  redis.call("DEL", grant_key(owner))
  local held = redis.call("HMGET", lease_key(id), "owner", "token")
  if held[1] ~= owner then return nil end
  redis.call("PEXPIRE", lease_key(id), TTL)
  return {"granted", id, tonumber(held[2])}
end
local reply = claim()
if reply then return finish(reply) end
if not redis.call("ZSCORE", QUEUE, owner) then enqueue(owner, holder, score, remaining) end
fill()
reply = claim()
if reply then return finish(reply) end
if in_service() == 0 then
  drop(owner)
  return finish({"no_node"})
end
return finish({"waiting"})
"""

# ARGV: owner. The waiter gave up: out of the queue, and a node granted to it meanwhile
# (handed on, or granted directly with the reply lost) goes to the next waiter.
ABANDON = """
local owner = ARGV[7]
redis.call("SET", gone_key(owner), "1", "PX", TTL)
drop(owner)
redis.call("DEL", grant_key(owner))
release_owned_by(owner)
return finish(1)
"""

# ARGV: node id, owner, token, judged ("1"/"0"), failure reason ("" = success), hard.
# Compare-and-delete: a lease that has been lost (expired, granted again) is not touched,
# and its holder's verdict is not recorded (a second request may have disturbed the node).
RELEASE = """
local id, owner, token = ARGV[7], ARGV[8], ARGV[9]
local held = redis.call("HMGET", lease_key(id), "owner", "token", "since")
if held[1] ~= owner or held[2] ~= token then return 0 end
unlease(id)
redis.call("LPUSH", QUEUE .. ":held", string.format("%.3f", (NOW - tonumber(held[3])) / 1000))
redis.call("LTRIM", QUEUE .. ":held", 0, 63)
if ARGV[10] == "1" then
  local key, reason = node_key(id), ARGV[11]
  if reason == "" then
    redis.call("HSET", key, "failures", 0)
  else
    local failures = redis.call("HINCRBY", key, "failures", 1)
    if redis.call("HEXISTS", key, "out_ms") == 0
        and (ARGV[12] == "1" or failures >= THRESHOLD) then
      redis.call("HSET", key, "out_ms", NOW, "reason", reason)
    end
  end
end
return finish(1)
"""

# ARGV: node id, owner, token, ... (repeated). Refreshes the caller's heartbeat and every
# lease it still holds; 1 for each lease still held, 0 for each one lost.
RENEW = """
redis.call("SET", alive_key(REPLICA), "1", "PX", TTL)
local held = {}
for i = 7, #ARGV, 3 do
  local lease = redis.call("HMGET", lease_key(ARGV[i]), "owner", "token")
  if lease[1] == ARGV[i + 1] and lease[2] == ARGV[i + 2] then
    redis.call("PEXPIRE", lease_key(ARGV[i]), TTL)
    held[#held + 1] = 1
  else
    held[#held + 1] = 0
  end
end
return held
"""

# ARGV: action, node id, reason (for `claim`: the claim's lifetime, ms). An operator's or the
# prober's change of a node's service, or (`pool`) a new node list: a node new to the pool
# serves the queue at once. `claim` (0 or 1): the caller alone may flush an out node now;
# `readmit` is refused while another replica's claim stands.
ADMIN = """
local action, id = ARGV[7], ARGV[8]
local key = node_key(id)
if action == "claim" then
  local state = redis.call("HMGET", key, "out_ms", "drained")
  if not state[1] or state[2] or redis.call("EXISTS", lease_key(id)) == 1 then return 0 end
  if redis.call("SET", probe_key(id), REPLICA, "NX", "PX", tonumber(ARGV[9])) then return 1 end
  return 0
end
if action == "readmit" then
  local claimant = redis.call("GET", probe_key(id))
  if claimant and claimant ~= REPLICA then return 0 end
  redis.call("DEL", probe_key(id))
end
if action == "take_out" then
  if redis.call("EXISTS", lease_key(id)) == 1 then return 0 end
  redis.call("HINCRBY", key, "failures", 1)
  if redis.call("HEXISTS", key, "out_ms") == 0 then
    redis.call("HSET", key, "out_ms", NOW, "reason", ARGV[9])
  end
elseif action == "readmit" then
  redis.call("HSET", key, "failures", 0)
  redis.call("HDEL", key, "out_ms", "reason")
elseif action == "drain" then
  redis.call("HSET", key, "drained", 1)
elseif action == "undrain" then
  redis.call("HDEL", key, "drained")
end
return finish(1)
"""

# ARGV: the ids of nodes leaving the pool (each may still be held).
# The pool as every replica sees it: {now ms, waiting, hold times, per node {holder, since,
# out_ms, reason, drained}, per leaving node its holder} (a missing value is nil).
STATE = """
prune()
fill()
local nodes, leaving = {}, {}
for _, id in ipairs(NODES) do
  local lease = redis.call("HMGET", lease_key(id), "holder", "since")
  local state = redis.call("HMGET", node_key(id), "out_ms", "reason", "drained")
  nodes[#nodes + 1] = {lease[1], lease[2], state[1], state[2], state[3]}
end
for i = 7, #ARGV do
  leaving[#leaving + 1] = redis.call("HGET", lease_key(ARGV[i]), "holder")
end
return finish({NOW, redis.call("ZCARD", QUEUE), redis.call("LRANGE", QUEUE .. ":held", 0, -1),
               nodes, leaving})
"""

# The caller's replica closes: its queue entries and unclaimed grants go, its heartbeat too.
CLOSE = """
for _, member in ipairs(redis.call("ZRANGE", QUEUE, 0, -1)) do
  if replica_of(member) == REPLICA then drop(member) end
end
for _, id in ipairs(NODES) do
  local owner = redis.call("HGET", lease_key(id), "owner")
  if owner and replica_of(owner) == REPLICA and redis.call("DEL", grant_key(owner)) == 1 then
    unlease(id)
  end
end
redis.call("DEL", alive_key(REPLICA))
return finish(1)
"""

SCRIPTS = {
    name: _COMMON + body
    for name, body in {
        "acquire": ACQUIRE,
        "claim": CLAIM,
        "abandon": ABANDON,
        "release": RELEASE,
        "renew": RENEW,
        "admin": ADMIN,
        "state": STATE,
        "close": CLOSE,
    }.items()
}
