-- Takes each bucket's units if every binding one fits (none otherwise); a bucket that does
-- not bind is taken if it fits, and refuses nothing. Moved on by its units, a TAT may run at
-- most a window ahead of now. Answers, for each bucket, {1 if it fits else 0, how far its
-- TAT runs ahead of now after the call (ms), how long until its units would fit (ms, "0"
-- when they do)}; the numbers as strings, since Redis would cut a Lua number to an integer.
local buckets, taken = {}, true
for i = 1, #KEYS do
  local b = bucket(i)
  b.ahead = b.tat - NOW + span(b, b.units)
  b.fits = b.ahead <= b.window + SLACK_MS
  if b.binds and not b.fits then taken = false end
  buckets[i] = b
end
local reply = {}
for _, b in ipairs(buckets) do
  if taken and b.fits then
    keep(b, NOW + b.ahead)
    table.insert(reply, 1)
    table.insert(reply, ms(b.ahead))
    table.insert(reply, "0")
  else
    local retry = "0"
    if not b.fits then
      retry = ms(b.ahead - b.window)
      if b.units > b.limit then retry = ms(b.tat - NOW) end  -- never fits: until full
    end
    table.insert(reply, b.fits and 1 or 0)
    table.insert(reply, ms(b.tat - NOW))
    table.insert(reply, retry)
  end
end
return reply
