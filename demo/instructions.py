"""What the demo prints once the gateway is up: the base URL, and a curl command and an
OpenAI SDK snippet for each path.

The example requests are not assumed: each candidate is classified with the
configuration's own rules, and only one that really takes the path is shown.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from typing import Any

from policies import classify, features_from_request, needs_prompt_tokens
from router.classify import capabilities
from router.config import GatewayConfig, compile_rules

PROMPT = "Say hello"
MAX_TOKENS = 64
CANDIDATE_HEADERS: tuple[dict[str, str], ...] = (
    {},
    {"x-workload": "batch"},
    {"x-pd-route": "throughput"},
    {"x-pd-route": "latency"},
)


@dataclass(frozen=True, slots=True)
class Example:
    """A chat request that the rules send down `path`, under rule `rule`."""

    path: str
    body: dict[str, Any]
    headers: dict[str, str]
    rule: str

    @property
    def stream(self) -> bool:
        return bool(self.body.get("stream"))


def find_example(config: GatewayConfig, path: str, *, stream: bool) -> Example | None:
    """The first model and candidate headers whose plain chat request takes `path`."""
    rules = compile_rules(config)
    models = capabilities(config)
    for model in config.models:
        body = {
            "model": model.name,
            "messages": [{"role": "user", "content": PROMPT}],
            "max_tokens": MAX_TOKENS,
            "stream": stream,
        }
        for headers in CANDIDATE_HEADERS:
            features = features_from_request(
                body, endpoint="chat", headers=headers, api_key_name=None
            )
            if needs_prompt_tokens(features, rules, models):
                continue  # a rule looks at the token count: not a plain example
            decision = classify(features, rules, models)
            if decision.path == path and decision.unavailable is None:
                return Example(path, body, dict(headers), decision.rule)
    return None


def instructions(config: GatewayConfig, base_url: str, replicas: list[str] | None = None) -> str:
    """The text printed once the gateway is ready; `replicas`, one line each, when several
    gateway replicas serve behind `base_url`."""
    latency = find_example(config, "latency", stream=True)
    throughput = find_example(config, "throughput", stream=False)
    lines = ["", f"Base URL: {base_url}", ""]
    for path, example in (("latency", latency), ("throughput", throughput)):
        if example is None:
            lines += [f"No plain chat request takes the {path} path under these rules.", ""]
            continue
        lines += [f"{_title(example)}:", curl(base_url, example), ""]
    if latency or throughput:
        snippet = sdk_snippet(base_url, latency, throughput)
        lines += ["OpenAI SDK (pip install openai):", "", snippet, ""]
    lines.append(
        "Every response names its path in the x-pd-route header (and its rule in x-pd-rule)."
    )
    if replicas:
        lines += ["", f"{len(replicas)} gateway replicas share one TileRT pool through Redis:"]
        lines += [f"  {replica}" for replica in replicas]
        lines.append(f"{base_url} hands each new connection to the next replica still running.")
        lines.append(
            "Kill one (kill -9 PID) and keep sending requests: the others serve them, and a"
            " node it held serves again once its lease expires."
        )
        lines.append("Ctrl-C stops the gateway replicas, Redis and every simulator.")
    else:
        lines.append("Ctrl-C stops the gateway and every simulator.")
    return "\n".join(lines)


def _title(example: Example) -> str:
    how = ", ".join(f"header {k}: {v}" for k, v in example.headers.items()) or "a plain request"
    mode = "streamed" if example.stream else "not streamed"
    return f"{example.path.capitalize()} path ({how}, rule {example.rule!r}, {mode})"


def curl(base_url: str, example: Example) -> str:
    """A copy-pasteable curl command sending `example`, response headers shown."""
    flags = "-siN" if example.stream else "-si"
    parts = [f"curl {flags} {shlex.quote(base_url + '/chat/completions')}"]
    parts.append("-H 'content-type: application/json'")
    parts += [f"-H {shlex.quote(f'{k}: {v}')}" for k, v in example.headers.items()]
    parts.append(f"-d {shlex.quote(json.dumps(example.body))}")
    return " \\\n  ".join(parts)


def sdk_snippet(base_url: str, latency: Example | None, throughput: Example | None) -> str:
    """A Python script making one OpenAI SDK call per path (streamed on the latency path)."""
    lines = [
        "from openai import OpenAI",
        "",
        f"client = OpenAI(base_url={base_url!r}, api_key='unused')",
    ]
    if latency is not None:
        lines += [
            "",
            f"# latency path (rule {latency.rule!r}), streamed",
            "stream = client.chat.completions.create(",
            *_arguments(latency),
            ")",
            "for chunk in stream:",
            "    if chunk.choices:",
            "        print(chunk.choices[0].delta.content or '', end='', flush=True)",
            "print()",
        ]
    if throughput is not None:
        lines += [
            "",
            f"# throughput path (rule {throughput.rule!r})",
            "reply = client.chat.completions.with_raw_response.create(",
            *_arguments(throughput),
            ")",
            "print(reply.headers['x-pd-route'], reply.parse().choices[0].message.content)",
        ]
    return "\n".join(lines)


def _arguments(example: Example) -> list[str]:
    body = example.body
    lines = [
        f"    model={body['model']!r},",
        f"    messages={body['messages']!r},",
        f"    max_tokens={body['max_tokens']!r},",
    ]
    if example.stream:
        lines.append("    stream=True,")
    if example.headers:
        lines.append(f"    extra_headers={example.headers!r},")
    return lines
