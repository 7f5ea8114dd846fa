"""The vLLM simulator answers like real vLLM in everything but the generated text.

The simulator serves the same model directory as the real vLLM (its tokenizer and chat
template, the same ``max_model_len``, logprob tokens as text as vLLM without
``--return-tokens-as-token-ids``); every case of :mod:`tests.real_vllm.script` goes to
both, and the normalised answers must be identical.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest

from sim.stack import SimStack

from .script import CASES, Case, run

pytestmark = [pytest.mark.real_vllm, pytest.mark.e2e]

VLLM_ATTEMPTS = 3
MAX_MODEL_LEN = "2048"  # as the real vLLM runs (--max-model-len 2048)


@pytest.fixture(scope="module")
def simulator(real_vllm: Any) -> Iterator[str]:
    """Base URL of a simulated vLLM serving the real vLLM's model directory."""
    stack = SimStack(
        nodes=0,
        prefills=0,
        proxy=True,
        tokenizer=str(real_vllm.model_dir),
        model=real_vllm.model,
        proxy_args=[
            "--max-model-len",
            MAX_MODEL_LEN,
            "--no-enable-prompt-tokens-details",
            "--text-logprobs",
            "--refuse-unparsed-tool-choice",
            "--itl-ms",
            "0",
        ],
    )
    with stack:
        assert stack.proxy is not None
        yield stack.proxy.url


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=60) as client:
        yield client


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
async def test_simulator_answers_like_vllm(
    case: Case, real_vllm: Any, simulator: str, http: httpx.AsyncClient
) -> None:
    actual = (await run(http, simulator, real_vllm.model, case)).describe()
    # A busy vLLM may merge the outputs of consecutive engine steps into one chunk, so its
    # side is asked again (never the simulator's) before a difference counts.
    for _ in range(VLLM_ATTEMPTS):
        expected = (await run(http, real_vllm.url, real_vllm.model, case)).describe()
        if expected == actual:
            break
    assert actual == expected
