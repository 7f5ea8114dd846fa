"""What the simulated model generates: a scripted text or a deterministic filler, then EOS.

A prompt containing ``[[sim-output]]TEXT[[/sim-output]]`` (or the same with base64 of the
UTF-8 text between ``[[sim-output-b64]]`` and ``[[/sim-output-b64]]``) makes the model
generate exactly TEXT, added tokens such as ``<think>`` recognised as single tokens, then
EOS. Any other prompt yields ``default_output_tokens`` tokens of filler words (some with
multi-byte characters) chosen by a hash of the prompt, then EOS; for a model that thinks
(its answer starts inside reasoning), a short reasoning filler, ``</think>``, then the
answer's. The plan is fixed at prefill time, so prefill → decode continues exactly what
plain serving would produce.
"""

from __future__ import annotations

import base64
import hashlib
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sim.tokenizers import Vocab

_DIRECTIVE = re.compile(r"\[\[sim-output\]\](.*?)\[\[/sim-output\]\]", re.DOTALL)
_DIRECTIVE_B64 = re.compile(r"\[\[sim-output-b64\]\](.*?)\[\[/sim-output-b64\]\]", re.DOTALL)
_FILLER_WORDS = (
    "the", "node", "decodes", "tokens", "quickly", "while", "prefill", "computes", "a",
    "café", "naïve", "über", "Zürich", "façade", "señal", "straße", "déjà", "vu",
    "日本語", "数据", "模型", "推理", "速度", "🙂", "🚀", "cluster", "of", "eight",
    "GPUs", "serves", "one", "request", "at", "time", "latency", "matters", "here",
)  # fmt: skip
_PUNCTUATION = (".", ",", ";", "!", "?")


Prompt = str | list[int]
"""One completion prompt: its text or its token ids."""
Prompts = Prompt | list[str] | list[list[int]]
"""A completion request's ``prompt``: one prompt, or a list of them."""


@dataclass(frozen=True, slots=True)
class Plan:
    """A request's prompt ids and the ids the model will generate (ending with one EOS)."""

    prompt_ids: list[int]
    output_ids: list[int]
    scripted: bool


def _part_text(part: object) -> str:
    if isinstance(part, dict) and part.get("type") == "text":
        return str(part.get("text", ""))
    return ""


def message_text(content: object) -> str:
    """The text of one chat message's content (a string or a list of parts)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(_part_text(part) for part in content)
    return ""


def chat_prompt_text(messages: Sequence[dict[str, Any]]) -> str:
    """All message contents concatenated: where the output directive is looked for."""
    return "".join(message_text(m.get("content")) for m in messages)


def render_chat(messages: Sequence[dict[str, Any]]) -> str:
    """The simulators' chat template: ``<|role|>\\ncontent\\n`` per message, then
    ``<|assistant|>\\n``."""
    turns = [f"<|{m.get('role', 'user')}|>\n{message_text(m.get('content'))}\n" for m in messages]
    return "".join(turns) + "<|assistant|>\n"


def scripted_text(prompt_text: str) -> str | None:
    """The TEXT a directive in the prompt asks for, or None without a directive."""
    match = _DIRECTIVE.search(prompt_text)
    if match:
        return match.group(1)
    match = _DIRECTIVE_B64.search(prompt_text)
    if match:
        return base64.b64decode(match.group(1).strip()).decode("utf-8")
    return None


def filler_ids(vocab: Vocab, seed: str, count: int) -> list[int]:
    """Exactly ``count`` ids of filler words chosen deterministically from ``seed``."""
    rng = random.Random(hashlib.sha256(seed.encode("utf-8")).digest())
    ids: list[int] = []
    while len(ids) < count:
        word = rng.choice(_FILLER_WORDS)
        if rng.random() < 0.15:
            word += rng.choice(_PUNCTUATION)
        piece = vocab.encode((" " if ids else "") + word)
        if len(ids) + len(piece) > count:
            # Pad with a one-token full stop rather than cut a character in half.
            ids.extend(vocab.encode(".") * (count - len(ids)))
            break
        ids.extend(piece)
    return ids


_FILLER_IDS: dict[int, frozenset[int]] = {}


def _filler_ids(vocab: Vocab) -> frozenset[int]:
    """Every id a filler can end with (its words and punctuation, with and without a space)."""
    known = _FILLER_IDS.get(id(vocab))
    if known is None:
        pieces = [w + end for w in _FILLER_WORDS for end in ("", *_PUNCTUATION)]
        known = frozenset(
            i
            for piece in [*pieces, "."]
            for text in (piece, " " + piece)
            for i in vocab.encode(text)
        )
        _FILLER_IDS[id(vocab)] = known
    return known


def plan_output(
    vocab: Vocab, prompt_text: str, default_output_tokens: int
) -> tuple[list[int], bool]:
    """The ids generated for a prompt text (EOS included) and whether they were scripted."""
    text = scripted_text(prompt_text)
    if text is not None:
        return [*vocab.encode(text), vocab.eos_ids[0]], True
    return [*filler_ids(vocab, prompt_text, default_output_tokens), vocab.eos_ids[0]], False


def plan_chat(
    vocab: Vocab,
    messages: Sequence[dict[str, Any]],
    default_output_tokens: int,
    tools: Sequence[dict[str, Any]] | None = None,
    template_kwargs: dict[str, Any] | None = None,
    *,
    thinks: bool = False,
) -> Plan:
    """Plan a chat request: the prompt rendered by the model's chat template (with the
    tools and the generation prompt) if the tokenizer has one, else by
    :func:`render_chat`; the output by directive. `thinks`: the answer starts inside
    reasoning, so a filler ends its reasoning before it answers."""
    text = chat_prompt_text(messages)
    output, scripted = plan_output(vocab, text, default_output_tokens)
    if vocab.chat_template is not None:
        prompt = vocab.chat_template.render(messages, tools, extra=template_kwargs)
    else:
        prompt = render_chat(messages)
    if thinks and not scripted:
        output = [*reasoned_filler_ids(vocab, text, default_output_tokens), vocab.eos_ids[0]]
    return Plan(vocab.encode(prompt), output, scripted)


THINK_CLOSE = "</think>"


def reasoned_filler_ids(vocab: Vocab, seed: str, count: int) -> list[int]:
    """Filler for a model whose answer starts inside reasoning (GLM-4.7/5 thinking): a
    quarter reasoning, ``</think>``, then the answer; about ``count`` ids in all."""
    close = vocab.encode(THINK_CLOSE)
    thinking = max(1, count // 4)
    answer = max(1, count - thinking - len(close))
    return [
        *filler_ids(vocab, "reasoning:" + seed, thinking),
        *close,
        *filler_ids(vocab, seed, answer),
    ]


def extend_output(vocab: Vocab, plan: Plan, count: int) -> Plan:
    """``plan`` generating at least ``count`` ids before its EOS (``ignore_eos``): filler
    seeded by the planned ids follows them."""
    body = [i for i in plan.output_ids if i not in vocab.eos_ids]
    if len(body) < count:
        body += filler_ids(vocab, repr(body), count - len(body))
    return Plan(plan.prompt_ids, [*body, vocab.eos_ids[0]], plan.scripted)


def continued(plan: Plan, context: list[int]) -> Plan:
    """What a greedy model generates after `context`: where `context` is the plan's prompt
    followed by the first k ids of its output, the rest of that output; else the plan as
    it is. So a prefill of a prompt and part of its answer continues the answer exactly."""
    prompt = plan.prompt_ids
    if context[: len(prompt)] != prompt:
        return Plan(context, plan.output_ids, plan.scripted)
    written = context[len(prompt) :]
    if not written or len(written) >= len(plan.output_ids):
        return Plan(context, plan.output_ids, plan.scripted)
    if plan.output_ids[: len(written)] != written:
        return Plan(context, plan.output_ids, plan.scripted)
    return Plan(context, plan.output_ids[len(written) :], plan.scripted)


def completion_prompts(prompt: Prompts | None) -> list[Prompt]:
    """The prompts of a completion request: a string, token ids, or a list of either (none
    without a prompt)."""
    if prompt is None:
        return []
    if isinstance(prompt, str):
        return [prompt]
    ids = [i for i in prompt if isinstance(i, int)]
    if len(ids) == len(prompt):  # token ids (or none at all): one prompt
        return [ids]
    return [p for p in prompt if not isinstance(p, int)]


def plan_completion(vocab: Vocab, prompt: Prompts, default_output_tokens: int) -> Plan:
    """Plan a completion of one prompt (a string or token ids; of a list, the first). Token
    ids made of a prompt and the start of its answer continue that answer, as a greedy
    model would: the directive's text after what is written already, or the filler the
    prompt before the written part seeds (found by trying each length of filler)."""
    first = completion_prompts(prompt)[0]
    if isinstance(first, str):
        output, scripted = plan_output(vocab, first, default_output_tokens)
        return Plan(vocab.encode(first), output, scripted)
    prompt_ids = [int(i) for i in first]
    output, scripted = plan_output(vocab, vocab.decode(prompt_ids), default_output_tokens)
    if scripted:
        for written in range(min(len(output), len(prompt_ids)) - 1, 0, -1):
            if prompt_ids[-written:] == output[:written] and scripted_text(
                vocab.decode(prompt_ids[:-written])
            ):
                return Plan(prompt_ids, output[written:], scripted)
        return Plan(prompt_ids, output, scripted)
    if prompt_ids[-1] not in _filler_ids(vocab):
        return Plan(prompt_ids, output, scripted)  # no filler ends it: a prompt alone
    for written in range(1, min(default_output_tokens, len(prompt_ids) - 1) + 1):
        head = prompt_ids[:-written]
        filler, _ = plan_output(vocab, vocab.decode(head), default_output_tokens)
        if filler[:written] == prompt_ids[-written:]:
            return Plan(prompt_ids, filler[written:], scripted)
    return Plan(prompt_ids, output, scripted)
