"""The running gateway's wiring: the application state built at start-up, the objects one
configuration builds (`ConfigEpoch`: rules, keys, models), swapped whole on a reload."""
