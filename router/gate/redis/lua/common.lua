-- Prepended to every script: the call's declared keys and arguments, the server's clock,
-- the helpers the scripts share, the check that this release reads the state's format, and
-- the check that the pool's state was not lost.
--
-- KEYS: the pool's queue, wait, held, epoch, grants and gone keys, the deployment's alive
-- key, the pool's shares and shared keys, the deployment's format key, then three keys
-- (state, lease, probe) for each node named in ARGV[6] and ARGV[7], in that order. No
-- other key is touched.
-- ARGV: the wake-up channel, the lease TTL (ms), the failure threshold, the caller's
-- replica, the pool's epoch as the caller knows it ("" at first), the pool's node ids in
-- grant order and the other node ids this call touches (one a line), the time (ms) a queued
-- waiter has to claim a node granted to it, then the script's own arguments as name, value
-- pairs (its header's `ARGV:` line names them).

local QUEUE, WAIT, HELD, EPOCH_KEY, GRANTS, GONE, ALIVE, SHARES, SHARED, FORMAT_KEY =
  unpack(KEYS, 1, 10)
local CHANNEL, TTL, THRESHOLD = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local REPLICA, KNOWN_EPOCH = ARGV[4], ARGV[5]

local function lines(text)
  local out = {}
  for line in string.gmatch(text, "[^\n]+") do out[#out + 1] = line end
  return out
end

local NODES, OTHERS = lines(ARGV[6]), lines(ARGV[7])
local CLAIM_MS = tonumber(ARGV[8])
local ARG = {}
for i = 9, #ARGV, 2 do ARG[ARGV[i]] = ARGV[i + 1] end

local DECLARED = {}
do
  local k = 10
  for _, ids in ipairs({NODES, OTHERS}) do
    for _, id in ipairs(ids) do
      DECLARED[id] = {KEYS[k + 1], KEYS[k + 2], KEYS[k + 3]}
      k = k + 3
    end
  end
end

local clock = redis.call("TIME")
local NOW = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local granted = {}
-- A script whose caller hands grants over to its own waiters (`release`) sets HAND_OVER:
-- a node granted to one of the caller's waiters is then claimed at once, and named in the
-- reply (`handed`: owner, node, token, ...) instead of waiting for that waiter's claim.
local HAND_OVER = false
local handed = {}

local function node_key(id) return DECLARED[id][1] end
local function lease_key(id) return DECLARED[id][2] end
local function probe_key(id) return DECLARED[id][3] end
local function replica_of(member) return string.match(member, "^[^|]*") end

-- A node another replica granted, whose keys the caller did not declare: the caller runs
-- the script again with them. Checked before the script writes anything.
local function undeclared(id)
  return redis.error_reply("UNDECLARED " .. id)
end

local function beat()
  redis.call("ZADD", ALIVE, NOW + TTL, REPLICA)
  redis.call("ZREMRANGEBYSCORE", ALIVE, "-inf", "(" .. NOW)
end

local function alive(replica)
  local until_ms = redis.call("ZSCORE", ALIVE, replica)
  return until_ms and tonumber(until_ms) >= NOW
end

local function is_gone(member)
  local until_ms = redis.call("ZSCORE", GONE, member)
  return until_ms and tonumber(until_ms) >= NOW
end

-- The node granted to a queued waiter and not claimed yet (nil once the grant expired).
local function grant_of(member)
  local value = redis.call("HGET", GRANTS, member)
  if not value then return nil end
  local until_ms, id = string.match(value, "^(%d+)|(.*)$")
  if tonumber(until_ms) < NOW then return nil end
  return id
end

local function usable(id)
  local state = redis.call("HMGET", node_key(id), "out_ms", "drained")
  return not state[1] and not state[2]
end

-- Nodes that serve, or will once a probe has flushed them (EXPECTED_BACK, prepended from
-- router/gate/circuit_breaker.py): waiters keep waiting for them.
local function in_service()
  local n = 0
  for _, id in ipairs(NODES) do
    local state = redis.call("HMGET", node_key(id), "out_ms", "drained", "reason")
    if not state[2] and (not state[1] or EXPECTED_BACK[state[3]]) then n = n + 1 end
  end
  return n
end

-- A lease that ran out unreleased: its holder (dead, paused, cut off) may have left a
-- transfer on the node, or may still have one on its way. Out until a probe has flushed it
-- (`stale_rid` names the request to flush), and, when the holder's prefill had not ended by
-- its last renewal (`landed` is the token of the last lease whose transfer had), with the
-- time from which that transfer may still arrive (`stale_ms`).
local function lease_expired(id)
  local key = node_key(id)
  local held = redis.call("HMGET", key, "held", "token", "landed")
  redis.call("HSET", key, "stale_rid", held[1])
  if held[3] ~= held[2] then redis.call("HSET", key, "stale_ms", NOW) end
  redis.call("HDEL", key, "held")
  if redis.call("HEXISTS", key, "out_ms") == 0 then
    redis.call("HSET", key, "out_ms", NOW, "reason", "lease_expired")
  end
end

local function expired_unnoticed(id)
  return redis.call("EXISTS", lease_key(id)) == 0
    and redis.call("HEXISTS", node_key(id), "held") == 1
end

local function free_node()
  for _, id in ipairs(NODES) do
    if redis.call("EXISTS", lease_key(id)) == 0 and usable(id) then  -- a held node: one read
      if redis.call("HEXISTS", node_key(id), "held") == 0 then return id end
      lease_expired(id)
    end
  end
  return nil
end

-- The tenants' fair share (router/gate/fair_share.py, whose policy this mirrors). SHARED:
-- waiter -> "<tenant>|<weight>|<max_nodes or empty>", for a waiter whose share is not the
-- default one (none: the default tenant, weight 1, no cap; so are the waiters of an earlier
-- release). SHARES: tenant -> its virtual node time (seconds, weighted), and "|clock" (no
-- tenant's name has a "|"): the pool's virtual clock. A lease names its tenant and weight.
local DEFAULT_TENANT = "default"

local function parse_share(value)
  if not value then return DEFAULT_TENANT, 1, nil end
  local tenant, weight, cap = string.match(value, "^([^|]*)|([^|]*)|(.*)$")
  return tenant, tonumber(weight), tonumber(cap)
end

local function share_of(member) return parse_share(redis.call("HGET", SHARED, member)) end

-- Whether shares are in play in this pool: from the first request of another share than
-- the default one, the pool keeps virtual times (SHARES exists); until then the scripts do
-- none of the bookkeeping, and a pool of one tenant pays nothing for it.
local FAIR = nil
local function fair()
  if FAIR == nil then FAIR = redis.call("EXISTS", SHARES) == 1 end
  return FAIR
end

local function start_fair()
  if not fair() then
    redis.call("HSET", SHARES, "|clock", "0")
    FAIR = true
  end
end

local function seconds(x) return string.format("%.17g", x) end

local VCLOCK = nil
local function vclock()
  if not VCLOCK then VCLOCK = tonumber(redis.call("HGET", SHARES, "|clock")) or 0 end
  return VCLOCK
end

local TYPICAL = nil
-- The pool's median hold (seconds), as hold_times.py's median_s.
local function typical_hold()
  if TYPICAL then return TYPICAL end
  local recent = redis.call("LRANGE", HELD, 0, -1)
  if #recent < HOLD_MIN_SAMPLES then
    TYPICAL = HOLD_INITIAL_S
  else
    local ordered = {}
    for i, v in ipairs(recent) do ordered[i] = tonumber(v) end
    table.sort(ordered)
    TYPICAL = ordered[math.min(#ordered, math.floor(0.5 * #ordered) + 1)]
  end
  return TYPICAL
end

-- Per tenant: {nodes of the pool it holds, their weighted time so far (each at least the
-- typical hold)}.
local function holding()
  local out = {}
  for _, id in ipairs(NODES) do
    local held = redis.call("HMGET", lease_key(id), "since", "tenant", "weight")
    if held[1] then
      local tenant = held[2] or DEFAULT_TENANT
      local held_s = math.max((NOW - tonumber(held[1])) / 1000, typical_hold())
      local sum = out[tenant] or {0, 0}
      out[tenant] = {sum[1] + 1, sum[2] + held_s / (tonumber(held[3]) or 1)}
    end
  end
  return out
end

local function held_by(holds, tenant)
  local sum = holds[tenant]
  if sum then return sum[1], sum[2] end
  return 0, 0
end

local function below_cap(holds, tenant, cap)
  return not cap or held_by(holds, tenant) < cap
end

local function virtual_of(holds, tenant)
  local used = tonumber(redis.call("HGET", SHARES, tenant)) or vclock()
  local _, held_s = held_by(holds, tenant)
  return used + held_s
end

-- A tenant that holds no node asks: no credit from its idle time.
local function lift(holds, tenant)
  if held_by(holds, tenant) > 0 then return end
  local used = tonumber(redis.call("HGET", SHARES, tenant))
  if used and used <= vclock() then redis.call("HDEL", SHARES, tenant) end
end

local function served_at(virtual)
  if virtual > vclock() then
    VCLOCK = virtual
    redis.call("HSET", SHARES, "|clock", seconds(virtual))
  end
end

-- Beyond MAX_TENANTS, those nearest the clock are forgotten (no entry: at the clock).
local function forget_tenants()
  local all = redis.call("HGETALL", SHARES)
  local ahead = {}
  for i = 1, #all, 2 do
    local v = tonumber(all[i + 1])
    if all[i] ~= "|clock" and v > vclock() then ahead[#ahead + 1] = {all[i], v} end
  end
  table.sort(ahead, function(a, b) return a[2] > b[2] end)
  redis.call("DEL", SHARES)
  redis.call("HSET", SHARES, "|clock", seconds(vclock()))
  for i = 1, math.min(#ahead, math.floor(MAX_TENANTS / 2)) do
    redis.call("HSET", SHARES, ahead[i][1], seconds(ahead[i][2]))
  end
end

-- A node held `held_s` by a tenant of `weight` has been given back.
local function charge(tenant, weight, held_s)
  local used = tonumber(redis.call("HGET", SHARES, tenant)) or vclock()
  redis.call("HSET", SHARES, tenant, seconds(used + held_s / weight))
  if redis.call("HLEN", SHARES) > MAX_TENANTS + 1 then forget_tenants() end
end

local function enqueue(member, holder, score, wait_ms, share)
  redis.call("ZADD", QUEUE, score, member)
  redis.call("HSET", WAIT, member, string.format("%d|%s", NOW + wait_ms + TTL, holder))
  if share ~= "" then redis.call("HSET", SHARED, member, share) end
end

local function drop(member)
  redis.call("ZREM", QUEUE, member)
  redis.call("HDEL", WAIT, member)
  redis.call("HDEL", SHARED, member)
end

local function stale(member)
  local meta = redis.call("HGET", WAIT, member)
  if not meta or tonumber(string.match(meta, "^%d+")) < NOW then return true end
  return not alive(replica_of(member))
end

local function head()
  while true do
    local member = redis.call("ZRANGE", QUEUE, 0, 0)[1]
    if not member or not stale(member) then return member end
    drop(member)
  end
end

-- The waiter a free node goes to, or nil while none may hold one more: of the highest
-- priority with such a waiter, the tenant with the least virtual time, its earliest due.
-- The queue's order is priority, then due (acquire.lua's score): a priority is the score
-- in halves, ceil(-score / 2^39), while every due time is under 2^39 ms past 2024 (2041).
local function choose(holds)
  if redis.call("HLEN", SHARED) == 0 then return head() end  -- one tenant, no cap
  local queued = redis.call("ZRANGE", QUEUE, 0, -1, "WITHSCORES")
  local band, best, best_virtual, seen = nil, nil, nil, {}
  for i = 1, #queued, 2 do
    local member = queued[i]
    local priority = math.ceil(-tonumber(queued[i + 1]) / 2^39)
    if band and priority ~= band then break end
    if stale(member) then
      drop(member)
    else
      local tenant, _, cap = share_of(member)
      if not seen[tenant] and below_cap(holds, tenant, cap) then
        band = priority
        local virtual = virtual_of(holds, tenant)
        if not best or virtual < best_virtual then best, best_virtual = member, virtual end
      end
      seen[tenant] = true  -- its first waiter is its earliest due
    end
  end
  return best
end

local function lease(id, owner, holder, share)
  local token = redis.call("HINCRBY", node_key(id), "token", 1)
  redis.call("HSET", lease_key(id), "owner", owner, "holder", holder, "token", token,
             "since", NOW)
  if share then  -- none: the default share
    local tenant, weight = parse_share(share)
    redis.call("HSET", lease_key(id), "tenant", tenant, "weight", seconds(weight))
  end
  redis.call("PEXPIRE", lease_key(id), TTL)
  redis.call("HSET", node_key(id), "held", holder)
  return token
end

local function unlease(id)
  redis.call("DEL", lease_key(id))
  redis.call("HDEL", node_key(id), "held")
end

-- A grant not claimed: its node was never used (a waiter learns of its node only by
-- claiming it), so it is free again at once. A node the caller did not declare keeps its
-- lease, which expires (the node is then flushed before it serves again).
local function ungrant(member, id)
  redis.call("HDEL", GRANTS, member)
  if DECLARED[id] and redis.call("HGET", lease_key(id), "owner") == member then
    unlease(id)
  end
end

-- A replica that looks dead: its heartbeat ran out, or it let a grant's claim window pass
-- (it neither heard the wake-up nor polled). Its waiters and unclaimed grants go, so that
-- they capture no more nodes; a replica that was only slow puts its waiters back at their
-- old places at its next claim. The caller itself is alive.
local function evict(replica)
  if replica ~= REPLICA then
    redis.call("ZREM", ALIVE, replica)
    for _, member in ipairs(redis.call("ZRANGE", QUEUE, 0, -1)) do
      if replica_of(member) == replica then drop(member) end
    end
  end
  local grants = redis.call("HGETALL", GRANTS)
  for i = 1, #grants, 2 do
    if replica_of(grants[i]) == replica then
      ungrant(grants[i], string.match(grants[i + 1], "|(.*)$"))
    end
  end
end

local function expire_grants()
  local grants = redis.call("HGETALL", GRANTS)
  for i = 1, #grants, 2 do
    local member = grants[i]
    if redis.call("HEXISTS", GRANTS, member) == 1 then  -- not gone with an evicted replica
      local replica = replica_of(member)
      if tonumber(string.match(grants[i + 1], "^%d+")) < NOW or not alive(replica) then
        evict(replica)
      end
    end
  end
end

local function prune()
  for _, member in ipairs(redis.call("ZRANGE", QUEUE, 0, -1)) do
    if stale(member) then drop(member) end
  end
  -- Shares of waiters an earlier release's script dropped (it knows nothing of them).
  if redis.call("HLEN", SHARED) > redis.call("ZCARD", QUEUE) then
    for _, member in ipairs(redis.call("HKEYS", SHARED)) do
      if not redis.call("ZSCORE", QUEUE, member) then redis.call("HDEL", SHARED, member) end
    end
  end
  expire_grants()
end

local function fill()
  expire_grants()
  local id = free_node()
  while id do
    local holds = fair() and holding() or {}
    local member = choose(holds)
    if not member then return end
    local share = redis.call("HGET", SHARED, member)
    if fair() then served_at(virtual_of(holds, (parse_share(share)))) end
    local token = lease(id, member, string.match(redis.call("HGET", WAIT, member), "|(.*)$"),
                        share)
    drop(member)
    if HAND_OVER and replica_of(member) == REPLICA then
      handed[#handed + 1] = member
      handed[#handed + 1] = id
      handed[#handed + 1] = token
    else
      redis.call("HSET", GRANTS, member, string.format("%d|%s", NOW + CLAIM_MS, id))
      granted[#granted + 1] = member
    end
    id = free_node()
  end
end

-- Name grantees to their replicas: each replica's on its own channel (CHANNEL/<replica>),
-- which only that replica hears, so that a grant wakes no other replica. Those of a replica
-- that nobody heard there (one of an earlier release, which listens only on CHANNEL, or
-- one between two subscriptions; on a Cluster, one subscribed through another node, as
-- PUBLISH counts the node's own subscribers) are named on the shared channel too.
local function announce(members)
  local replicas, of_replica = {}, {}
  for _, member in ipairs(members) do
    local replica = replica_of(member)
    if not of_replica[replica] then
      replicas[#replicas + 1] = replica
      of_replica[replica] = {}
    end
    table.insert(of_replica[replica], member)
  end
  local unheard = {}
  for _, replica in ipairs(replicas) do
    local names = table.concat(of_replica[replica], " ")
    if redis.call("PUBLISH", CHANNEL .. "/" .. replica, names) == 0 then
      unheard[#unheard + 1] = names
    end
  end
  if #unheard > 0 then redis.call("PUBLISH", CHANNEL, table.concat(unheard, " ")) end
end

-- Hand free nodes on, tell the grantees (everyone, if no node is left to wait for).
local function finish(reply)
  fill()
  if redis.call("ZCARD", QUEUE) > 0 and in_service() == 0 then  -- no waiter: no node read
    redis.call("PUBLISH", CHANNEL, "*")
  elseif #granted > 0 then
    announce(granted)
  end
  return reply
end

local function release_owned_by(owner)
  for _, id in ipairs(NODES) do
    if redis.call("HGET", lease_key(id), "owner") == owner then unlease(id) end
  end
end

-- The newest version of this state any release's script has written (none: version 1, or
-- nothing yet; see state_format.py): a release that does not read it touches nothing, and
-- one that writes a newer one marks it before it writes.
local WRITTEN = redis.call("GET", FORMAT_KEY)
if WRITTEN and not STATE_READS[WRITTEN] then
  return redis.error_reply("FORMAT " .. WRITTEN)
end
if not WRITTEN or tonumber(WRITTEN) < STATE_WRITES then
  redis.call("SET", FORMAT_KEY, STATE_WRITES)
end

local EPOCH = redis.call("GET", EPOCH_KEY)
if not EPOCH then
  EPOCH = string.format("%d-%s", NOW, REPLICA)
  redis.call("SET", EPOCH_KEY, EPOCH)
end
if KNOWN_EPOCH ~= EPOCH then
  if KNOWN_EPOCH ~= "" then
    for _, id in ipairs(NODES) do
      if redis.call("EXISTS", lease_key(id)) == 0
          and redis.call("HEXISTS", node_key(id), "out_ms") == 0 then
        redis.call("HSET", node_key(id), "out_ms", NOW, "reason", "state_lost")
      end
    end
  end
  return redis.error_reply("EPOCH " .. EPOCH)
end
