"""The release pipeline as code: the workflow builds both architectures, signs, pushes the chart as OCI;
one version everywhere; `make image` and `make chart` fail or work as they say."""

from __future__ import annotations

import os
import subprocess
import tarfile
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from xpyd_api import labels as L
from xpyd_chart.helm import CHART, helm_binary

REPO = Path(__file__).resolve().parents[2]
WORKFLOW = REPO / ".github" / "workflows" / "release.yml"
CHART_META = yaml.safe_load((CHART / "Chart.yaml").read_text())
VERSION = str(CHART_META["version"])


def _workflow() -> dict[str, Any]:
    doc = yaml.safe_load(WORKFLOW.read_text())
    doc["on"] = doc.pop(True, doc.get("on"))  # YAML 1.1 reads the key `on` as true
    return dict(doc)


def _steps(job: str) -> list[dict[str, Any]]:
    return list(_workflow()["jobs"][job]["steps"])


def _uses(job: str) -> list[str]:
    return [str(s["uses"]).split("@")[0] for s in _steps(job) if "uses" in s]


def _runs(job: str) -> str:
    return "\n".join(str(s.get("run", "")) for s in _steps(job))


def test_workflow_runs_on_version_tags() -> None:
    assert _workflow()["on"] == {"push": {"tags": ["v[0-9]+.[0-9]+.[0-9]+*"]}}


def test_image_job_builds_both_architectures_and_pushes() -> None:
    workflow = _workflow()
    assert set(workflow["env"]["PLATFORMS"].split(",")) == {"linux/amd64", "linux/arm64"}
    assert workflow["env"]["IMAGE"] == L.OWN_IMAGE
    uses = _uses("image")
    assert uses.index("docker/setup-qemu-action") < uses.index("docker/build-push-action")
    assert "docker/setup-buildx-action" in uses
    build = next(s for s in _steps("image") if str(s.get("uses", "")).startswith("docker/build-push-action"))
    assert build["with"]["platforms"] == "${{ env.PLATFORMS }}"
    assert build["with"]["push"] is True
    assert build["with"]["tags"] == "${{ env.IMAGE }}:${{ needs.version.outputs.version }}"
    assert "imagetools inspect" in _runs("image"), "the pushed index is checked for every platform"


@pytest.mark.parametrize("job", ["image", "chart"])
def test_artifacts_are_signed_keyless(job: str) -> None:
    assert "sigstore/cosign-installer" in _uses(job)
    sign = [line for line in _runs(job).splitlines() if line.strip().startswith("cosign sign")]
    assert sign and all("--key" not in line and "@" in line for line in sign), "sign by digest, keyless"
    assert _workflow()["jobs"][job]["permissions"]["id-token"] == "write"


def test_chart_is_packaged_with_the_release_version_and_pushed_as_oci() -> None:
    runs = _runs("chart")
    assert 'helm package "$CHART_DIR"' in runs
    assert '--version "$v" --app-version "$v"' in runs
    assert 'helm push "dist/xpyd-operator-$v.tgz" "$CHART_REPO"' in runs
    assert _workflow()["env"]["CHART_REPO"].startswith("oci://")
    assert _workflow()["jobs"]["chart"]["needs"] == ["version", "image"], "the chart never names a missing image"


def test_the_version_job_refuses_a_tag_that_is_not_the_chart_version() -> None:
    script = _runs("version")
    env = {**os.environ, "GITHUB_REF_NAME": "v9.9.9", "CHART_DIR": str(CHART), "GITHUB_OUTPUT": os.devnull}
    bad = subprocess.run(["bash", "-ec", script], cwd=REPO, env=env, capture_output=True, text=True, timeout=30)
    assert bad.returncode == 1
    assert "must be equal" in bad.stdout
    env["GITHUB_REF_NAME"] = f"v{VERSION}"
    good = subprocess.run(["bash", "-ec", script], cwd=REPO, env=env, capture_output=True, text=True, timeout=30)
    assert good.returncode == 0, good.stdout + good.stderr


def test_one_version_for_chart_app_image_and_package() -> None:
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert str(CHART_META["appVersion"]) == VERSION
    assert pyproject["project"]["version"] == VERSION
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["image"]["tag"] == "", "an empty tag means appVersion (_helpers.tpl xpyd.image)"
    assert f"{L.OWN_IMAGE}:{VERSION}" in (REPO / "docs" / "install.md").read_text()


def _make(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["make", "-s", *args], cwd=REPO, capture_output=True, text=True, timeout=300, check=False)


@pytest.mark.parametrize(
    ("docker", "words"),
    [
        ("/nonexistent/docker", "'/nonexistent/docker' not found"),
        ("true", "'docker buildx' is missing"),  # a "docker" whose subcommands print nothing
    ],
)
def test_make_image_without_docker_says_so_in_one_line_and_exits_2(docker: str, words: str) -> None:
    result = _make("image", f"DOCKER={docker}", "DIST=/nonexistent/dist")
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert words in lines[0]
    assert result.stdout == ""


def test_make_chart_packages_the_chart_into_dist(tmp_path: Path) -> None:
    helm = helm_binary()
    if helm is None:
        pytest.skip("helm not found (set HELM, or build it with the local cluster)")
    result = _make("chart", f"HELM={helm}", f"DIST={tmp_path}")
    assert result.returncode == 0, result.stderr
    package = tmp_path / f"xpyd-operator-{VERSION}.tgz"
    with tarfile.open(package) as tar:
        names = set(tar.getnames())
        meta = yaml.safe_load(tar.extractfile("xpyd-operator/Chart.yaml").read())  # type: ignore[union-attr]
    assert (meta["version"], str(meta["appVersion"])) == (VERSION, VERSION)
    for member in ("values.schema.json", "templates/deployment.yaml", "templates/podmonitor.yaml"):
        assert f"xpyd-operator/{member}" in names
    crds = sorted(p.name for p in (REPO / "crds").glob("*.yaml"))
    assert {f"xpyd-operator/files/crds/{c}" for c in crds} <= names
    assert any(n.startswith("xpyd-operator/dashboards/") for n in names)
