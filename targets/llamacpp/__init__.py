"""Local llama.cpp ``llama-server`` replicas: find the cached build, start, health-check, stop."""

from targets.llamacpp.launcher import (
    LlamaServerError,
    Replica,
    Replicas,
    default_threads,
    ensure_llama_server,
    start_llama_servers,
)

__all__ = [
    "LlamaServerError",
    "Replica",
    "Replicas",
    "default_threads",
    "ensure_llama_server",
    "start_llama_servers",
]
