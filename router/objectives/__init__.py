"""Rules' objectives: each way of serving a request predicted from what the gateway has
measured of its servers and nodes, and the cheapest way that meets the objective chosen."""

from router.objectives.prediction import (
    Plan,
    Planned,
    Prediction,
    WayFacts,
    choose,
    planned,
    predict,
)
from router.objectives.timings import Timings

__all__ = ["Plan", "Planned", "Prediction", "Timings", "WayFacts", "choose", "planned", "predict"]
