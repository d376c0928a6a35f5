"""Target files: where the load goes and how to talk to it, as YAML (``--target-file``).

::

    url: http://vllm.inference.svc:8000     # required
    adapter: openai-chat                    # loadgen.targets entry point
    model: meta-llama/Llama-3.1-8B-Instruct
    label: vllm-h100                        # name in results (default host:port)
    kind: vllm                              # openai, router, vllm, sglang, llama-server
    api_key_env: TARGET_API_KEY             # the key itself never goes in a file
    session_header: X-Session-ID
    cost_per_hour: 4.0                      # USD, for tokens per dollar
    labels: {hardware: 1xH100, model: llama-3.1-8b}
    expect: {model: meta-llama/Llama-3.1-8B-Instruct, engine: vllm, build: "0.6.3"}

Flags given on the command line win over the file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from loadgen.errors import UserError

KEYS = {
    "url": str,
    "adapter": str,
    "model": str,
    "label": str,
    "kind": str,
    "api_key_env": str,
    "session_header": str,
    "cost_per_hour": (int, float),
    "cost_per_hour_usd": (int, float),
    "labels": dict,
    "expect": dict,
}
EXPECT_KEYS = ("model", "engine", "build")


def load_target_file(path: str | Path) -> dict[str, Any]:
    """The validated mapping in ``path``; a one-line UserError names the file and the key."""
    p = Path(path)
    if not p.is_file():
        raise UserError(f"--target-file {p}: no such file")
    if any(k in p.read_text() for k in ("api_key:", "api-key:")):
        raise UserError(f"{p}: do not put API keys in target files; set api_key_env: VAR and export VAR")
    try:
        data = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        raise UserError(f"{p}{where}: not valid YAML ({getattr(e, 'problem', e)})") from None
    if not isinstance(data, dict):
        raise UserError(f"{p}: expected a mapping of target settings (url, adapter, model, ...)")
    for key, value in data.items():
        if key not in KEYS:
            raise UserError(f"{p}: unknown key {key!r}; allowed: {', '.join(KEYS)}")
        if not isinstance(value, KEYS[key]) or isinstance(value, bool):
            raise UserError(f"{p}: {key}: {value!r} has the wrong type")
    if "url" not in data:
        raise UserError(f"{p}: missing url (the target's base URL, e.g. http://127.0.0.1:8000)")
    if not data["url"].startswith(("http://", "https://")):
        raise UserError(f"{p}: url {data['url']!r} is not an http(s) URL")
    cost = data.get("cost_per_hour", data.get("cost_per_hour_usd"))
    if cost is not None and cost < 0:
        raise UserError(f"{p}: cost_per_hour must be >= 0")
    for k in data.get("expect", {}):
        if k not in EXPECT_KEYS:
            raise UserError(f"{p}: expect.{k}: unknown; allowed: {', '.join(EXPECT_KEYS)}")
    return data


def apply_target_file(opts: Any, data: dict[str, Any]) -> None:
    """Fill RunOptions fields the command line left unset."""
    fill = {
        "target": data.get("url"),
        "model": data.get("model"),
        "target_label": data.get("label"),
        "target_kind": data.get("kind"),
        "api_key_env": data.get("api_key_env"),
        "session_header": data.get("session_header"),
        "cost_per_hour": data.get("cost_per_hour", data.get("cost_per_hour_usd")),
    }
    for field, value in fill.items():
        if value is not None and getattr(opts, field) in (None, ""):
            setattr(opts, field, value)
    if data.get("adapter") and opts.adapter == "openai-chat":
        opts.adapter = data["adapter"]
    opts.target_labels = {**data.get("labels", {}), **opts.target_labels}
    opts.expect = {**data.get("expect", {}), **opts.expect}
