"""``--adapter-options``: typed values, one-line errors for malformed items, unknown options and
unknown adapters, and the run configuration the workers get."""

from __future__ import annotations

import pytest

from loadgen.adapter_options import checked_adapter, parse_adapter_options
from loadgen.errors import UserError


def test_values_are_typed() -> None:
    assert parse_adapter_options("server_history=true, store=False,temperature=0.5,min_tokens=4,x=none,y=abc") == {
        "server_history": True, "store": False, "temperature": 0.5, "min_tokens": 4, "x": None, "y": "abc",
    }  # fmt: skip
    assert parse_adapter_options("") == {}


@pytest.mark.parametrize("text", ["server_history", "=true", "bad key=1"])
def test_a_malformed_item_is_a_one_line_error(text: str) -> None:
    with pytest.raises(UserError, match=r"is not key=value; use e\.g\. server_history=true"):
        parse_adapter_options(text)


def test_the_adapter_is_built_with_them_and_unknown_options_list_the_accepted_ones() -> None:
    adapter = checked_adapter("openai-responses", parse_adapter_options("server_history=true"))
    assert adapter.options()["server_history"] is True
    with pytest.raises(
        UserError, match=r"does not take option 'server_history'; it takes: .*reasoning_in_history"
    ):
        checked_adapter("openai-chat", {"server_history": True})


def test_the_workers_run_configuration_carries_them() -> None:
    import argparse

    from loadgen.runtime.locust_options import add_arguments, config_from_options

    class Parser(argparse.ArgumentParser):  # Locust's parser takes include_in_web_ui
        def add_argument(self, *a, include_in_web_ui=True, **k):
            return super().add_argument(*a, **k)

    parser = Parser()
    parser.add_argument("--host", default="")
    add_arguments(parser)
    opts = parser.parse_args(["--host", "http://127.0.0.1:1", "--adapter", "openai-responses",
                              "--adapter-options", "server_history=true"])  # fmt: skip
    assert config_from_options(opts).adapter_options == {"server_history": True}
