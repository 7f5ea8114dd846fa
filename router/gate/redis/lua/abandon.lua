-- ARGV: owner node
-- The waiter gave up: out of the queue, and a node granted to it meanwhile (handed on, or
-- granted directly with the reply lost, or `node`, claimed but unusable) goes to the next
-- waiter. `node` is "" when the caller knows of no grant.
local owner = ARG.owner
local pending = grant_of(owner)
if pending and not DECLARED[pending] then return undeclared(pending) end
redis.call("ZADD", GONE, NOW + TTL, owner)
redis.call("ZREMRANGEBYSCORE", GONE, "-inf", "(" .. NOW)
drop(owner)
redis.call("HDEL", GRANTS, owner)
if pending and redis.call("HGET", lease_key(pending), "owner") == owner then
  unlease(pending)
end
if ARG.node ~= "" and redis.call("HGET", lease_key(ARG.node), "owner") == owner then
  unlease(ARG.node)
end
release_owned_by(owner)
return finish(1)
