-- ARGV: -
-- The other nodes are those leaving the pool (each may still be held).
-- The pool as every replica sees it: {now ms, waiting, hold times, per node {holder, since,
-- out_ms, reason, drained}, per leaving node its holder} (a missing value is nil).
prune()
fill()
local nodes, leaving = {}, {}
for _, id in ipairs(NODES) do
  local lease = redis.call("HMGET", lease_key(id), "holder", "since")
  local state = redis.call("HMGET", node_key(id), "out_ms", "reason", "drained")
  nodes[#nodes + 1] = {lease[1], lease[2], state[1], state[2], state[3]}
end
for i, id in ipairs(OTHERS) do
  leaving[i] = redis.call("HGET", lease_key(id), "holder")
end
return finish({NOW, redis.call("ZCARD", QUEUE), redis.call("LRANGE", HELD, 0, -1),
               nodes, leaving})
