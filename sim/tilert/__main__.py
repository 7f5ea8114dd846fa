"""``python -m sim.tilert``: run one simulated TileRT decode node."""

from sim.tilert.cli import main

main()
