"""The deployment files: Dockerfiles lint clean (hadolint), Kubernetes manifests validate against
the Kubernetes schemas offline (kubernetes-validate, strict), the compose stack mounts files that
exist, and the numbers that must agree across files do (drain budget vs grace periods, port,
user). The image itself is built and run by .ci/steps/40-image.sh (deploy/image/)."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
import yaml

from app.service.config import Settings
from tests.conftest import REPO_ROOT

DEPLOY = REPO_ROOT / "deploy"
DOCKERFILES = [REPO_ROOT / "Dockerfile", DEPLOY / "jetson" / "Dockerfile"]
MANIFESTS = sorted((DEPLOY / "k8s").rglob("*.yaml"))
KUSTOMIZATIONS = [p for p in MANIFESTS if p.name == "kustomization.yaml"]
PATCHES = [  # partial objects that kustomize merges into a resource: no schema of their own
    (k.parent / patch["path"]).resolve()
    for k in KUSTOMIZATIONS
    for patch in yaml.safe_load(k.read_text()).get("patches", [])
    if "path" in patch
]
RESOURCES = [p for p in MANIFESTS if p not in KUSTOMIZATIONS and p.resolve() not in PATCHES]
ORIN_PATCH = DEPLOY / "k8s" / "jetson" / "orin.yaml"
DEPLOYMENTS = [
    DEPLOY / "k8s" / "cpu" / "deployment.yaml",
    DEPLOY / "k8s" / "gpu" / "deployment.yaml",
]
KUBECTL = shutil.which("kubectl")
HADOLINT = shutil.which("hadolint") or (
    str(REPO_ROOT / ".venv" / "bin" / "hadolint")
    if (REPO_ROOT / ".venv" / "bin" / "hadolint").exists()
    else None
)


@pytest.mark.skipif(HADOLINT is None, reason="hadolint not installed (requirements/tools.txt)")
@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_hadolint(dockerfile):
    r = subprocess.run([HADOLINT, "--no-color", str(dockerfile)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize("version", ["1.29.0", None])  # oldest supported here, and the newest
@pytest.mark.parametrize("manifest", RESOURCES, ids=lambda p: str(p.relative_to(DEPLOY)))
def test_kubernetes_schema(manifest, version):
    kv = pytest.importorskip("kubernetes_validate")
    version = version or kv.utils.latest_version()
    for doc in yaml.safe_load_all(manifest.read_text()):
        kv.validate(doc, version, strict=True)  # raises ValidationError on a bad field


def test_kustomizations_list_every_resource_as_kustomize_loads_them():
    """A resource is a file in the kustomization's own folder or a folder with a kustomization
    of its own: kustomize refuses files outside the folder (the gpu variant listed
    ../service.yaml and `kubectl apply -k deploy/k8s/gpu` failed)."""
    for kustomization in (DEPLOY / "k8s").rglob("kustomization.yaml"):
        for rel in yaml.safe_load(kustomization.read_text())["resources"]:
            path = (kustomization.parent / rel).resolve()
            if path.is_dir():
                assert (path / "kustomization.yaml").is_file(), f"{kustomization}: {rel}"
            else:
                assert path.is_file(), f"{kustomization}: {rel}"
                assert path.parent == kustomization.parent, f"{kustomization}: {rel} outside"


def _kustomize(variant: str) -> list[dict]:
    r = subprocess.run(
        [KUBECTL, "kustomize", str(DEPLOY / "k8s" / variant)], capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr
    return list(yaml.safe_load_all(r.stdout))


POOL_KINDS = ["Deployment", "HorizontalPodAutoscaler", "PodDisruptionBudget", "Service"]


@pytest.mark.skipif(KUBECTL is None, reason="kubectl not installed")
@pytest.mark.parametrize(
    "variant, image, kinds",
    [
        ("", "lidarseg:cpu", POOL_KINDS),
        ("cpu", "lidarseg:cpu", POOL_KINDS),
        ("gpu", "lidarseg:cuda", POOL_KINDS),
        ("jetson", "lidarseg:jetson", ["Deployment", "Service"]),  # one pod per Orin
    ],
)
def test_kubectl_kustomize_renders_each_variant(variant, image, kinds):
    docs = _kustomize(variant)
    assert sorted(d["kind"] for d in docs) == kinds
    (dep,) = [d for d in docs if d["kind"] == "Deployment"]
    assert _container(dep)["image"] == image
    kv = pytest.importorskip("kubernetes_validate")
    for doc in docs:
        kv.validate(doc, kv.utils.latest_version(), strict=True)


@pytest.mark.skipif(KUBECTL is None, reason="kubectl not installed")
def test_jetson_variant_is_the_gpu_pod_made_for_an_orin():
    (dep,) = [d for d in _kustomize("jetson") if d["kind"] == "Deployment"]
    pod, c = dep["spec"]["template"]["spec"], _container(dep)
    assert pod["runtimeClassName"] == "nvidia"
    assert pod["nodeSelector"] == {"kubernetes.io/arch": "arm64"}
    assert pod["securityContext"]["supplementalGroups"] == [44]  # video: the GPU's device nodes
    assert pod["securityContext"]["runAsUser"] == 10001  # the gpu variant's, kept
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["LIDARSEG_DEVICE"] == "cuda" and env["LIDARSEG_MAX_BATCH"] == "1"
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert c["resources"]["requests"] == c["resources"]["limits"]
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"  # the gpu variant's, kept


def test_orin_patch_targets_the_gpu_pod_and_agrees_with_compose():
    """orin.yaml merges into the gpu Deployment by name (a wrong one fails kustomize), and the
    pod it makes sets every LIDARSEG_* variable the compose override for the same Orin sets, to
    the same value, and no other than the gpu pod's."""
    patch = yaml.safe_load(ORIN_PATCH.read_text())
    gpu = yaml.safe_load((DEPLOY / "k8s" / "gpu" / "deployment.yaml").read_text())
    assert patch["metadata"]["name"] == gpu["metadata"]["name"]
    assert _container(patch)["name"] == _container(gpu)["name"]
    compose = yaml.safe_load((DEPLOY / "compose.jetson.yaml").read_text())["services"]["lidarseg"]
    wanted = {k: v for k, v in compose["environment"].items() if k.startswith("LIDARSEG_")}
    gpu_env = {e["name"]: e.get("value") for e in _container(gpu)["env"]}
    orin_env = {e["name"]: e["value"] for e in _container(patch)["env"]}
    pod_env = gpu_env | orin_env  # strategic merge: env entries merge by name
    assert {k: pod_env.get(k) for k in wanted} == wanted
    assert set(orin_env) <= set(wanted), "orin.yaml sets what compose.jetson.yaml does not"


def _container(deployment: dict) -> dict:
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return container


@pytest.mark.parametrize("path", DEPLOYMENTS, ids=lambda p: str(p.relative_to(DEPLOY)))
def test_deployment_hardening_and_shutdown(path):
    dep = yaml.safe_load(path.read_text())
    pod = dep["spec"]["template"]["spec"]
    c = _container(dep)
    env = {e["name"]: e for e in c["env"]}
    budget = float(
        env.get("LIDARSEG_SHUTDOWN_BUDGET_S", {}).get(
            "value", Settings.model_fields["shutdown_budget_s"].default
        )
    )
    pre_stop = float(c["lifecycle"]["preStop"]["exec"]["command"][-1])
    assert pod["terminationGracePeriodSeconds"] > pre_stop + budget
    assert pod["securityContext"]["runAsNonRoot"] and pod["securityContext"]["runAsUser"] != 0
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert c["startupProbe"]["httpGet"]["path"] == "/readyz"
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert env["LIDARSEG_API_KEYS"]["valueFrom"]["secretKeyRef"]["name"] == "lidarseg-api-keys"
    assert c["resources"]["requests"] == c["resources"]["limits"]  # Guaranteed: a core a thread
    assert "replicas" not in dep["spec"]  # the autoscaler's to set
    annotations = dep["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == str(c["ports"][0]["containerPort"]) == "8000"
    gpu = path.parent.name == "gpu"
    assert ("nvidia.com/gpu" in c["resources"]["limits"]) is gpu


def _service_links(service: dict, ip: str = "10.96.0.10") -> dict[str, str]:
    """The variables kubelet puts in every pod of a Service's namespace (Docker-link style)
    unless the pod spec says enableServiceLinks: false."""
    name = service["metadata"]["name"].upper().replace("-", "_")
    ports = service["spec"]["ports"]
    env = {
        f"{name}_SERVICE_HOST": ip,
        f"{name}_SERVICE_PORT": str(ports[0]["port"]),
        f"{name}_PORT": f"tcp://{ip}:{ports[0]['port']}",
    }
    for p in ports:
        proto, port = p.get("protocol", "TCP"), p["port"]
        if "name" in p:
            env[f"{name}_SERVICE_PORT_{p['name'].upper().replace('-', '_')}"] = str(port)
        base = f"{name}_PORT_{port}_{proto}"
        env |= {base: f"{proto.lower()}://{ip}:{port}", f"{base}_PROTO": proto.lower()}
        env |= {f"{base}_PORT": str(port), f"{base}_ADDR": ip}
    return env


@pytest.mark.parametrize("path", DEPLOYMENTS, ids=lambda p: str(p.relative_to(DEPLOY)))
def test_service_links_cannot_reach_the_settings(path, monkeypatch):
    """The Service is named lidarseg, so Kubernetes would set LIDARSEG_PORT=tcp://IP:80 in the
    pods (over the image's LIDARSEG_PORT=8000) and the server would refuse to start; the pods
    say enableServiceLinks: false. The settings name the cause if a pod spec lacks it."""
    from pydantic import ValidationError

    from app.service.config import unread_variables

    pod = yaml.safe_load(path.read_text())["spec"]["template"]["spec"]
    assert pod.get("enableServiceLinks", True) is False
    links = _service_links(yaml.safe_load((DEPLOY / "k8s" / "common" / "service.yaml").read_text()))
    for name, value in links.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ValidationError, match="enableServiceLinks: false"):
        Settings()
    assert all("service link" in w for w in unread_variables(links))


def test_compose_stack_mounts_what_exists_and_agrees_with_the_image():
    stack = yaml.safe_load((DEPLOY / "compose.yaml").read_text())["services"]
    assert {"lidarseg", "prometheus", "grafana"} <= set(stack)
    for name, svc in stack.items():
        for volume in svc.get("volumes", []):
            src = volume.split(":")[0]
            assert (DEPLOY / src).exists(), f"{name}: {src} missing"
    prometheus = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    (job,) = prometheus["scrape_configs"]
    assert job["static_configs"][0]["targets"] == ["lidarseg:8000"]
    assert (DEPLOY / "grafana" / "provisioning" / "datasources").is_dir()
    grace = int(stack["lidarseg"]["stop_grace_period"].rstrip("s"))
    assert grace > Settings.model_fields["shutdown_budget_s"].default
    jetson = yaml.safe_load((DEPLOY / "compose.jetson.yaml").read_text())["services"]["lidarseg"]
    assert jetson["runtime"] == "nvidia"
    assert (REPO_ROOT / jetson["build"]["dockerfile"]).is_file()


def test_no_image_ships_the_build_hosts_apt_setting():
    """base.sh gives the base image this machine's apt setting (an expired-date mirror) under
    one name; the runtime stage removes it (it used to ship in every image)."""
    name = "99lidarseg-build-host"
    assert f'"$ROOT/etc/apt/apt.conf.d/{name}"' in (DEPLOY / "image" / "base.sh").read_text()
    runtime = (REPO_ROOT / "Dockerfile").read_text().split("AS runtime-base", 1)[1]
    assert f"/etc/apt/apt.conf.d/{name}" in runtime.split("useradd", 1)[0]


def test_images_share_entrypoint_port_user_and_never_compile_at_start():
    for dockerfile in DOCKERFILES:
        text = dockerfile.read_text()
        # tini as PID 1 passes SIGTERM on (deploy/image/pid1_check.sh runs it for real)
        assert 'ENTRYPOINT ["/usr/bin/tini", "-s", "--", "python", "-m", "app"]' in text
        assert re.search(r"apt-get install -y --no-install-recommends tini ", text), dockerfile
        assert "EXPOSE 8000" in text and "LIDARSEG_HOST=0.0.0.0" in text
        assert "LIDARSEG_KERNEL_BUILD=never" in text
        assert re.search(r"^USER 10001:10001$", text, re.M)
        assert "HEALTHCHECK" in text and "/healthz" in text
        assert "native" not in text  # never compile for the build host
        # Open3D does not load without libEGL.so.1 and libGL.so.1 (the images voxelized with
        # torch.unique, 75x slower)
        assert "libusb-1.0-0 libegl1 libgl1" in text, dockerfile


def dockerignore_rules() -> list[str]:
    lines = (REPO_ROOT / ".dockerignore").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def dockerignore_allowed() -> set[str]:
    """The paths .dockerignore's allow-list lets into the build context ("!path" rules)."""
    return {r[1:].rstrip("/") for r in dockerignore_rules() if r.startswith("!")}


def test_dockerignore_keeps_data_and_builds_out():
    assert dockerignore_rules()[0] == "*", "an allow-list: ignore everything first"
    assert dockerignore_allowed() == {"app", "models", "kernels", "requirements"}


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_every_file_a_dockerfile_copies_is_in_the_build_context(dockerfile):
    """COPY and ADD sources from the context exist and pass .dockerignore's allow-list (the
    Jetson image once copied deploy/jetson/requirements.txt, which the allow-list kept out)."""
    allowed = dockerignore_allowed()
    sources = []
    for line in dockerfile.read_text().splitlines():
        words = line.split()
        if words[:1] in (["COPY"], ["ADD"]) and not any(w.startswith("--from=") for w in words):
            sources += [w for w in words[1:-1] if not w.startswith("--")]
    assert sources, f"{dockerfile} copies nothing from the context"
    for source in sources:
        assert (REPO_ROOT / source).exists(), f"{dockerfile}: COPY {source}: no such file"
        top = source.rstrip("/")
        assert any(top == a or top.startswith(a + "/") for a in allowed), (
            f"{dockerfile}: COPY {source} is outside .dockerignore's allow-list {sorted(allowed)}"
        )
