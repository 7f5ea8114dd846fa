-- ARGV: owners
-- A replica claims, for those of its waiters a wake-up message named (one a line), the nodes
-- granted to them, as each waiter's own claim would; no waiter is queued again (one that has
-- gone keeps no place). Answers owner, node, token for each node claimed.
-- A node outside the caller's pool (another replica's, not listed here yet) is left to the
-- waiter's own claim: a claim of the waiter's that crossed this call finds a node claimed
-- for it by its lease, and looks only among the pool's nodes; not found, it would queue the
-- waiter again, for a node it already holds.
local owners = lines(ARG.owners)
local LISTED = {}
for _, id in ipairs(NODES) do LISTED[id] = true end
beat()
local claimed = {}
for _, owner in ipairs(owners) do
  local id = grant_of(owner)
  if id and LISTED[id] and not is_gone(owner) then
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
