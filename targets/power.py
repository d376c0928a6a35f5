"""GPU power and energy from a DCGM-exporter-style ``/metrics`` page: parsing and counter bookkeeping.

Pure functions, no I/O (the scrape loop is ``loadgen/commands/power_scrape.py``; the energy over a
run's window is ``analysis/energy.py``). The names and units read, per exporter:

- NVIDIA dcgm-exporter: ``DCGM_FI_DEV_POWER_USAGE`` (gauge, W) and
  ``DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION`` (counter, mJ since boot);
- AMD device-metrics-exporter: ``gpu_power_usage``, else ``gpu_package_power`` (gauge, W), and
  ``gpu_energy_consumed`` (counter, µJ).

A page holds one sample per GPU (its label set); a reading is the sum over the GPUs. An energy
counter is kept per GPU: its increase between two readings is the difference, or, after a reset
(a counter that went down: a driver reload, a reboot), the new value, as Prometheus's
``increase()`` takes it. A page without a power gauge is a ``PowerPageError`` with one line.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

# (power gauge names in order of preference, energy counter name, joules per counter unit)
EXPORTERS: tuple[tuple[str, tuple[str, ...], str, float], ...] = (
    ("dcgm", ("DCGM_FI_DEV_POWER_USAGE",), "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", 1e-3),  # mJ
    ("amd", ("gpu_power_usage", "gpu_package_power"), "gpu_energy_consumed", 1e-6),  # µJ
)
POWER_NAMES = tuple(n for _, names, _, _ in EXPORTERS for n in names)
MAX_PAGE_BYTES = 8 << 20  # a dcgm page of 64 GPUs is well under 1 MiB; more is not an exporter


class PowerPageError(ValueError):
    """A page that gives no power reading; ``str()`` is one line saying what to check."""


@dataclass(frozen=True, slots=True)
class PowerReading:
    """One page: the power summed over its GPUs, and each GPU's energy counter in joules (or none)."""

    exporter: str  # "dcgm" | "amd"
    power_w: float
    gpus: int
    energy_j_by_gpu: dict[str, float] = field(default_factory=dict)  # empty: the page has no counter


def _split_sample(line: str) -> tuple[str, str, str] | None:
    """(name, labels text, value text) of one exposition line, or None for a comment or junk."""
    line = line.strip()
    if not line or line.startswith("#"):
        return None
    brace = line.find("{")
    if brace >= 0:
        close = line.rfind("}")
        if close < brace:
            return None
        name, labels, rest = line[:brace], line[brace + 1 : close], line[close + 1 :]
    else:
        name, _, rest = line.partition(" ")
        labels = ""
    parts = rest.split()
    if not name or not parts:
        return None
    return name.strip(), labels, parts[0]


def _gpu_key(labels: str) -> str:
    """The GPU a sample is of: its labels without the ones that change between scrapes."""
    # dcgm-exporter adds pod/container labels that may come and go with workloads; the GPU is its
    # index and UUID. Keep every label but those, so two GPUs never share a key.
    keep = [p for p in _label_pairs(labels) if p[0] not in ("pod", "namespace", "container", "Hostname")]
    return ",".join(f"{k}={v}" for k, v in sorted(keep))


def _label_pairs(labels: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    i, n = 0, len(labels)
    while i < n:
        eq = labels.find("=", i)
        if eq < 0:
            break
        key = labels[i:eq].strip().strip(",").strip()
        j = eq + 1
        if j < n and labels[j] == '"':
            j += 1
            value = []
            while j < n and labels[j] != '"':
                if labels[j] == "\\" and j + 1 < n:
                    j += 1
                value.append(labels[j])
                j += 1
            out.append((key, "".join(value)))
            i = j + 1
        else:
            end = labels.find(",", j)
            end = n if end < 0 else end
            out.append((key, labels[j:end].strip()))
            i = end + 1
    return out


def parse_power_page(text: str, where: str = "the page") -> PowerReading:
    """The reading of one ``/metrics`` page (see the module docstring); ``PowerPageError`` when the
    page holds none of the power gauges, or a value that is not a finite number of watts or joules."""
    wanted = {*POWER_NAMES, *(e for _, _, e, _ in EXPORTERS)}
    values: dict[str, dict[str, float]] = {}
    for line in text.splitlines():
        sample = _split_sample(line)
        if sample is None or sample[0] not in wanted:
            continue
        name, labels, raw = sample
        try:
            value = float(raw)
        except ValueError:
            raise PowerPageError(f"{where}: {name} has the value {raw[:40]!r}, not a number") from None
        if not math.isfinite(value) or value < 0:
            raise PowerPageError(f"{where}: {name} has the value {raw[:40]!r}; a power or an energy is a finite number >= 0")
        values.setdefault(name, {})[_gpu_key(labels)] = value
    for exporter, power_names, energy_name, joules_per_unit in EXPORTERS:
        power_name = next((n for n in power_names if values.get(n)), None)
        if power_name is None:
            continue
        power = values[power_name]
        energy = {gpu: v * joules_per_unit for gpu, v in values.get(energy_name, {}).items()}
        return PowerReading(exporter, float(sum(power.values())), len(power), energy)
    names = ", ".join(POWER_NAMES)
    raise PowerPageError(
        f"{where}: no GPU power gauge in the page (looked for {names}); point --power-metrics at a "
        "dcgm-exporter or an AMD device-metrics-exporter /metrics"
    )


@dataclass(slots=True)
class EnergyCounter:
    """Joules used since the first reading, from each GPU's counter (resets taken as Prometheus does).

    ``add`` returns the running total, or None when the reading has no counter (the window's
    energy then comes from the power gauge). A GPU seen for the first time adds nothing: its
    counter's value is energy used before we looked.
    """

    last_by_gpu: dict[str, float] = field(default_factory=dict)
    total_j: float = 0.0
    resets: int = 0

    def add(self, energy_j_by_gpu: dict[str, float]) -> float | None:
        if not energy_j_by_gpu:
            return None
        for gpu, value in energy_j_by_gpu.items():
            last = self.last_by_gpu.get(gpu)
            if last is not None:
                if value >= last:
                    self.total_j += value - last
                else:
                    self.resets += 1
                    self.total_j += value  # restarted from zero: what it counted since is all new
            self.last_by_gpu[gpu] = value
        return self.total_j


@dataclass(frozen=True, slots=True)
class PowerSource:
    """One ``--power-metrics`` endpoint: its name in results, its URL and the target it is tied to."""

    name: str
    url: str
    target: str | None  # None: the fleet as a whole (counts in the total only)


def parse_power_metrics(flag: str, text: str) -> list[PowerSource]:
    """``--power-metrics`` text: comma-separated ``URL`` (the fleet) or ``TARGET=URL`` (one target's
    GPUs); a ``ValueError`` with one line per mistake."""
    out: list[PowerSource] = []
    for raw in (p.strip() for p in text.split(",")):
        if not raw:
            continue
        target: str | None = None
        url = raw
        if "=" in raw and not raw.split("=", 1)[0].startswith(("http://", "https://")):
            target, url = (s.strip() for s in raw.split("=", 1))
            if not target:
                raise ValueError(f"{flag} {raw!r}: the target name before '=' is empty; give TARGET=URL or just URL")
        if not url.startswith(("http://", "https://")) or len(url) <= len("http://"):
            raise ValueError(f"{flag} {raw!r}: not an http(s) URL; give e.g. http://gpu-host:9400/metrics")
        out.append(PowerSource(f"gpu-{len(out)}", url, target))
    if not out:
        raise ValueError(f"{flag}: no URL given; give URL or TARGET=URL, comma-separated")
    if len({s.url for s in out}) != len(out):
        raise ValueError(f"{flag}: the same URL is given twice; its energy would be counted twice")
    return out


__all__ = [
    "EXPORTERS",
    "MAX_PAGE_BYTES",
    "EnergyCounter",
    "PowerPageError",
    "PowerReading",
    "PowerSource",
    "parse_power_metrics",
    "parse_power_page",
]
