-- ARGV: -
-- The caller's replica closes: its queue entries and unclaimed grants go, its heartbeat
-- too. (A grant of a node the caller does not know expires with its lease.)
for _, member in ipairs(redis.call("ZRANGE", QUEUE, 0, -1)) do
  if replica_of(member) == REPLICA then drop(member) end
end
local grants = redis.call("HGETALL", GRANTS)
for i = 1, #grants, 2 do
  local member = grants[i]
  if replica_of(member) == REPLICA then
    redis.call("HDEL", GRANTS, member)
    local id = string.match(grants[i + 1], "|(.*)$")
    if DECLARED[id] and redis.call("HGET", lease_key(id), "owner") == member then
      unlease(id)
    end
  end
end
redis.call("ZREM", ALIVE, REPLICA)
return finish(1)
