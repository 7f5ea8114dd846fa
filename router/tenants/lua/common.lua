-- Prepended to both scripts (after the constants limiter.py shares with them): the call's
-- bucket, its rate, and the server's clock.
--
-- KEYS[1]: the bucket: a string, its theoretical arrival time (TAT) in ms since
-- 2024-01-01 UTC (smaller numbers than since 1970, so finer doubles), written with %.17g
-- so that it reads back as the same double. It expires once the bucket is full again.
-- ARGV[1]: the rate (units per window); ARGV[2]: the call's units (take: its cost; settle:
-- the units charged, or given back if negative); ARGV[3]: the window (ms). No other key is
-- touched.

local EPOCH_S = 1704067200  -- 2024-01-01T00:00:00Z
local clock = redis.call("TIME")
local NOW = (tonumber(clock[1]) - EPOCH_S) * 1000 + tonumber(clock[2]) / 1000
local LIMIT, UNITS, WINDOW_MS = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
-- A bucket with no key, or a TAT already past, is full: its TAT is now.
local TAT = math.max(tonumber(redis.call("GET", KEYS[1])) or NOW, NOW)

local function ms(x) return string.format("%.17g", x) end

-- How long `units` take to come back at the rate (ms): one division, so that a whole
-- window's worth is exactly WINDOW_MS.
local function span(units) return units * WINDOW_MS / LIMIT end

-- Stores `tat` until the bucket is full again; a bucket already full needs no key.
local function keep(tat)
  local ahead = tat - NOW
  if ahead <= 0 then
    redis.call("DEL", KEYS[1])
  else
    redis.call("SET", KEYS[1], ms(tat), "PX", string.format("%d", math.ceil(ahead)))
  end
end
