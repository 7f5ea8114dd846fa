"""Each vLLM server and proxy the configuration names, probed once however many models and
paths name it: `GET /health`, its load from `GET /metrics`, and the models `GET /v1/models`
lists, which should include each model's name (the gateway sends it as the request's
`model`).

Every call is bounded: each by `timeouts.connect_s` as a whole (a server that trickles its
answer is cut), `/metrics` by its own cap, the other bodies by `PROBE_MAX_BODY_BYTES`.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import TypeVar

from router.config import GatewayConfig, ProxyConfig, PullConfig, PushConfig
from router.errors import UpstreamError
from router.runtime.auth import upstream_credentials
from router.selection.load import Load, parse_load
from router.upstream import Target, Timeouts, Upstreams, vllm

# `/health` says nothing in its body and `/v1/models` lists a few ids: far less than this.
PROBE_MAX_BODY_BYTES = 1024 * 1024

HEALTH = Target("probe", "/health")
MODELS = Target("probe", "/v1/models")

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Use:
    """One way the configuration uses a server: for which model, in which role."""

    model: str
    role: str
    proxy: bool = False


@dataclass(slots=True)
class Findings:
    """What one server answered."""

    problem: str | None = None
    """Why it is unusable (unreachable, unhealthy); None if it is alive."""
    health: str = ""
    load: Load | None = None
    load_note: str = "no vLLM metrics"
    models: list[str] | None = None
    models_note: str = ""


def probing_upstreams(config: GatewayConfig) -> Upstreams:
    """The gateway's pools, keys and timeouts, with bodies capped for probing."""
    cap = min(config.upstreams.max_body_bytes, PROBE_MAX_BODY_BYTES)
    pools = config.upstreams.model_copy(update={"max_body_bytes": cap})
    return Upstreams(pools, Timeouts.of(config.timeouts), credentials=upstream_credentials(config))


def servers_of(config: GatewayConfig) -> dict[str, list[Use]]:
    """Every vLLM server and proxy URL of every model's paths, each once, with its uses."""
    uses: dict[str, list[Use]] = {}

    def add(urls: list[str], use: Use) -> None:
        for url in urls:
            if use not in (seen := uses.setdefault(url, [])):
                seen.append(use)

    for model in config.models:
        for pool in model.latency.pools if model.latency is not None else []:
            add(pool.prefill, Use(model.name, f"latency prefill, pool {pool.name}"))
        throughput = model.throughput
        if isinstance(throughput, ProxyConfig):
            add(throughput.urls, Use(model.name, "throughput proxy", proxy=True))
        elif isinstance(throughput, PullConfig):
            add(throughput.prefill, Use(model.name, "pull prefill"))
            add(throughput.decode, Use(model.name, "pull decode"))
        elif isinstance(throughput, PushConfig):
            add([engine.url for engine in throughput.prefill], Use(model.name, "push prefill"))
            add(throughput.decode, Use(model.name, "push decode"))
    return uses


async def probe_servers(config: GatewayConfig, upstreams: Upstreams) -> int:
    """One line per server, concurrently probed; 1 if one is unreachable or unhealthy."""
    servers = servers_of(config)
    found = await asyncio.gather(
        *(examine(upstreams, url, proxy=_proxy_only(uses)) for url, uses in servers.items())
    )
    failed = 0
    for (url, uses), findings in zip(servers.items(), found, strict=True):
        kind = "proxy" if _proxy_only(uses) else "vllm"
        where = f"{kind} {url} ({'; '.join(f'model {u.model}, {u.role}' for u in uses)})"
        if findings.problem is not None:
            print(f"error: {where}: {findings.problem}", file=sys.stderr)
            failed = 1
            continue
        print(f"{where}: {describe(findings)}")
        for warning in warnings(findings, [u.model for u in uses]):
            print(f"warning: {where}: {warning}", file=sys.stderr)
    return failed


def _proxy_only(uses: list[Use]) -> bool:
    return all(use.proxy for use in uses)


def describe(findings: Findings) -> str:
    load = findings.load
    figures = (
        findings.load_note
        if load is None
        else f"running {load.running:g}, waiting {load.waiting:g},"
        f" KV cache {load.kv_cache_usage:.1%}"
    )
    models = (
        f"models: {', '.join(findings.models) or 'none'}"
        if findings.models is not None
        else f"models: {findings.models_note}"
    )
    return f"{findings.health}, {figures}, {models}"


def warnings(findings: Findings, models: list[str]) -> list[str]:
    if findings.models is None:
        return [f"cannot tell which models it serves: {findings.models_note}"]
    served = ", ".join(findings.models) or "none"
    return [
        f"does not serve {name!r}, the model name the gateway sends (it serves: {served})"
        for name in dict.fromkeys(models)
        if name not in findings.models
    ]


async def examine(upstreams: Upstreams, url: str, *, proxy: bool) -> Findings:
    """`/health` first; if it is alive, `/metrics` and `/v1/models` together."""
    findings = Findings()
    bound_s = upstreams.timeouts.connect_s
    try:
        status = await _bounded(_health_status(upstreams, url), bound_s)
    except TimeoutError:
        findings.problem = f"no answer to /health within {bound_s:g} s"
        return findings
    except UpstreamError as exc:
        findings.problem = f"cannot reach it: {exc.message}"
        return findings
    if status == 200:
        findings.health = "healthy"
    elif status == 404 and proxy:  # a proxy may have no /health; the gateway counts it alive
        findings.health = "alive (no /health)"
    else:
        findings.problem = f"unhealthy: /health answered {status}"
        return findings
    await asyncio.gather(
        _read_load(upstreams, url, findings, bound_s),
        _read_models(upstreams, url, findings, bound_s),
    )
    return findings


async def _bounded(call: Awaitable[T], bound_s: float) -> T:
    async with asyncio.timeout(bound_s):
        return await call


async def _health_status(upstreams: Upstreams, url: str) -> int:
    """The status only: the body, whatever its size, is not read."""
    connect_s = upstreams.timeouts.connect_s
    reply = await upstreams.open(HEALTH, "GET", url, "/health", read_s=connect_s, total_s=connect_s)
    await reply.aclose()
    return reply.status


async def _read_load(upstreams: Upstreams, url: str, findings: Findings, bound_s: float) -> None:
    try:
        text = await _bounded(vllm.metrics_text(upstreams, url), bound_s)
    except TimeoutError:
        findings.load_note = f"no vLLM metrics (/metrics not read within {bound_s:g} s)"
        return
    except UpstreamError as exc:
        findings.load_note = f"no vLLM metrics ({exc.message})"
        return
    findings.load = None if text is None else parse_load(text)


async def _read_models(upstreams: Upstreams, url: str, findings: Findings, bound_s: float) -> None:
    try:
        reply = await _bounded(
            upstreams.call(MODELS, "GET", url, "/v1/models", read_s=upstreams.timeouts.connect_s),
            bound_s,
        )
    except TimeoutError:
        findings.models_note = f"unknown (/v1/models not read within {bound_s:g} s)"
        return
    except UpstreamError as exc:
        findings.models_note = f"unknown ({exc.message})"
        return
    if reply.status != 200:
        findings.models_note = f"unknown (/v1/models answered {reply.status})"
        return
    findings.models = model_ids(await reply.json())
    if findings.models is None:
        findings.models_note = "unknown (/v1/models is not a list of models)"


def model_ids(data: object) -> list[str] | None:
    """The ids of an OpenAI model list (`{"data": [{"id": ...}, ...]}`); None if it is not one."""
    entries = data.get("data") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        return None
    return [e["id"] for e in entries if isinstance(e, dict) and isinstance(e.get("id"), str)]
