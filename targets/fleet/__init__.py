"""The local fleet: engine replicas behind a real router (sglang-router, vllm-router), owned."""
