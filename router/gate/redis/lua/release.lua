-- ARGV: node owner token reports_health reason hard
-- Compare-and-delete: a lease that has been lost (expired, granted again) is not touched,
-- and its holder's verdict is not recorded (a second request may have disturbed the node).
-- `reports_health` is "1" when the request says something of the node's health; `reason` is ""
-- for a success; `hard` is "1" for a failure that takes the node out at once.
-- Answers 0 for a lost lease, else {1, then owner, node, token for each node handed over
-- to one of the caller's own waiters}.
local id = ARG.node
local held = redis.call("HMGET", lease_key(id), "owner", "token", "since", "tenant", "weight")
if held[1] ~= ARG.owner or held[2] ~= ARG.token then return 0 end
unlease(id)
local held_s = (NOW - tonumber(held[3])) / 1000
redis.call("LPUSH", HELD, string.format("%.3f", held_s))
if fair() then charge(held[4] or DEFAULT_TENANT, tonumber(held[5]) or 1, held_s) end
redis.call("LTRIM", HELD, 0, 63)
if ARG.reports_health == "1" then
  local key = node_key(id)
  if ARG.reason == "" then
    redis.call("HSET", key, "failures", 0)
  else
    local failures = redis.call("HINCRBY", key, "failures", 1)
    if redis.call("HEXISTS", key, "out_ms") == 0
        and (ARG.hard == "1" or failures >= THRESHOLD) then
      redis.call("HSET", key, "out_ms", NOW, "reason", ARG.reason)
    end
  end
end
HAND_OVER = true
local reply = finish({1})
for _, value in ipairs(handed) do reply[#reply + 1] = value end
return reply
