"""Bodies of the sim's information endpoints: OpenAI ``/v1/models``, the SGLang-style
``/get_model_info``, ``/get_server_info`` and ``/get_load`` that routers read, and ``/sim/info``.

Each function takes the running ``SimServer`` and returns a JSON-ready dict.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from targets.sim import faults as F

if TYPE_CHECKING:
    from targets.sim.server import SimServer

VERSION = "0.1.0"
ENGINE = "loadgen-sim"


def models(server: SimServer) -> dict:
    model = {
        "id": server.model_name,
        "object": "model",
        "created": server.created,
        "owned_by": ENGINE,
        "root": server.model_name,
        "parent": None,
        "max_model_len": server.profile.max_model_len,
    }
    return {"object": "list", "data": [model]}


def version(_server: SimServer) -> dict:
    return {"version": VERSION, "engine": ENGINE}


def model_info(server: SimServer) -> dict:
    return {
        "model_path": server.model_name,
        "tokenizer_path": server.model_name,
        "is_generation": True,
        "preferred_sampling_params": None,
        "weight_version": "default",
        "has_image_understanding": False,
        "has_audio_understanding": False,
        "model_type": "sim",
        "architectures": ["LoadgenSim"],
    }


def server_info(server: SimServer) -> dict:
    p = server.profile
    e = server.engine
    return {
        "model_path": server.model_name,
        "served_model_name": server.model_name,
        "tokenizer_path": server.model_name,
        "host": "127.0.0.1",
        "port": server.port,
        "tp_size": 1,
        "dp_size": 1,  # sglang-router refuses a worker whose server info has no dp_size
        "page_size": p.block_size_tokens,
        "chunked_prefill_size": p.max_num_batched_tokens,
        "max_running_requests": p.max_num_seqs,
        "max_total_num_tokens": p.num_blocks * p.block_size_tokens,
        "context_length": p.max_model_len,
        "disaggregation_mode": "null",
        "version": VERSION,
        "internal_states": [
            {"num_running_reqs": e.num_running, "num_waiting_reqs": e.num_waiting, "last_gen_throughput": 0.0}
        ],
        "sim": sim_info(server),
    }


def load(server: SimServer) -> dict:
    e = server.engine
    return {
        "load": e.num_running + e.num_waiting,
        "num_reqs": e.num_running,
        "num_waiting_reqs": e.num_waiting,
        "num_tokens": e.cache.used_blocks * server.profile.block_size_tokens,
    }


def sim_info(server: SimServer) -> dict:
    """Who this sim is: launchers check ``pid`` and ``server_id`` to be sure the port is theirs."""
    p = server.profile
    return {
        "engine": ENGINE,
        "version": VERSION,
        "profile": server.profile.name,
        "model_name": server.model_name,
        "seed": server.config.seed,
        "time_scale": server.time_scale,
        "server_id": server.server_id,
        "pid": os.getpid(),
        "port": server.port,
        "faults": {k: getattr(server.config.faults, k) for k in (*F.KINDS, "stall_s")},
        "behaviour": {  # the profile's optional knobs, after the command line's overrides
            "reasoning_tokens": p.reasoning_tokens,
            "eos_lengths": None if p.eos_lengths is None else p.eos_lengths.to_dict(),
            "preemption": p.preemption,
            "tool_calls": None if p.tool_calls is None else p.tool_calls.to_dict(),
        },
    }
