-- ARGV: owners tokens landed
-- The leases on the other nodes (ARGV[7]), whose owners, tokens and whether the request's
-- transfer has reached its node ("1" or "0") come one a line in the same order: each one
-- still held is refreshed, and its node remembers a transfer that has landed (should the
-- lease expire later, nothing of it is still on its way). Refreshes the caller's heartbeat
-- too. Answers 1 for each lease still held, 0 for each one lost.
beat()
local owners, tokens, landed = lines(ARG.owners), lines(ARG.tokens), lines(ARG.landed)
local held = {}
for i, id in ipairs(OTHERS) do
  local lease = redis.call("HMGET", lease_key(id), "owner", "token")
  if lease[1] == owners[i] and lease[2] == tokens[i] then
    redis.call("PEXPIRE", lease_key(id), TTL)
    if landed[i] == "1" then redis.call("HSET", node_key(id), "landed", tokens[i]) end
    held[#held + 1] = 1
  else
    held[#held + 1] = 0
  end
end
return held
