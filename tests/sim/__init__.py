"""Tests of the simulators (sim/), over real sockets and processes."""
