-- Prepended to both scripts (after the constants limiter.py shares with them): the call's
-- buckets, their rates, and the server's clock.
--
-- KEYS: the buckets: each a string, its theoretical arrival time (TAT) in ms since
-- 2024-01-01 UTC (smaller numbers than since 1970, so finer doubles), written with %.17g
-- so that it reads back as the same double. It expires once the bucket is full again.
-- That is version 1 of a bucket's value; a later version starts with its number and a
-- colon (limiter.py), and a call that meets one refuses before it writes anything.
-- ARGV: for each key, four values: its rate (units per window), the call's units (take: its
-- cost; settle: the units charged, or given back if negative), the window (ms), and "1" if
-- the take binds (see take.lua). No other key is touched.

local EPOCH_S = 1704067200  -- 2024-01-01T00:00:00Z
local clock = redis.call("TIME")
local NOW = (tonumber(clock[1]) - EPOCH_S) * 1000 + tonumber(clock[2]) / 1000

local function ms(x) return string.format("%.17g", x) end

-- Each bucket's TAT, read once (nil: no key). A value that is not version 1 refuses the
-- call: `FORMAT <its version>` ("?" for a value of no version).
local STORED = {}
for i = 1, #KEYS do
  local raw = redis.call("GET", KEYS[i])
  if raw then
    STORED[i] = tonumber(raw)
    if not STORED[i] then
      local version = string.match(raw, "^(%d+):")
      return redis.error_reply("FORMAT " .. ((version ~= "1" and version) or "?"))
    end
  end
end

-- The i-th bucket: {key, rate, units, window (ms), binds, TAT (a bucket with no key, or a
-- TAT already past, is full: its TAT is now)}.
local function bucket(i)
  local at = 4 * (i - 1)
  local tat = math.max(STORED[i] or NOW, NOW)
  return {
    key = KEYS[i],
    limit = tonumber(ARGV[at + 1]),
    units = tonumber(ARGV[at + 2]),
    window = tonumber(ARGV[at + 3]),
    binds = ARGV[at + 4] == "1",
    tat = tat,
  }
end

-- How long `units` take to come back at the bucket's rate (ms): one division, so that a
-- whole window's worth is exactly the window.
local function span(b, units) return units * b.window / b.limit end

-- Stores `tat` until the bucket is full again; a bucket already full needs no key.
local function keep(b, tat)
  local ahead = tat - NOW
  if ahead <= 0 then
    redis.call("DEL", b.key)
  else
    redis.call("SET", b.key, ms(tat), "PX", string.format("%d", math.ceil(ahead)))
  end
end
