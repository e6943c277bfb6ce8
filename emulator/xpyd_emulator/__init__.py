"""A vLLM worker stand-in whose timings follow the performance model.

`xpyd emulate [--gpu B200] [--speedup X] [--zero-delay] [limits] -- <vLLM or SGLang command line>`
reads the model, --port, --tensor-parallel-size, --kv-transfer-config, --max-model-len,
--max-num-seqs, --max-num-batched-tokens, --served-model-name, --config FILE ... as the engine
would (modelled flags are range-checked; near-misses of them are refused), plus the pod env:
XPYD_BIND_HOST (bind address, wins over --host), XPYD_GPU, XPYD_SPEEDUP, XPYD_ZERO_DELAY,
XPYD_NODE_NAME, XPYD_NVLINK_DOMAIN, XPYD_KV_LEASE_SECONDS (else VLLM_NIXL_ABORT_REQUEST_TIMEOUT,
default 30), VLLM_NIXL_SIDE_CHANNEL_HOST and VLLM_NIXL_SIDE_CHANNEL_PORT (default 5600), and the
knobs of options.py (XPYD_KV_PEERS, XPYD_DRAIN_TIMEOUT, XPYD_HEADER_TIMEOUT, XPYD_BODY_TIMEOUT,
XPYD_MAX_BODY_MB, XPYD_MAX_CONNECTIONS, each with an `xpyd emulate` flag).

Routes: /v1/models, /v1/completions, /v1/chat/completions (SSE as vLLM streams it), /health
(503 when draining or wedged), /ping, /version, /metrics (vLLM metric names), /reset_prefix_cache.
Errors are vLLM's {"error": {message, type, param, code}}. Every port serves on the router's
HTTP/1.1 listener (xpyd_http), within the limits listener.py gives it.

Tokens are 4 characters of prompt text (or one id of a token-id prompt); the prefix cache
hashes full 16-token blocks with chained hashes. Generated text is a deterministic filler of
exactly 4 characters a token. A request with max_tokens generates exactly that many
(finish_reason "length"); a chat request without one stops after 256 tokens ("stop").

KV events (--kv-events-config, vLLM's or SGLang's JSON): the block pool's stores, evictions and
resets are published as vLLM 0.11 publishes them (ZMQ PUB [topic, seq, msgpack batch] plus a
replay ROUTER socket; kv_publisher.py), on the emulator's own host instead of `*`. Token ids are
a fixed mix of each token's 4 characters, so a router computes the same ids.

KV transfer (vLLM NixlConnector, when --kv-transfer-config is given): a prefill with
kv_transfer_params.do_remote_decode leases its blocks when it finishes (streamed or not; the
lease expires) and, unstreamed, returns {do_remote_prefill, do_remote_decode, remote_engine_id,
remote_block_ids, remote_host, remote_port, tp_size, xpyd_nvlink_domain, xpyd_node_name,
xpyd_gpu}; a decode with do_remote_prefill pulls them from remote_host:remote_port (an allowed
peer only, see peers.py), releasing the lease, sleeps the modelled handoff for the path between
the two pods (NVLink within an NVLink domain, else RDMA), then decodes. The side channel's answer
carries the prefill's handshake (its handoff facts, xpyd_api.handoff, and its XPYD_ENGINE_REV, which
the operator sets from the pod label xpyd.io/engine-rev): a decode refuses KV from a prefill of another
revision, or with facts the newest vLLM's NixlConnector refuses (KV cache dtype, model, block and
tensor parallel sizes), with vLLM's failed-KV-load answer, HTTP 500 (or recomputes, with
kv_load_failure_policy=recompute). Injected faults (faults.py, --fault-kv-pull-*) make pulls from named
prefill peers fail with that answer or take longer, for a while, to exercise a router's pair self-healing.
SGLang (--disaggregation-mode prefill|decode) pairs requests through bootstrap_host/port/room.
SIGTERM drains the worker like a pod (server.py).

Multi-node replicas (a LeaderWorkerSet group; parallel.py reads vLLM's data-parallel / --nnodes
flags and SGLang's --nnodes/--node-rank/--dist-init-addr): the API rank models the whole replica
(every GPU, data and expert parallel, the MoE all-to-all over NVLink or NICs) and answers /health
503 until ranks 1..N-1 have joined it over the emulator's rank protocol (ranks.py, leader.py),
and for good once one is lost; the other ranks serve no API, and exit 1 when they lose their
leader or cannot reach it (member.py). XPYD_HOSTS_FILE names an /etc/hosts-style file consulted
before the resolver; `sh -c` wrappers have their $VAR, ${VAR:-x} and $((...)) words evaluated.
"""
