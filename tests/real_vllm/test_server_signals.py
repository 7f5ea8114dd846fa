"""What the gateway reads from a vLLM server besides its answers, read from real vLLM: the
load figures of its `/metrics` (by the names `router.selection.load` looks for) and what
`pd-gateway check --probe` reports of it."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from router.cli import main
from router.selection.load import KV_CACHE_USAGE, RUNNING, WAITING, parse_load
from tests.real_vllm.conftest import RealVllm


def metrics(client: httpx.Client, real_vllm: RealVllm) -> str:
    response = client.get(f"{real_vllm.url}/metrics")
    assert response.status_code == 200
    return response.text


def test_the_load_figures_are_read_from_real_metrics(real_vllm: RealVllm) -> None:
    body = {
        "model": real_vllm.model,
        "prompt": "one two three",
        "max_tokens": 1500,
        "ignore_eos": True,
        "stream": True,
    }
    with httpx.Client(timeout=120) as client:
        page = metrics(client, real_vllm)
        named = {s.name for f in text_string_to_metric_families(page) for s in f.samples}
        assert {RUNNING, WAITING, KV_CACHE_USAGE} <= named
        idle = parse_load(page)
        assert idle is not None
        assert (idle.running, idle.waiting) == (0, 0)
        with client.stream("POST", f"{real_vllm.url}/v1/completions", json=body) as stream:
            assert stream.status_code == 200
            lines = stream.iter_lines()
            assert next(line for line in lines if line.startswith("data: {"))
            busy = parse_load(metrics(client, real_vllm))  # while the answer is generated
            for _ in lines:  # to its end
                pass
    assert busy is not None
    assert busy.running == 1
    assert busy.waiting == 0
    assert 0 < busy.kv_cache_usage <= 1


def test_check_probe_shows_the_server_healthy_with_its_model(
    real_vllm: RealVllm, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = real_vllm.url
    model = {
        "name": real_vllm.model,
        "tokenizer": str(real_vllm.model_dir),
        "throughput": {"mode": "pull", "prefill": [url], "decode": [url]},
    }
    path = tmp_path / "router.yaml"
    path.write_text(yaml.safe_dump({"models": [model]}), encoding="utf-8")
    status = main(["check", "--config", str(path), "--probe"])
    out, err = capsys.readouterr()
    assert (status, err) == (0, "")
    where = re.escape(
        f"vllm {url} (model {real_vllm.model}, pull prefill; model {real_vllm.model}, pull decode)"
    )
    figures = r"running \d+, waiting \d+, KV cache \d+\.\d%"
    line = rf"{where}: healthy, {figures}, models: {real_vllm.model}"
    assert any(re.fullmatch(line, shown) for shown in out.splitlines()), out
