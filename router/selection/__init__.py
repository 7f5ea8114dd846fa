"""Choosing among equivalent upstream servers: filters, scorers, a picker, and each
server's health from the outcomes of the calls made to it."""

from router.selection.affinity import Affinity, PrefixAffinity, PrefixIndex, SessionAffinity
from router.selection.attempt import call_on
from router.selection.composition import PathSelection, ServedBy, sets_of
from router.selection.ejection import (
    EjectionPolicy,
    HealthBook,
    Outcome,
    outcome_of,
    status_outcome,
)
from router.selection.kv_events import KvEventsHub, KvEventsIndex, Source, endpoint_of
from router.selection.load import Load, LoadBook, LoadWeights, ServerLoad, parse_load
from router.selection.load_scraper import load_snapshot, scrape_forever, scrape_once
from router.selection.request_keys import AffinityKeys
from router.selection.server_probes import probe_servers_forever, probe_servers_once
from router.selection.server_set import (
    Choice,
    Filter,
    Healthy,
    LeastOutstanding,
    RandomOrder,
    RequestScorer,
    Scorer,
    ServerSet,
    Weights,
    default_set,
)

__all__ = [
    "Affinity",
    "AffinityKeys",
    "Choice",
    "EjectionPolicy",
    "Filter",
    "HealthBook",
    "Healthy",
    "KvEventsHub",
    "KvEventsIndex",
    "LeastOutstanding",
    "Load",
    "LoadBook",
    "LoadWeights",
    "Outcome",
    "PathSelection",
    "PrefixAffinity",
    "PrefixIndex",
    "RandomOrder",
    "RequestScorer",
    "Scorer",
    "ServedBy",
    "ServerLoad",
    "ServerSet",
    "SessionAffinity",
    "Source",
    "Weights",
    "call_on",
    "default_set",
    "endpoint_of",
    "load_snapshot",
    "outcome_of",
    "parse_load",
    "probe_servers_forever",
    "probe_servers_once",
    "scrape_forever",
    "scrape_once",
    "sets_of",
    "status_outcome",
]
