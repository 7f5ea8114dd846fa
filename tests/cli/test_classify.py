"""`pd-gateway classify`: one request per rule of each example rules file, explained offline."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from router.cli import main

EXAMPLES = Path(__file__).resolve().parents[2] / "policies" / "examples"
# Nothing listens on these ports: classify must never contact a backend.
CLOSED = "http://127.0.0.1:9"


def write_config(
    tmp_path: Path,
    rules_file: str,
    *,
    tokenizer: str = "deepseek",
    throughput: bool = True,
    releases: tuple[str, ...] = ("0.1.6",),
) -> Path:
    """One model `m` with a TileRT pool of each release in `releases`."""
    pools = [
        {
            "name": f"pool{i}",
            "tilert": release,
            "prefill": [f"http://127.0.0.1:{9 + i}"],
            "nodes": [{"host": "127.0.0.1", "ctrl_port": 9, "http_port": 9 + i}],
        }
        for i, release in enumerate(releases)
    ]
    model: dict[str, Any] = {
        "name": "m",
        "tokenizer": tokenizer,
        "latency": {"pools": pools, "max_seq_len": 131072},
    }
    if throughput:
        model["throughput"] = {"mode": "proxy", "urls": [CLOSED]}
    config = {"classification": {"rules_file": str(EXAMPLES / rules_file)}, "models": [model]}
    path = tmp_path / "router.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return path


def chat(**fields: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}


def run_classify(
    tmp_path: Path, config: Path, body: Any, headers: dict[str, str], *extra: str
) -> int:
    request = tmp_path / "body.json"
    request.write_text(json.dumps(body), encoding="utf-8")
    argv = ["classify", "--config", str(config), "--request", str(request), *extra]
    for name, value in headers.items():
        argv += ["--header", f"{name}={value}"]
    return main(argv)


DEFAULT_NAMES = {
    "interactive.yaml": "default",
    "api-key-tiers.yaml": "standard",
    "latency-first.yaml": "interactive",
}
CASES = [
    # interactive.yaml: default throughput; labelled interactive work takes latency.
    ("interactive.yaml", chat(), {"x-workload": "batch"}, "batch", "throughput"),
    ("interactive.yaml", chat(metadata={"workload": "eval"}), {}, "evals", "throughput"),
    ("interactive.yaml", chat(stream=True), {"x-workload": "voice"}, "voice", "latency"),
    ("interactive.yaml", chat(), {"x-workload": "agent-7"}, "agents", "latency"),
    (
        "interactive.yaml",
        chat(stream=True, max_tokens=512, tools=[{"type": "function", "function": {"name": "f"}}]),
        {"user-agent": "code-assist/2.1"},
        "coding",
        "latency",
    ),
    ("interactive.yaml", chat(), {"x-workload": "voice"}, "default", "throughput"),
    # api-key-tiers.yaml: tiers by the API key's name.
    (
        "api-key-tiers.yaml",
        chat(),
        {"x-pd-api-key-name": "eval-harness"},
        "internal-evals",
        "throughput",
    ),
    ("api-key-tiers.yaml", chat(), {"x-pd-api-key-name": "premium-acme"}, "premium", "latency"),
    ("api-key-tiers.yaml", chat(max_tokens=100), {"x-pd-api-key-name": "pro-7"}, "pro", "latency"),
    ("api-key-tiers.yaml", chat(), {}, "anonymous", "throughput"),
    ("api-key-tiers.yaml", chat(), {"x-pd-api-key-name": "acme"}, "standard", "throughput"),
    # latency-first.yaml: latency unless the request is better served natively.
    ("latency-first.yaml", chat(), {"x-priority": "batch"}, "batch", "throughput"),
    ("latency-first.yaml", chat(max_tokens=9000), {}, "long-generations", "throughput"),
    ("latency-first.yaml", chat(stream=True), {}, "interactive", "latency"),
]


@pytest.mark.parametrize(("rules", "body", "headers", "rule", "path"), CASES)
def test_each_example_rule(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    rules: str,
    body: dict[str, Any],
    headers: dict[str, str],
    rule: str,
    path: str,
) -> None:
    code = run_classify(tmp_path, write_config(tmp_path, rules), body, headers)
    out = capsys.readouterr().out.splitlines()
    assert code == 0
    default = rule == DEFAULT_NAMES[rules]
    assert ("no rule matched: default" if default else f"rule {rule!r} matched:") in out
    assert f"result: {path}" in out
    assert "response headers:" in out
    assert f"  x-pd-route: {path}" in out
    assert f"  x-pd-rule: {rule}" in out


ASSUMED = "assumed pool features: {} (what nodes of TileRT {} report; no node is asked:"
ASKED = " --features names others)"


@pytest.mark.parametrize(
    ("releases", "features", "path"),
    [
        (("0.1.6",), "ignore_eos", "latency"),
        (("0.1.5",), "none", "throughput"),
        (("0.1.5", "0.1.6"), "none", "throughput"),
    ],
)
def test_the_pools_features_are_assumed_from_its_release_and_said(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    releases: tuple[str, ...],
    features: str,
    path: str,
) -> None:
    # Serving lets `ignore_eos` onto the latency path when every node reports it, as the
    # engines of TileRT 0.1.6 do; a 0.1.5 node reports nothing.
    config = write_config(tmp_path, "latency-first.yaml", releases=releases)
    assert run_classify(tmp_path, config, chat(ignore_eos=True, stream=True), {}) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == ASSUMED.format(features, " and ".join(releases)) + ASKED
    assert f"result: {path}" in out
    reroute = [] if path == "latency" else ["  x-pd-reroute-reason: ignore_eos"]
    headers = out[out.index("response headers:") + 1 :]
    assert headers == [f"  x-pd-route: {path}", "  x-pd-rule: interactive", *reroute]


@pytest.mark.parametrize(
    ("features", "body", "path"),
    [
        ("none", chat(ignore_eos=True, stream=True), "throughput"),
        ("logprobs", chat(logprobs=True, stream=True), "latency"),
        ("logprobs,penalties", chat(presence_penalty=0.5, stream=True), "latency"),
        ("logprobs", chat(presence_penalty=0.5, stream=True), "throughput"),
    ],
)
def test_features_named_on_the_command_line_are_the_assumption(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], features: str, body: Any, path: str
) -> None:
    config = write_config(tmp_path, "latency-first.yaml")
    assert run_classify(tmp_path, config, body, {}, "--features", features) == 0
    out = capsys.readouterr().out.splitlines()
    named = ", ".join(sorted(features.split(",")))
    assert out[0] == f"assumed pool features: {named} (--features)"
    assert f"result: {path}" in out


def test_an_unknown_feature_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = write_config(tmp_path, "latency-first.yaml")
    with pytest.raises(SystemExit) as exit:
        run_classify(tmp_path, config, chat(), {}, "--features", "logprobs,telepathy")
    assert exit.value.code == 2
    assert "--features: not a feature: telepathy (known: " in capsys.readouterr().err


def test_a_dash_reads_the_request_from_standard_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    config = write_config(tmp_path, "latency-first.yaml")
    body = chat(n=2, max_tokens=100)
    assert run_classify(tmp_path, config, body, {}) == 0
    from_file = capsys.readouterr().out
    stdin = io.BytesIO(json.dumps(body).encode())
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(stdin))
    assert main(["classify", "--config", str(config), "--request", "-"]) == 0
    assert capsys.readouterr().out == from_file
    assert "  x-pd-reroute-reason: n" in from_file


def test_over_context_rule_from_token_ids(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A completions prompt given as token ids has an exact length, counted as given.
    body = {"model": "m", "prompt": [7] * 131072, "max_tokens": 1}
    config = write_config(tmp_path, "latency-first.yaml")
    code = run_classify(tmp_path, config, body, {})
    out = capsys.readouterr().out.splitlines()
    assert code == 0
    assert out[1].startswith("request: model 'm', completions, no stream, 131072 prompt tokens")
    assert "rule 'over-context' matched:" in out
    assert "  x-pd-rule: over-context" in out


def test_the_guard_reroute_and_its_header(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = write_config(tmp_path, "latency-first.yaml")
    code = run_classify(tmp_path, config, chat(n=2, max_tokens=100), {})
    out = capsys.readouterr().out.splitlines()
    assert code == 0
    assert "guard: re-routed to throughput (n)" in out
    assert out[-3:] == [
        "  x-pd-route: throughput",
        "  x-pd-rule: interactive",
        "  x-pd-reroute-reason: n",
    ]


@pytest.mark.parametrize(
    ("route", "honoured", "path"),
    [("throughput", True, "throughput"), ("latency", False, "throughput")],
)
def test_client_route_requests(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], route: str, honoured: bool, path: str
) -> None:
    # premium may ask for throughput; anonymous callers may not ask for latency.
    key = {"x-pd-api-key-name": "premium-acme"} if honoured else {}
    config = write_config(tmp_path, "api-key-tiers.yaml")
    code = run_classify(tmp_path, config, chat(), {**key, "x-pd-route": route})
    out = capsys.readouterr().out.splitlines()
    verdict = "honoured" if honoured else "ignored (not allowed)"
    assert code == 0
    assert f"client route: x-pd-route: {route!r} {verdict}" in out
    assert f"  x-pd-route: {path}" in out


def test_a_tokenizer_serve_cannot_load_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # classify takes the request in as the gateway does, with the model's tokenizer.
    config = write_config(tmp_path, "interactive.yaml", tokenizer="/nonexistent/tokenizer.json")
    assert run_classify(tmp_path, config, chat(), {}) == 2
    assert capsys.readouterr().err == (
        f"error: {config}: models[0] (m).tokenizer: "
        "no tokenizer.json at /nonexistent/tokenizer.json\n"
    )


def test_a_responses_body_is_taken_in_as_the_gateway_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Detected by its `input`; `max_output_tokens` is its budget; its prompt is counted."""
    config = write_config(tmp_path, "interactive.yaml")
    body = {"model": "m", "input": "word " * 70000, "max_output_tokens": 300}
    assert run_classify(tmp_path, config, body, {}) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1].startswith("request: model 'm', responses, no stream, ")
    assert out[1].endswith(", max_tokens 300")
    count = int(out[1].split(", ")[3].removesuffix(" prompt tokens"))
    assert 65536 <= count <= 80000
    assert "rule 'long-prompts' matched:" in out


def test_counts_with_the_models_tokenizer(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = write_config(tmp_path, "interactive.yaml")
    long_body = chat(messages=[{"role": "user", "content": "word " * 70000}])
    code = run_classify(tmp_path, config, long_body, {})
    out = capsys.readouterr().out.splitlines()
    assert code == 0
    request = out[1]
    assert request.startswith("request: model 'm', chat, no stream, ")
    count = int(request.split(", ")[3].removesuffix(" prompt tokens"))
    assert 65536 <= count <= 80000
    assert "rule 'long-prompts' matched:" in out
    assert f"  prompt_tokens = {count}, wanted >= 65536" in out


@pytest.mark.parametrize(
    ("fields", "endpoint"),
    [
        ({"messages": [{"role": "user", "content": "hi"}]}, "chat"),
        ({"prompt": "hi"}, "completions"),
        ({"input": "hi"}, "responses"),
        ({"input": [{"role": "user", "content": "hi"}], "instructions": "be brief"}, "responses"),
    ],
)
def test_the_endpoint_is_detected_from_the_body(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], fields: dict[str, Any], endpoint: str
) -> None:
    config = write_config(tmp_path, "interactive.yaml")
    assert run_classify(tmp_path, config, {"model": "m", **fields}, {}) == 0
    assert f", {endpoint}, " in capsys.readouterr().out.splitlines()[1]


def test_endpoint_flag_overrides_the_guess(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = write_config(tmp_path, "interactive.yaml")
    body = {"model": "m", "prompt": "hi"}
    assert run_classify(tmp_path, config, body, {}) == 0
    assert ", completions, " in capsys.readouterr().out.splitlines()[1]
    assert run_classify(tmp_path, config, body, {}, "--endpoint", "chat") == 2
    assert "not a valid chat request (messages)" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("workload", "way"),
    [("voice", "tilert"), ("chat", "proxy")],  # proxy: the native path's one way here
)
def test_an_objective_shows_each_way_predicted_and_the_choice(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], workload: str, way: str
) -> None:
    config = write_config(tmp_path, "objectives.yaml")
    code = run_classify(tmp_path, config, chat(max_tokens=100), {"x-workload": workload})
    out = capsys.readouterr().out.splitlines()
    assert code == 0
    assert any(line.startswith("timings: as models[].objectives assumes them") for line in out)
    assert "signals: assumed idle (no request in flight, no node busy, nothing cached)" in out
    predicted = [
        line for line in out if line.startswith("  proxy on ") or line.startswith("  tilert:")
    ]
    assert len(predicted) == 2  # one line a way, with its verdict
    assert f"way: {way} (meets)" in out
    route = "latency" if way == "tilert" else "throughput"
    assert f"  x-pd-route: {route}" in out
    assert any(line.startswith(f"  x-pd-way: {way}; ttft_ms=") for line in out)


def test_a_malformed_objective_header_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = write_config(tmp_path, "objectives.yaml")
    headers = {"x-workload": "chat", "x-pd-objective-ttft-ms": "soon"}
    code = run_classify(tmp_path, config, chat(), headers)
    assert code != 0
    assert (
        "x-pd-objective-ttft-ms must be a whole number of milliseconds" in capsys.readouterr().err
    )
