"""What one model's servers and nodes have shown of their speed, learned from the gateway's
own calls as each request ends (`learn`), and what the predictor reads of it.

* A prefill server's prefill time, a line in the prompt tokens it had to compute.
* A vLLM server's time to first token when it serves a request whole, a line in the same.
* A vLLM decode server's gap between tokens, a line in the requests it was running.
* A TileRT node's gap between tokens (one request at a time: a mean per node).
* The hand-off from a prefill's end to the first token from the decode side, per way.

Until a figure has been measured, the model's `objectives` settings stand in for it. Keys
are configured servers and nodes only (no client can add one), and at most `MAX_KEYS`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from router.config import ObjectivesConfig
from router.objectives.fits import MIN_SAMPLES, Average, Line, LinearFit

MAX_KEYS = 4096
_Learner = TypeVar("_Learner", LinearFit, Average)


class Timings:
    def __init__(self, config: ObjectivesConfig) -> None:
        self.config = config
        self._memory = config.memory
        ms = 1e-3
        self.prefill_prior = Line(config.prefill_base_ms * ms, config.prefill_ms_per_token * ms)
        per_running = config.itl_ms_per_running * ms
        self.gap_prior = Line(config.itl_ms * ms - per_running, per_running)
        self.whole_prior = Line(
            self.prefill_prior.intercept + config.itl_ms * ms, self.prefill_prior.slope
        )
        self.node_gap_prior = config.tilert_itl_ms * ms
        self.handoff_prior = config.handoff_ms * ms
        self._prefill: dict[str, LinearFit] = {}
        self._whole: dict[str, LinearFit] = {}
        self._gap: dict[str, LinearFit] = {}
        self._node_gap: dict[str, Average] = {}
        self._handoff: dict[str, Average] = {}

    # -- what the predictor reads --------------------------------------------------------

    def prefill_s(self, url: str, tokens: int) -> float:
        return _predict(self._prefill, url, tokens, self.prefill_prior)

    def whole_ttft_s(self, url: str, tokens: int) -> float:
        return _predict(self._whole, url, tokens, self.whole_prior)

    def gap_s(self, url: str, running: int) -> float:
        return _predict(self._gap, url, running, self.gap_prior)

    def prefill_line(self, url: str) -> Line:
        """The server's prefill time against the tokens it computes (the prior until it
        has been measured)."""
        return _line(self._prefill, url, self.prefill_prior)

    def gap_line(self, url: str) -> Line:
        """The decode server's gap between tokens against the requests it runs."""
        return _line(self._gap, url, self.gap_prior)

    def node_gap_s(self) -> float:
        """A node's gap, not knowing which node: the mean over the pool's measured nodes."""
        measured = [a.value for a in self._node_gap.values() if a.samples >= MIN_SAMPLES]
        return sum(measured) / len(measured) if measured else self.node_gap_prior

    def handoff_s(self, way: str) -> float:
        average = self._handoff.get(way)
        return self.handoff_prior if average is None else average.get(self.handoff_prior)

    # -- what a request's end teaches ----------------------------------------------------

    def learn_prefill(self, url: str, tokens: int, seconds: float) -> None:
        self._learner(self._prefill, url, LinearFit).add(tokens, seconds)

    def learn_whole(self, url: str, tokens: int, ttft_s: float) -> None:
        self._learner(self._whole, url, LinearFit).add(tokens, ttft_s)

    def learn_gap(self, url: str, running: int, gap_s: float) -> None:
        self._learner(self._gap, url, LinearFit).add(running, gap_s)

    def learn_node_gap(self, node: str, gap_s: float) -> None:
        self._learner(self._node_gap, node, Average).add(gap_s)

    def learn_handoff(self, way: str, seconds: float) -> None:
        self._learner(self._handoff, way, Average).add(seconds)

    def adopt(self, old: Timings) -> None:
        """A reload: what was learned stays (servers still configured go on from it)."""
        self._prefill.update(old._prefill)
        self._whole.update(old._whole)
        self._gap.update(old._gap)
        self._node_gap.update(old._node_gap)
        self._handoff.update(old._handoff)

    def snapshot(self) -> dict[str, Any]:
        """The lines and means predictions use, in milliseconds, for the admin API: each the
        assumption until it has `MIN_SAMPLES` observations."""

        def lines(fits: dict[str, LinearFit], prior: Line) -> dict[str, Any]:
            return {key: _line_ms(fit.line(prior), fit.samples) for key, fit in fits.items()}

        def means(averages: dict[str, Average], prior: float) -> dict[str, Any]:
            return {
                key: {"mean": round(a.get(prior) * 1e3, 3), "samples": a.samples}
                for key, a in averages.items()
            }

        return {
            "prefill_ms": lines(self._prefill, self.prefill_prior),
            "whole_ttft_ms": lines(self._whole, self.whole_prior),
            "gap_ms": lines(self._gap, self.gap_prior),
            "node_gap_ms": means(self._node_gap, self.node_gap_prior),
            "handoff_ms": means(self._handoff, self.handoff_prior),
        }

    def _learner(
        self, learners: dict[str, _Learner], key: str, make: Callable[[int], _Learner]
    ) -> _Learner:
        learner = learners.get(key)
        if learner is None:
            if len(learners) >= MAX_KEYS:
                del learners[next(iter(learners))]  # the oldest key
            learner = learners[key] = make(self._memory)
        return learner


def _predict(fits: dict[str, LinearFit], key: str, x: float, prior: Line) -> float:
    fit = fits.get(key)
    return max(0.0, prior.at(x)) if fit is None else fit.predict(x, prior)


def _line(fits: dict[str, LinearFit], key: str, prior: Line) -> Line:
    fit = fits.get(key)
    return prior if fit is None else fit.line(prior)


def _line_ms(line: Line, samples: int) -> dict[str, Any]:
    return {
        "base": round(line.intercept * 1e3, 3),
        "per_unit": round(line.slope * 1e3, 4),
        "samples": samples,
    }
