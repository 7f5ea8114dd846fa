-- ARGV: owner holder priority wait_ms due_ms max_queue share
-- A free node goes to the caller only if no waiter may hold it (each is at its tenant's
-- cap); else the caller queues (or is refused). `share`: "<tenant>|<weight>|<max_nodes or
-- empty>", or "" for the default tenant's unweighted, uncapped share.
local owner, holder = ARG.owner, ARG.holder
local priority, wait_ms = tonumber(ARG.priority), tonumber(ARG.wait_ms)
local due_ms, max_queue = tonumber(ARG.due_ms), tonumber(ARG.max_queue)
local share = ARG.share
local tenant, _, cap = parse_share(share ~= "" and share or nil)
beat()
if is_gone(owner) then return {"gone"} end
fill()
prune()
if share ~= "" then start_fair() end
local holds = {}
if fair() then
  holds = holding()
  lift(holds, tenant)
end
local may_hold = below_cap(holds, tenant, cap)
if may_hold then
  local id = free_node()
  if id then
    if fair() then served_at(virtual_of(holds, tenant)) end
    return finish({"granted", id, lease(id, owner, holder, share ~= "" and share or nil)})
  end
end
if in_service() == 0 then return finish({"no_node"}) end
if redis.call("ZCARD", QUEUE) >= max_queue then return finish({"queue_full"}) end
if wait_ms <= 0 then return finish({may_hold and "pool_saturated" or "tenant_max_nodes"}) end
-- Served by priority, then earliest due: the waiter's deadline, or else its arrival
-- (`due_ms` from now: 0), on this server's clock (NOW) so that every replica's waiters
-- are ordered by one clock, in ms since 2024-01-01 UTC. The score is an exact integer in a
-- double: |priority| <= 2047 (gate.py clamps it), and the offset fits in 2^40 ms until
-- 2058-11-03, so |score| < 2047 * 2^40 + 2^40 < 2^53. Waiters due in the same millisecond
-- have equal scores, which Redis orders by member (`<replica>|<arrival>`, byte by byte).
local DUE_EPOCH_MS = 1704067200000  -- 2024-01-01T00:00:00Z
local score = string.format("%.17g", -priority * 2^40 + (NOW - DUE_EPOCH_MS + due_ms))
enqueue(owner, holder, score, wait_ms, share)
return finish({"queued", score})
