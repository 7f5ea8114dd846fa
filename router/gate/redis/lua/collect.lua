-- ARGV: owners
-- A replica claims, for those of its waiters a wake-up message named (one a line), the nodes
-- granted to them, as each waiter's own claim would; no waiter is queued again (one that has
-- gone keeps no place). Answers owner, node, token for each node claimed.
local owners = lines(ARG.owners)
for _, owner in ipairs(owners) do
  local pending = grant_of(owner)
  if pending and not DECLARED[pending] then return undeclared(pending) end
end
beat()
local claimed = {}
for _, owner in ipairs(owners) do
  local id = grant_of(owner)
  if id and not is_gone(owner) then
    redis.call("HDEL", GRANTS, owner)
    local held = redis.call("HMGET", lease_key(id), "owner", "token")
    if held[1] == owner then
      redis.call("PEXPIRE", lease_key(id), TTL)
      claimed[#claimed + 1] = owner
      claimed[#claimed + 1] = id
      claimed[#claimed + 1] = tonumber(held[2])
    end
  end
end
return claimed
