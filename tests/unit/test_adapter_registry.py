"""Adapters are found through the loadgen.targets entry points; mistakes are one-line TargetErrors."""

from __future__ import annotations

import pytest

from targets.adapters.anthropic import AnthropicMessagesAdapter
from targets.adapters.base import Adapter
from targets.adapters.llamacpp import LlamaServerAdapter
from targets.adapters.openai import OpenAIChatAdapter, OpenAICompletionsAdapter
from targets.adapters.responses import OpenAIResponsesAdapter
from targets.adapters.sglang import SGLangAdapter
from targets.errors import TargetError
from targets.registry import available_adapters, get_adapter


def test_built_in_adapters_are_registered():
    assert available_adapters() == [
        "anthropic-messages",
        "llama-server",
        "openai-chat",
        "openai-completions",
        "openai-responses",
        "sglang",
    ]
    for name, cls in [
        ("openai-chat", OpenAIChatAdapter),
        ("openai-completions", OpenAICompletionsAdapter),
        ("llama-server", LlamaServerAdapter),
        ("sglang", SGLangAdapter),
        ("anthropic-messages", AnthropicMessagesAdapter),
        ("openai-responses", OpenAIResponsesAdapter),
    ]:
        a = get_adapter(name)
        assert type(a) is cls and a.name == name and isinstance(a, Adapter)


def test_options_are_passed_and_reported():
    a = get_adapter("openai-chat", continuous_usage_stats=True, min_tokens=4)
    assert a.options() == {
        "ignore_eos": True,
        "min_tokens": 4,
        "continuous_usage_stats": True,
        "temperature": None,
        "reasoning_in_history": False,
    }
    assert get_adapter("llama-server", id_slot=1).options()["id_slot"] == 1


def test_unknown_name_lists_installed_adapters():
    with pytest.raises(TargetError) as e:
        get_adapter("vllm")
    assert str(e.value) == (
        "unknown target adapter 'vllm'; installed adapters: anthropic-messages, llama-server, openai-chat, "
        "openai-completions, openai-responses, sglang"
    )
    assert isinstance(e.value, ValueError)


def test_unknown_option_lists_accepted_ones():
    with pytest.raises(TargetError) as e:
        get_adapter("sglang", id_slot=3)
    assert str(e.value) == (
        "target adapter 'sglang' does not take option 'id_slot'; it takes: ignore_eos, temperature, incremental_text"
    )
