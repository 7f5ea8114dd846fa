"""How many TileRT nodes, prefill servers and decode servers each model needs, from what
the gateway sees of its load: the figures the autoscaling objects read."""

from router.capacity.sizing import READ_INTERVAL_S, PoolSize, Sizer

__all__ = ["READ_INTERVAL_S", "PoolSize", "Sizer"]
