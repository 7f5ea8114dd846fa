"""The life of TileRT nodes above the slot state: what each node runs and can do (facts),
nodes found through DNS (discovery), and the prober that takes them out and back in."""
