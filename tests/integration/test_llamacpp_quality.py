"""The quality eval and the cold-start watch against a real llama-server with SmolLM2-135M.

Skipped without the cached binary and model unless ``LOADGEN_REQUIRE_LLAMA`` is set (then a
failure), like the other llama-server tests. SmolLM2-135M is tiny: its score is recorded in
docs/llama-server.md, not asserted here beyond what it reliably does (every item gets an answer).
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from loadgen.commands.evalset import is_correct, load_eval_set
from loadgen.commands.quality import evaluate, format_quality
from targets.llamacpp.launcher import start_llama_servers

pytestmark = [pytest.mark.llamacpp, pytest.mark.slow]



def test_smollm2_answers_every_item_and_its_cold_start_is_timed(llama_paths, tmp_path):
    binary, model = llama_paths
    # The shipped questions with shorter replies (SmolLM2 says "The capital of France is Paris."
    # in 8 tokens): the test stays short on one CPU thread.
    items = [replace(i, max_tokens=8) for i in load_eval_set()]
    with start_llama_servers(
        1, binary=binary, model_path=model, threads=1, log_dir=tmp_path, ready_timeout=60
    ) as fleet:
        cs = fleet[0].owned.cold_start.wait(60.0)
        result = evaluate(fleet.urls[0], items)
    print(format_quality(result, fleet.urls[0]))  # the score, for whoever reads the log
    assert cs.error is None, cs
    # The port opens before the model is loaded; /health says 200 only once it is.
    assert 0 < cs.listening_s < cs.healthy_s <= cs.first_token_s < 60
    assert result.total == len(items) and result.temperature == 0.0
    assert all(i.error is None and i.answer for i in result.items), result.items
    # The verdicts are the eval's own, recomputed from the recorded answers.
    assert [i.correct for i in result.items] == [is_correct(it, r.answer) for it, r in zip(items, result.items, strict=True)]
    assert 0.0 <= result.score <= 1.0
