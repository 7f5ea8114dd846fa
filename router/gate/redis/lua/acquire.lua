-- ARGV: owner holder priority wait_ms max_queue
-- A free node goes to the caller only if nobody waits; else it queues (or is refused).
local owner, holder = ARG.owner, ARG.holder
local priority, wait_ms = tonumber(ARG.priority), tonumber(ARG.wait_ms)
local max_queue = tonumber(ARG.max_queue)
beat()
if is_gone(owner) then return {"gone"} end
fill()
prune()
if redis.call("ZCARD", QUEUE) == 0 then
  local id = free_node()
  if id then return finish({"granted", id, lease(id, owner, holder)}) end
end
if in_service() == 0 then return finish({"no_node"}) end
if redis.call("ZCARD", QUEUE) >= max_queue then return finish({"queue_full"}) end
if wait_ms <= 0 then return finish({"pool_saturated"}) end
local arrival = redis.call("INCR", SEQ)
local score = string.format("%.17g", -priority * 2^40 + arrival)
enqueue(owner, holder, score, wait_ms)
return finish({"queued", score})
