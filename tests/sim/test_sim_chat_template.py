"""The simulators render a chat with the model's own template when its directory has one."""

import json
from pathlib import Path

import pytest

from sim.script import plan_chat, render_chat
from sim.tokenizers import load_vocab
from tests.support.tiny_model import write_model

HI = [{"role": "user", "content": "hi"}]
TOOL = {"type": "function", "function": {"name": "f", "description": None, "parameters": None}}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_model(tmp_path_factory.mktemp("tiny"))


def test_the_models_template_renders_the_prompt_with_bos_and_generation_prompt(
    model_dir: Path,
) -> None:
    vocab = load_vocab(str(model_dir))
    plan = plan_chat(vocab, HI, 4)
    assert vocab.decode(plan.prompt_ids) == "<s><|user|>\nhi<|assistant|>\n"


def test_tools_are_rendered_and_call_arguments_handed_over_as_objects(model_dir: Path) -> None:
    vocab = load_vocab(str(model_dir))
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}
    messages = [*HI, {"role": "assistant", "content": None, "tool_calls": [call]}]
    text = vocab.decode(plan_chat(vocab, messages, 4, tools=[TOOL]).prompt_ids)
    assert json.dumps(TOOL) in text
    assert '<tool_call>{"name": "f", "arguments": {"a": 1}}</tool_call>' in text


def test_without_a_template_the_simulators_own_rendering_is_used(
    model_dir: Path, tmp_path: Path
) -> None:
    (tmp_path / "tokenizer.json").write_bytes((model_dir / "tokenizer.json").read_bytes())
    config = json.loads((model_dir / "tokenizer_config.json").read_text())
    del config["chat_template"]
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    vocab = load_vocab(str(tmp_path))
    assert vocab.chat_template is None
    plan = plan_chat(vocab, HI, 4)
    assert plan.prompt_ids == vocab.encode(render_chat(HI))
