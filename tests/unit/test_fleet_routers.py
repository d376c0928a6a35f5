"""Router specs, command lines and identity parsing: no processes."""

from __future__ import annotations

import importlib.util

import pytest

from targets.errors import TargetError
from targets.fleet import routers
from targets.fleet.routers import (
    SGLANG,
    VLLM,
    RouterSpecError,
    observed_policy,
    parse_router_spec,
    router_argv,
)


@pytest.mark.parametrize(
    ("text", "kind", "policy"),
    [
        ("sglang:cache_aware", SGLANG, "cache_aware"),
        ("sglang:round_robin", SGLANG, "round_robin"),
        ("sglang:power_of_two", SGLANG, "power_of_two"),
        ("sglang:random", SGLANG, "random"),
        ("sglang:manual", SGLANG, "manual"),
        ("SGLang:Round_Robin", SGLANG, "round_robin"),
        ("sglang", SGLANG, "cache_aware"),
        ("vllm:consistent_hash", VLLM, "consistent_hash"),
        ("vllm:round_robin", VLLM, "round_robin"),
        ("vllm:cache_aware", VLLM, "cache_aware"),
        ("vllm:power_of_two", VLLM, "power_of_two"),
        ("vllm:random", VLLM, "random"),
        ("vllm:sticky_least_loaded", VLLM, "sticky_least_loaded"),
    ],
)
def test_parse_router_spec(text, kind, policy):
    spec = parse_router_spec(text)
    assert spec is not None
    assert (spec.kind, spec.policy) == (kind, policy)
    assert str(spec) == f"{kind.key}:{policy}"


def test_none_means_no_router():
    assert parse_router_spec("none") is None
    assert parse_router_spec("None") is None


def test_unknown_router_lists_the_choices():
    with pytest.raises(RouterSpecError) as e:
        parse_router_spec("nginx:round_robin")
    assert str(e.value) == (
        "unknown router 'nginx' in 'nginx:round_robin'; choose one of: sglang:<policy>, vllm:<policy>, none"
    )
    assert isinstance(e.value, ValueError) and isinstance(e.value, TargetError)


def test_unknown_policy_lists_that_routers_policies():
    with pytest.raises(RouterSpecError) as e:
        parse_router_spec("sglang:consistent_hash")
    assert str(e.value) == (
        "unknown policy 'consistent_hash' for sglang-router; "
        "choose one of: cache_aware, manual, power_of_two, random, round_robin"
    )
    with pytest.raises(
        RouterSpecError, match=r"for vllm-router; choose one of: cache_aware, consistent_hash"
    ):
        parse_router_spec("vllm:manual")


def test_argv_binds_loopback_and_a_private_prometheus_port():
    spec = parse_router_spec("sglang:cache_aware")
    argv = router_argv(
        spec, ["http://127.0.0.1:1001", "http://127.0.0.1:1002"], port=2000, prometheus_port=2001,
        startup_timeout_s=12.5,
    )  # fmt: skip
    flags = " ".join(argv)
    assert argv[1:3] == ["-m", "sglang_router.launch_router"]
    assert "--host 127.0.0.1 --port 2000" in flags
    assert "--prometheus-host 127.0.0.1 --prometheus-port 2001" in flags
    assert "--worker-urls http://127.0.0.1:1001 http://127.0.0.1:1002 --policy cache_aware" in flags
    assert "--worker-startup-timeout-secs 13" in flags
    assert "--log-level warn" in flags


def test_vllm_argv_spells_its_log_level_and_passes_extra_args():
    spec = parse_router_spec("vllm:consistent_hash")
    argv = router_argv(
        spec, ["http://127.0.0.1:1001"], port=2000, prometheus_port=2001, startup_timeout_s=5,
        extra_args=["--disable-retries"],
    )  # fmt: skip
    assert argv[1:3] == ["-m", "vllm_router.launch_router"]
    assert "--log-level warning" in " ".join(argv)
    assert argv[-1] == "--disable-retries"
    assert "--prometheus-host 127.0.0.1" in " ".join(argv)


def test_router_env_keeps_hub_downloads_on_loopback():
    env = routers.router_env()
    assert env["HF_ENDPOINT"].startswith("http://127.0.0.1:")
    assert "127.0.0.1" in env["NO_PROXY"] and "127.0.0.1" in env["no_proxy"]


def test_session_headers_and_affinity():
    assert SGLANG.session_header == "X-SMG-Routing-Key"
    assert VLLM.session_header == "X-Session-ID"
    assert SGLANG.affinity("manual") == "header"
    assert SGLANG.affinity("cache_aware") == "prefix"
    assert SGLANG.affinity("round_robin") == "none"
    assert VLLM.affinity("consistent_hash") == "header"
    assert VLLM.affinity("cache_aware") == "none"  # no tokens for HTTP workers: least loaded
    assert VLLM.affinity("power_of_two") == "none"


def test_observed_policy_reads_the_routers_own_counters():
    sglang_text = (
        "# TYPE smg_worker_selection_total counter\n"
        'smg_worker_selection_total{worker_type="regular",connection_mode="http",model="m",policy="round_robin"} 4\n'
    )
    vllm_text = 'vllm_router_policy_decisions_total{policy="consistent_hash",worker="http://127.0.0.1:1"} 9\n'
    assert observed_policy(sglang_text, SGLANG) == "round_robin"
    assert observed_policy(vllm_text, VLLM) == "consistent_hash"
    assert observed_policy("", SGLANG) is None
    assert observed_policy(vllm_text, SGLANG) is None


def test_missing_router_package_names_the_install_command(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        routers.importlib.util, "find_spec", lambda name: None if name == "vllm_router" else real(name)
    )
    with pytest.raises(TargetError) as e:
        routers.installed_version(VLLM)
    assert str(e.value) == "vllm-router is not installed; run: pip install 'loadgen[routers]'"


def test_installed_versions_match_the_pins():
    assert routers.installed_version(SGLANG) == "0.3.2"
    assert routers.installed_version(VLLM) == "0.1.17"
