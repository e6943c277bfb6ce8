"""A vLLM worker stand-in whose timings follow the performance model.

`xpyd emulate [--gpu B200] [--speedup X] [--zero-delay] -- <vLLM or SGLang command line>` reads the
model, --port, --tensor-parallel-size, --kv-transfer-config, --max-model-len, --max-num-seqs,
--max-num-batched-tokens, --served-model-name ... as the engine would, plus the pod env:
XPYD_BIND_HOST (bind address, wins over --host), XPYD_GPU, XPYD_SPEEDUP, XPYD_ZERO_DELAY,
XPYD_NODE_NAME, XPYD_NVLINK_DOMAIN, XPYD_KV_LEASE_SECONDS (default 30),
VLLM_NIXL_SIDE_CHANNEL_HOST and VLLM_NIXL_SIDE_CHANNEL_PORT (default 5600).

Routes: /v1/models, /v1/completions, /v1/chat/completions (SSE as vLLM streams it), /health,
/ping, /version, /metrics (vLLM metric names), /reset_prefix_cache.

Tokens are 4 characters of prompt text (or one id of a token-id prompt); the prefix cache
hashes full 16-token blocks with chained hashes. Generated text is a deterministic filler of
exactly 4 characters a token. A request with max_tokens generates exactly that many
(finish_reason "length"); a chat request without one stops after 256 tokens ("stop").

KV transfer (vLLM NixlConnector, when --kv-transfer-config is given): a prefill with
kv_transfer_params.do_remote_decode returns {do_remote_prefill, do_remote_decode,
remote_engine_id, remote_block_ids, remote_host, remote_port, tp_size, xpyd_nvlink_domain,
xpyd_node_name, xpyd_gpu} and leases the blocks; a decode with do_remote_prefill pulls them
from remote_host:remote_port (releasing the lease), sleeps the modelled handoff for the path
between the two pods (NVLink within an NVLink domain, else RDMA), then decodes. SGLang
(--disaggregation-mode prefill|decode) pairs requests through bootstrap_host/port/room.
"""
