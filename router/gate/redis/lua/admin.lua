-- ARGV: action node reason quiet
-- An operator's or the prober's change of a node's service, or (`pool`, with node "") a
-- new node list: a node new to the pool serves the queue at once. `claim` (`reason` is then
-- the claim's lifetime in ms): the caller alone may flush an out node now; answers 0, or
-- {1, the request whose lease expired on the node unreleased ("" if none)}, and refuses
-- while that request's transfer may still be on its way and `quiet` ms have not passed
-- since its lease expired. `unclaim` ends the caller's own claim early; `readmit` is
-- refused while another replica's claim stands. `retire` takes a node out even while it is
-- held (its lease ends as usual, and an out node is never granted) and replaces the reason
-- of one already out.
local action, id = ARG.action, ARG.node
if action == "pool" then return finish(1) end
local key = node_key(id)
if action == "claim" then
  if expired_unnoticed(id) then lease_expired(id) end  -- out for another reason meanwhile
  local state = redis.call("HMGET", key, "out_ms", "drained", "stale_rid", "stale_ms")
  if not state[1] or state[2] or redis.call("EXISTS", lease_key(id)) == 1 then return 0 end
  if state[4] and NOW < tonumber(state[4]) + tonumber(ARG.quiet) then return 0 end
  if redis.call("SET", probe_key(id), REPLICA, "NX", "PX", tonumber(ARG.reason)) then
    return {1, state[3] or ""}
  end
  return 0
end
if action == "unclaim" then
  if redis.call("GET", probe_key(id)) == REPLICA then redis.call("DEL", probe_key(id)) end
  return 1
end
if action == "readmit" then
  local claimant = redis.call("GET", probe_key(id))
  if claimant and claimant ~= REPLICA then return 0 end
  redis.call("DEL", probe_key(id))
  redis.call("HSET", key, "failures", 0)
  redis.call("HDEL", key, "out_ms", "reason", "stale_rid", "stale_ms")
  -- A lease that expired while the node was out: the flush before this readmission
  -- cleared whatever it left.
  if redis.call("EXISTS", lease_key(id)) == 0 then redis.call("HDEL", key, "held") end
elseif action == "retire" then
  redis.call("HINCRBY", key, "failures", 1)
  if redis.call("HEXISTS", key, "out_ms") == 0 then redis.call("HSET", key, "out_ms", NOW) end
  redis.call("HSET", key, "reason", ARG.reason)
elseif action == "take_out" then
  if redis.call("EXISTS", lease_key(id)) == 1 then return 0 end
  redis.call("HINCRBY", key, "failures", 1)
  if redis.call("HEXISTS", key, "out_ms") == 0 then
    redis.call("HSET", key, "out_ms", NOW, "reason", ARG.reason)
  end
elseif action == "drain" then
  redis.call("HSET", key, "drained", 1)
elseif action == "undrain" then
  redis.call("HDEL", key, "drained")
end
return finish(1)
