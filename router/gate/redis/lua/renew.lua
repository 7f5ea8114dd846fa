-- ARGV: owners tokens
-- The leases on the other nodes (ARGV[7]), whose owners and tokens come one a line in the
-- same order: each one still held is refreshed. Refreshes the caller's heartbeat too.
-- Answers 1 for each lease still held, 0 for each one lost.
beat()
local owners, tokens = lines(ARG.owners), lines(ARG.tokens)
local held = {}
for i, id in ipairs(OTHERS) do
  local lease = redis.call("HMGET", lease_key(id), "owner", "token")
  if lease[1] == owners[i] and lease[2] == tokens[i] then
    redis.call("PEXPIRE", lease_key(id), TTL)
    held[#held + 1] = 1
  else
    held[#held + 1] = 0
  end
end
return held
