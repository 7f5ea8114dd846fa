-- Takes ARGV[2] units if they fit: moved on by them, the TAT may run at most a window
-- (WINDOW_MS) ahead of now. Answers {1 if taken else 0, how far the TAT runs ahead of now
-- after the call (ms), how long until the units would fit (ms, "0" when taken)}; the
-- numbers as strings, since Redis would cut a Lua number to an integer.
local ahead = TAT - NOW + span(UNITS)
if ahead > WINDOW_MS + SLACK_MS then
  local retry = ahead - WINDOW_MS
  if UNITS > LIMIT then retry = TAT - NOW end  -- never fits: until the bucket is full
  return {0, ms(TAT - NOW), ms(retry)}
end
keep(NOW + ahead)
return {1, ms(ahead), "0"}
