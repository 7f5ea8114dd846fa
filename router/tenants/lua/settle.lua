-- Moves the TAT by ARGV[2] units, unchecked (a charge may run it past the window, a refund
-- never takes it before now). Answers nothing.
keep(TAT + span(UNITS))
