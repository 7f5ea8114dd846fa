-- Moves each bucket's TAT by its units, unchecked (a charge may run it past the window, a
-- refund never takes it before now). Answers nothing.
for i = 1, #KEYS do
  local b = bucket(i)
  keep(b, b.tat + span(b, b.units))
end
