"""run.json's target identity, read again by the run record, carries the API key as the preflight's
does: a keyed Messages server answers ``/v1/models`` only with ``x-api-key``."""

from __future__ import annotations

from loadgen.config import RunConfig
from loadgen.runtime.run_record import target_identity

from .test_identity_auth import KEY, _KeyedModels, keyed_server  # noqa: F401 (a fixture)


def test_run_record_identity_sends_the_key_named_by_api_key_env(keyed_server, monkeypatch) -> None:  # noqa: F811
    monkeypatch.setenv("LOADGEN_TEST_KEY", KEY)
    cfg = RunConfig(run_id="r", workload="tiny", target_url=keyed_server, adapter="anthropic-messages",
                    api_key_env="LOADGEN_TEST_KEY")  # fmt: skip
    ident = target_identity(cfg)
    assert ident["endpoints"]["/v1/models"] == 200 and ident["model"] == "claude-test"
    assert any(h.get("x-api-key") == KEY for h in _KeyedModels.seen)
