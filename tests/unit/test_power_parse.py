"""Reading GPU power from exporter pages (targets/power.py): both exporters' names and units, GPUs
summed, counter resets, and a page that is not an exporter's as one line."""

from __future__ import annotations

import pytest

from targets.power import EnergyCounter, PowerPageError, parse_power_metrics, parse_power_page

# What dcgm-exporter 3.x serves (two GPUs; a pod label on one of them), trimmed to the two families
DCGM_PAGE = """\
# HELP DCGM_FI_DEV_SM_CLOCK SM clock frequency (in MHz).
# TYPE DCGM_FI_DEV_SM_CLOCK gauge
DCGM_FI_DEV_SM_CLOCK{gpu="0",UUID="GPU-aaa",device="nvidia0",modelName="NVIDIA H100 80GB HBM3",Hostname="h1"} 1980
# HELP DCGM_FI_DEV_POWER_USAGE Power draw (in W).
# TYPE DCGM_FI_DEV_POWER_USAGE gauge
DCGM_FI_DEV_POWER_USAGE{gpu="0",UUID="GPU-aaa",device="nvidia0",modelName="NVIDIA H100 80GB HBM3",Hostname="h1"} 512.25
DCGM_FI_DEV_POWER_USAGE{gpu="1",UUID="GPU-bbb",device="nvidia1",modelName="NVIDIA H100 80GB HBM3",Hostname="h1",pod="vllm-0",namespace="ml",container="vllm"} 300.75
# HELP DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION Total energy consumption since boot (in mJ).
# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter
DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{gpu="0",UUID="GPU-aaa",device="nvidia0",modelName="NVIDIA H100 80GB HBM3",Hostname="h1"} 123456789
DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{gpu="1",UUID="GPU-bbb",device="nvidia1",modelName="NVIDIA H100 80GB HBM3",Hostname="h1",pod="vllm-0",namespace="ml",container="vllm"} 1000000
"""

# AMD device-metrics-exporter: power in W, energy in µJ
AMD_PAGE = """\
# HELP gpu_power_usage power usage in Watts
# TYPE gpu_power_usage gauge
gpu_power_usage{gpu_id="0",serial_number="S0",card_model="MI300X",hostname="h2"} 650
gpu_power_usage{gpu_id="1",serial_number="S1",card_model="MI300X",hostname="h2"} 150.5
# HELP gpu_energy_consumed accumulated energy consumed in uJ
# TYPE gpu_energy_consumed counter
gpu_energy_consumed{gpu_id="0",serial_number="S0",card_model="MI300X",hostname="h2"} 2.5e+12
gpu_energy_consumed{gpu_id="1",serial_number="S1",card_model="MI300X",hostname="h2"} 5e+11
"""


def test_dcgm_page_sums_gpus_in_watts_and_reads_the_counter_in_millijoules() -> None:
    r = parse_power_page(DCGM_PAGE)
    assert (r.exporter, r.gpus, r.power_w) == ("dcgm", 2, 813.0)
    assert sorted(r.energy_j_by_gpu.values()) == [pytest.approx(1000.0), pytest.approx(123456.789)]


def test_amd_page_reads_the_counter_in_microjoules() -> None:
    r = parse_power_page(AMD_PAGE)
    assert (r.exporter, r.gpus, r.power_w) == ("amd", 2, 800.5)
    assert sorted(r.energy_j_by_gpu.values()) == [pytest.approx(5e5), pytest.approx(2.5e6)]


def test_amd_package_power_when_there_is_no_power_usage() -> None:
    page = 'gpu_package_power{gpu_id="0"} 420\n'
    r = parse_power_page(page)
    assert (r.exporter, r.power_w, r.energy_j_by_gpu) == ("amd", 420.0, {})


def test_a_page_without_a_power_gauge_is_one_line() -> None:
    with pytest.raises(PowerPageError) as e:
        parse_power_page("<html><body>Grafana login</body></html>", "http://x/metrics")
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("http://x/metrics: no GPU power gauge in the page")
    assert "DCGM_FI_DEV_POWER_USAGE" in msg and "gpu_power_usage" in msg


@pytest.mark.parametrize("value", ["NaN", "+Inf", "-5", "lots"])
def test_a_value_that_is_no_power_is_refused(value: str) -> None:
    with pytest.raises(PowerPageError) as e:
        parse_power_page(f'DCGM_FI_DEV_POWER_USAGE{{gpu="0"}} {value}\n')
    assert "DCGM_FI_DEV_POWER_USAGE" in str(e.value) and "\n" not in str(e.value)


def test_counter_increases_are_summed_per_gpu_and_a_reset_counts_its_new_value() -> None:
    c = EnergyCounter()
    assert c.add({}) is None  # no counter on the page: the power gauge is integrated instead
    assert c.add({"a": 100.0, "b": 50.0}) == 0.0  # first look: energy used before it is not ours
    assert c.add({"a": 130.0, "b": 60.0}) == 40.0
    # GPU b's counter restarted (a driver reload): what it counted since, 5 J, is new
    assert c.add({"a": 140.0, "b": 5.0}) == 55.0
    assert c.resets == 1
    # a GPU that appears later adds from its second reading on
    assert c.add({"a": 150.0, "b": 7.0, "c": 1000.0}) == 67.0
    assert c.add({"a": 150.0, "b": 7.0, "c": 1003.0}) == 70.0


def test_the_flag_ties_urls_to_targets_or_to_the_fleet() -> None:
    srcs = parse_power_metrics("--power-metrics", "http://h1:9400/metrics, a=http://h2:9400/metrics")
    assert [(s.name, s.url, s.target) for s in srcs] == [
        ("gpu-0", "http://h1:9400/metrics", None),
        ("gpu-1", "http://h2:9400/metrics", "a"),
    ]
    # a URL's own '=' (a query) is not a target
    (q,) = parse_power_metrics("--power-metrics", "http://h1:9400/metrics?x=1")
    assert (q.url, q.target) == ("http://h1:9400/metrics?x=1", None)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("gpu-host:9400", "--power-metrics 'gpu-host:9400': not an http(s) URL"),
        ("=http://h:1/metrics", "--power-metrics '=http://h:1/metrics': the target name before '=' is empty"),
        ("http://h:1/m,http://h:1/m", "--power-metrics: the same URL is given twice"),
        (" , ", "--power-metrics: no URL given"),
    ],
)
def test_a_bad_flag_is_one_line(text: str, message: str) -> None:
    with pytest.raises(ValueError) as e:
        parse_power_metrics("--power-metrics", text)
    assert str(e.value).startswith(message) and "\n" not in str(e.value)
