"""vLLM's own output parsers over model outputs given as token ids: run on vLLM's interpreter.

    .venv-vllm/bin/python tests/real_vllm/vllm_output_parsing.py < cases.json > results.json

Each case is parsed as vLLM 0.32's chat serving parses it, with the pieces that serving
uses: the parser `vllm serve --enable-auto-tool-choice --tool-call-parser T
--reasoning-parser R` composes (`ParserManager.get_parser`), one instance per answer, its
`adjust_request` (which settles `skip_special_tokens`), and vLLM's incremental detokenizer
primed with the prompt, a stop token counted but not detokenized. The whole answer is
`parse` over the detokenized text; a stream is `parse_delta` over chunks of ids, its deltas
reassembled as a client does. Every way a case is cut gives one message:

* `whole`: the non-streaming answer;
* `per_token`: one id per chunk (a stop token is a chunk of its own, as vLLM samples it);
* `cuts[k - 1]`: two chunks, ids `[0:k]` and `[k:]` (with the stop token), for every
  `0 < k < len(output_ids)`.

Input (JSON on stdin): `{"tokenizers": {NAME: {"path": DIR, "mode": "hf" or
"deepseek_v32"}}, "cases": [{"name", "tokenizer", "reasoning_parser", "tool_parser",
"request": {chat request fields}, "prompt_ids", "output_ids", "stop_id" (or null when
max_tokens cut the output)}]}`. Output (JSON on stdout): `{NAME: {"whole", "per_token",
"cuts"}}`, each message as `message_json` writes it.

Only the standard library is imported at module level, so the tests can share
`message_json` without vLLM.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable
from types import SimpleNamespace
from typing import Any


def message_json(
    reasoning: str | None, content: str | None, calls: Iterable[tuple[str, str]]
) -> dict[str, Any]:
    """A parsed message as both sides are compared: tool-call arguments as the JSON value
    they spell, kept as text under `invalid_arguments` where they are not JSON (NaN and
    infinities are not: Python writes and reads them, other clients refuse them)."""
    tool_calls: list[dict[str, Any]] = []
    for name, arguments in calls:
        try:
            value = json.loads(arguments)
            json.dumps(value, allow_nan=False)
        except ValueError:
            tool_calls.append({"name": name, "invalid_arguments": arguments})
        else:
            tool_calls.append({"name": name, "arguments": value})
    return {"reasoning": reasoning, "content": content, "tool_calls": tool_calls}


class _VllmCase:
    """One case's request, parser class and tokenizer, as vLLM's chat serving holds them."""

    def __init__(self, case: dict[str, Any], tokenizer: Any) -> None:
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
        from vllm.parser.parser_manager import ParserManager

        self.tokenizer = tokenizer
        self.prompt_ids: list[int] = case["prompt_ids"]
        self.output_ids: list[int] = case["output_ids"]
        self.stop_id: int | None = case["stop_id"]
        self.request = ChatCompletionRequest(
            model="model", messages=[{"role": "user", "content": "hi"}], **case["request"]
        )
        parser_cls = ParserManager.get_parser(
            tool_parser_name=case["tool_parser"],
            reasoning_parser_name=case["reasoning_parser"],
            enable_auto_tools=True,
            tokenizer=tokenizer,
        )
        assert parser_cls is not None
        self.parser_cls = parser_cls
        # As serving passes them: the request's kwargs merged with the template defaults.
        self.chat_template_kwargs = self.request.build_chat_params(
            None, "auto"
        ).chat_template_kwargs
        self.request = self.new_parser().adjust_request(request=self.request)

    def new_parser(self) -> Any:
        return self.parser_cls(
            self.tokenizer,
            self.request.tools,
            chat_template_kwargs=self.chat_template_kwargs,
            model_config=None,
        )

    def new_detokenizer(self) -> Any:
        from vllm.v1.engine.detokenizer import FastIncrementalDetokenizer

        sampling = SimpleNamespace(
            stop=None,
            min_tokens=0,
            include_stop_str_in_output=False,
            skip_special_tokens=self.request.skip_special_tokens,
            spaces_between_special_tokens=self.request.spaces_between_special_tokens,
        )
        request = SimpleNamespace(
            request_id="case", prompt_token_ids=self.prompt_ids, sampling_params=sampling
        )
        return FastIncrementalDetokenizer(self.tokenizer, request)

    def whole(self) -> dict[str, Any]:
        """The non-streaming answer's message (`chat_completion_full_generator`)."""
        ids = self._with_stop(self.output_ids)
        detokenizer = self.new_detokenizer()
        detokenizer.update(ids, self.stop_id is not None)
        text = detokenizer.get_next_output_text(finished=True, delta=False)
        parser = self.new_parser()
        parser.set_prompt_token_ids(self.prompt_ids)
        reasoning, content, calls = parser.parse(
            text, self.request, enable_auto_tools=True, model_output_token_ids=ids
        )
        request = self.request
        # Serving attaches calls only for tool_choice "auto" (or unset) with tools.
        keeps_calls = request.tools and request.tool_choice in ("auto", None)
        kept = [(call.name, call.arguments) for call in calls or []] if keeps_calls else []
        return message_json(reasoning, content, kept)

    def streamed(self, chunks: list[list[int]]) -> dict[str, Any]:
        """The message a streaming client rebuilds from `parse_delta` over `chunks`."""
        detokenizer = self.new_detokenizer()
        parser = self.new_parser()
        reasoning: list[str] = []
        content: list[str] = []
        calls: dict[int, list[str]] = {}
        for number, chunk in enumerate(chunks):
            last = number == len(chunks) - 1
            detokenizer.update(chunk, last and self.stop_id is not None)
            text = detokenizer.get_next_output_text(finished=last, delta=True)
            delta = parser.parse_delta(
                text, chunk, self.request, prompt_token_ids=self.prompt_ids, finished=last
            )
            if delta is None:
                continue
            reasoning.append(delta.reasoning or "")
            content.append(delta.content or "")
            for piece in delta.tool_calls or []:
                name_and_arguments = calls.setdefault(piece.index, ["", ""])
                if piece.function is not None:
                    name_and_arguments[0] += piece.function.name or ""
                    name_and_arguments[1] += piece.function.arguments or ""
        return message_json(
            "".join(reasoning) or None,
            "".join(content) or None,
            [(name, arguments) for _, (name, arguments) in sorted(calls.items())],
        )

    def per_token(self) -> dict[str, Any]:
        chunks = [[token] for token in self.output_ids]
        if self.stop_id is not None:
            chunks.append([self.stop_id])
        return self.streamed(chunks)

    def cuts(self) -> list[dict[str, Any]]:
        ids = self.output_ids
        return [self.streamed([ids[:k], self._with_stop(ids[k:])]) for k in range(1, len(ids))]

    def _with_stop(self, ids: list[int]) -> list[int]:
        return ids if self.stop_id is None else [*ids, self.stop_id]


def _load_tokenizer(path: str, mode: str) -> Any:
    # As `vllm serve --tokenizer-mode MODE` loads it, without the model config lookup.
    if mode == "deepseek_v32":
        from vllm.tokenizers.deepseek_v32 import DeepseekV32Tokenizer

        return DeepseekV32Tokenizer.from_pretrained(path)
    from vllm.tokenizers.hf import CachedHfTokenizer

    return CachedHfTokenizer.from_pretrained(path)


def main() -> None:
    given = json.load(sys.stdin)
    out = sys.stdout
    sys.stdout = sys.stderr  # vLLM logs to stdout: only the results go there
    tokenizers = {
        name: _load_tokenizer(spec["path"], spec["mode"])
        for name, spec in given["tokenizers"].items()
    }
    results = {}
    for case in given["cases"]:
        parsed = _VllmCase(case, tokenizers[case["tokenizer"]])
        results[case["name"]] = {
            "whole": parsed.whole(),
            "per_token": parsed.per_token(),
            "cuts": parsed.cuts(),
        }
    json.dump(results, out, ensure_ascii=False)


if __name__ == "__main__":
    main()
