-- ARGV: owner holder score remaining_ms share
-- A queued waiter looks for its grant; an entry lost meanwhile (its replica looked dead,
-- or the server restarted) is put back at its old place.
local owner, holder, score = ARG.owner, ARG.holder, ARG.score
local remaining = tonumber(ARG.remaining_ms)
local pending = grant_of(owner)
if pending and not DECLARED[pending] then return undeclared(pending) end
beat()
if is_gone(owner) then return {"gone"} end
-- A node handed over to this waiter in its replica's release reply has no grant entry: the
-- claim that crossed that reply finds it by its lease.
local function handed_over()
  for _, id in ipairs(NODES) do
    local held = redis.call("HMGET", lease_key(id), "owner", "token")
    if held[1] == owner then
      redis.call("PEXPIRE", lease_key(id), TTL)
      return {"granted", id, tonumber(held[2])}
    end
  end
  return nil
end
local function claim()
  local id = grant_of(owner)
  if not id then
    if redis.call("ZSCORE", QUEUE, owner) then return nil end  -- still waiting
    return handed_over()
  end
  redis.call("HDEL", GRANTS, owner)
  local held = redis.call("HMGET", lease_key(id), "owner", "token")
  if held[1] ~= owner then return nil end
  redis.call("PEXPIRE", lease_key(id), TTL)
  return {"granted", id, tonumber(held[2])}
end
local reply = claim()
if reply then return finish(reply) end
if not redis.call("ZSCORE", QUEUE, owner) then enqueue(owner, holder, score, remaining, ARG.share) end
fill()
reply = claim()
if reply then return finish(reply) end
if in_service() == 0 then
  drop(owner)
  return finish({"no_node"})
end
return finish({"waiting"})
