"""The text pipeline a request's output ids go through, wherever they come from: a TileRT
node (`router.latency.relay`) or a decode server going on with a native answer
(`router.throughput.continuation`)."""

from __future__ import annotations

from router.detokenize.pipeline import TextPipeline
from router.serving.base import RoutedRequest
from router.tokens.tokenizer import LoadedTokenizer


def output_pipeline(
    request: RoutedRequest, tokenizer: LoadedTokenizer, output_parser: str
) -> TextPipeline:
    """Stop ids, detokenizer, stop strings, then the model's reasoning and tool-call
    parser (`output_parser`) for an endpoint whose output is parsed, as `request` asks."""
    parsed = request.parsed
    return TextPipeline(
        tokenizer.tokenizer,
        vocab=tokenizer.vocab,
        parser_name=output_parser if request.endpoint.parses_output else "none",
        tools=parsed.parser_tools,
        chat_template_kwargs=parsed.chat_template_kwargs,
        stop=parsed.stop_strings,
        stop_token_ids=parsed.stop_token_ids or [],
    )
