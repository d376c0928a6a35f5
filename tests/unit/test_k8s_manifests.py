"""Deployment files: every Kubernetes object validates offline, every command is the CLI contract.

The kustomizations under ``k8s/`` are rendered by the small kustomize subset below (``resources``,
``namespace``, ``images``, strategic-merge ``patches`` including ``$patch: delete``); a kustomization
using any other key fails the test rather than being rendered wrongly. Objects are checked against
the Kubernetes JSON schemas that ``kubernetes-validate`` ships (strict: unknown fields are errors),
so no cluster and no kubectl are needed. Where kubectl is installed, its own ``kubectl kustomize``
output must equal ours.
"""

from __future__ import annotations

import copy
import json
import re
import shlex
import shutil
import subprocess
from functools import cache
from pathlib import Path

import pytest
import yaml

from analysis.units import parse_duration_s
from workloads.spec import parse_spec

kubernetes_validate = pytest.importorskip(
    "kubernetes_validate", reason="pip install kubernetes-validate (part of the dev extra)"
)

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "k8s"
DROPLET = K8S / "droplet"
K8S_VERSION = "1.30"  # the oldest release the manifests support; kubernetes-validate ships its schema

# The CLI contract (docs/distributed.md): flags that take a value, and switches.
MASTER_VALUE_FLAGS = {
    "--workload",
    "--rate",
    "--arrival",
    "--duration",
    "--num-sessions",
    "--seed",
    "--target",
    "--adapter",
    "--model",
    "--api-key-env",
    "--slo",
    "--results",
    "--cost-per-hour",
    "--target-file",
    "--max-schedule-lag",
    "--expect-workers",
    "--bind",
    "--master-port",
    "--web-port",
    "--prometheus-port",
    "--prometheus-host",
    "--prometheus-linger",
}
MASTER_SWITCHES = {"--headless"}
WORKER_VALUE_FLAGS = {"--master-host", "--master-port"}
RENDERED_KEYS = {"apiVersion", "kind", "namespace", "resources", "patches", "images"}
WORKLOAD_KINDS = {"Deployment", "Job", "StatefulSet", "DaemonSet"}
SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD", re.IGNORECASE)


# --- a kustomize subset -------------------------------------------------------------------------


def load_documents(path: Path) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def _merge(base, patch):
    """Strategic merge as far as k8s/ needs it: maps merge, lists of named items merge by name."""
    if isinstance(base, dict) and isinstance(patch, dict):
        out = dict(base)
        for key, value in patch.items():
            out[key] = _merge(base[key], value) if key in base else value
        return out
    if (
        isinstance(base, list)
        and isinstance(patch, list)
        and all(isinstance(item, dict) and "name" in item for item in base + patch)
    ):
        by_name = {item["name"]: item for item in base}
        for item in patch:
            by_name[item["name"]] = _merge(by_name[item["name"]], item) if item["name"] in by_name else item
        return list(by_name.values())
    return patch


def _key(obj: dict) -> tuple[str, str]:
    return obj["kind"], obj["metadata"]["name"]


def _apply_images(obj: dict, images: list[dict]) -> None:
    for container in _containers(obj):
        name, _, tag = container["image"].partition(":")
        for image in images:
            if image["name"] == name:
                name, tag = image.get("newName", name), str(image.get("newTag", tag))
                container["image"] = f"{name}:{tag}" if tag else name


@cache
def render(directory: Path) -> tuple[dict, ...]:
    kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text())
    unknown = set(kustomization) - RENDERED_KEYS
    assert not unknown, f"{directory}: kustomization keys {unknown} are not rendered by this test; add them"
    objects: list[dict] = []
    for entry in kustomization.get("resources", []):
        path = directory / entry
        objects += copy.deepcopy(render(path.resolve())) if path.is_dir() else load_documents(path)
    for entry in kustomization.get("patches", []):
        assert set(entry) == {"path"}, f"{directory}: only `patches: - path: FILE` is rendered"
        (patch,) = load_documents(directory / entry["path"])
        index = [_key(o) for o in objects].index(_key(patch))
        if patch.get("$patch") == "delete":
            del objects[index]
        else:
            objects[index] = _merge(objects[index], patch)
    for obj in objects:
        if "namespace" in kustomization and obj["kind"] != "Namespace":
            obj["metadata"]["namespace"] = kustomization["namespace"]
        _apply_images(obj, kustomization.get("images", []))
    return tuple(objects)


def _referenced(directory: Path) -> set[Path]:
    kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text())
    entries = kustomization.get("resources", []) + [p["path"] for p in kustomization.get("patches", [])]
    return {(directory / e).resolve() for e in entries}


KUSTOMIZATIONS = sorted(p.parent for p in K8S.rglob("kustomization.yaml"))
REFERENCED = set().union(*(_referenced(d) for d in KUSTOMIZATIONS))
# Complete manifests applied on their own (`kubectl apply -f`), e.g. optional or after-run objects.
STANDALONE = sorted(
    p
    for p in K8S.rglob("*.yaml")
    if p.name != "kustomization.yaml" and DROPLET not in p.parents and p.resolve() not in REFERENCED
)
OVERLAY_IDS = [str(d.relative_to(K8S)) for d in KUSTOMIZATIONS]


# --- object helpers -----------------------------------------------------------------------------


def _pod_spec(obj: dict) -> dict | None:
    if obj["kind"] == "Pod":
        return obj["spec"]
    if obj["kind"] in WORKLOAD_KINDS:
        return obj["spec"]["template"]["spec"]
    return None


def _containers(obj: dict) -> list[dict]:
    spec = _pod_spec(obj) or {}
    return spec.get("initContainers", []) + spec.get("containers", [])


def _loadgen_containers(objects, role: str | None = None):
    """(object, container, argv) for each workload container; role is ``master`` or ``worker``."""
    for obj in objects:
        if obj["kind"] in WORKLOAD_KINDS:
            for container in _containers(obj):
                argv = container.get("command", []) + container.get("args", [])
                if role is None or argv[1:2] == [role]:
                    yield obj, container, argv


def parse_flags(argv: list[str]) -> dict[str, str | bool]:
    """Flags of ``loadgen master|worker ...``, checked against the contract."""
    assert argv[0] == "loadgen" and argv[1] in ("master", "worker"), f"not a loadgen command: {argv}"
    value_flags = MASTER_VALUE_FLAGS if argv[1] == "master" else WORKER_VALUE_FLAGS
    switches = MASTER_SWITCHES if argv[1] == "master" else set()
    flags: dict[str, str | bool] = {}
    rest = iter(argv[2:])
    for token in rest:
        assert token in value_flags | switches, f"{token!r} is not a `loadgen {argv[1]}` flag"
        flags[token] = True if token in switches else next(rest)
    return flags


def _quantity(text) -> float:
    """CPU in cores (``500m`` -> 0.5) or memory in MiB (``1Gi`` -> 1024)."""
    text = str(text)
    units = {"m": 1e-3, "Mi": 1.0, "Gi": 1024.0, "Ki": 1 / 1024}
    for suffix, factor in units.items():
        if text.endswith(suffix):
            return float(text[: -len(suffix)]) * factor
    return float(text)


# --- schema validation --------------------------------------------------------------------------


def _validate(objects, where: str) -> None:
    for obj in objects:
        assert obj["kind"] != "Secret", f"{where}: ship no Secret; pods reference one by name"
        try:
            kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as e:
            path = ".".join(str(p) for p in e.path)
            pytest.fail(f"{where}: {obj['kind']}/{obj['metadata']['name']}: {path}: {e.message}")


@pytest.mark.parametrize("directory", KUSTOMIZATIONS, ids=OVERLAY_IDS)
def test_rendered_objects_validate_against_kubernetes_schema(directory):
    objects = render(directory)
    assert objects
    _validate(objects, str(directory.relative_to(REPO)))


@pytest.mark.parametrize("path", STANDALONE, ids=lambda p: str(p.relative_to(K8S)))
def test_standalone_manifests_validate_against_kubernetes_schema(path):
    _validate(load_documents(path), str(path.relative_to(REPO)))


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl not installed")
@pytest.mark.parametrize("directory", KUSTOMIZATIONS, ids=OVERLAY_IDS)
def test_renderer_agrees_with_kubectl_kustomize(directory):
    out = subprocess.run(["kubectl", "kustomize", str(directory)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    theirs = sorted(yaml.safe_load_all(out.stdout), key=_key)
    assert theirs == sorted(render(directory), key=_key)


# --- invariants ---------------------------------------------------------------------------------


@pytest.mark.parametrize("directory", KUSTOMIZATIONS, ids=OVERLAY_IDS)
def test_every_container_runs_loadgen_master_or_worker_with_contract_flags(directory):
    found = list(_loadgen_containers(render(directory)))
    roles = [argv[1] for _, _, argv in found]
    assert sorted(roles) == ["master", "worker"], roles
    for _, container, argv in found:
        assert container["command"] == ["loadgen"], "the command is the console script; args follow"
        parse_flags(argv)


@pytest.mark.parametrize("directory", KUSTOMIZATIONS, ids=OVERLAY_IDS)
def test_workers_reach_the_master_through_its_service(directory):
    objects = render(directory)
    ((master_obj, master, master_argv),) = _loadgen_containers(objects, "master")
    ((worker_obj, _, worker_argv),) = _loadgen_containers(objects, "worker")
    master_flags, worker_flags = parse_flags(master_argv), parse_flags(worker_argv)
    assert master_flags["--bind"] == "0.0.0.0", "workers run in other pods: bind every interface"
    services = {o["metadata"]["name"]: o for o in objects if o["kind"] == "Service"}
    service = services[worker_flags["--master-host"]]
    labels = master_obj["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items(), "the Service must select the master pod"
    (port,) = [p for p in service["spec"]["ports"] if str(p["port"]) == worker_flags["--master-port"]]
    container_ports = {p["name"]: p["containerPort"] for p in master["ports"]}
    assert str(container_ports[port["targetPort"]]) == master_flags.get("--master-port", "5557")
    assert not worker_obj["spec"]["template"]["spec"]["enableServiceLinks"]
    assert not master_obj["spec"]["template"]["spec"]["enableServiceLinks"], (
        "service links inject LOADGEN_MASTER_PORT=tcp://... into the environment"
    )


@pytest.mark.parametrize("directory", KUSTOMIZATIONS, ids=OVERLAY_IDS)
def test_expect_workers_equals_the_worker_count(directory):
    objects = render(directory)
    ((_, _, master_argv),) = _loadgen_containers(objects, "master")
    ((worker_obj, _, _),) = _loadgen_containers(objects, "worker")
    spec = worker_obj["spec"]
    count = spec["replicas"] if worker_obj["kind"] == "Deployment" else spec["parallelism"]
    if worker_obj["kind"] == "Job":
        assert spec["completions"] == spec["parallelism"]
    assert int(parse_flags(master_argv)["--expect-workers"]) == count


@pytest.mark.parametrize("directory", KUSTOMIZATIONS, ids=OVERLAY_IDS)
def test_api_key_comes_from_a_secret_by_name(directory):
    objects = render(directory)
    ((_, _, master_argv),) = _loadgen_containers(objects, "master")
    key_var = parse_flags(master_argv)["--api-key-env"]
    for _, container, _ in _loadgen_containers(objects):
        env = {e["name"]: e for e in container.get("env", [])}
        assert env[key_var]["valueFrom"]["secretKeyRef"]["name"], f"{container['name']} lacks {key_var}"
        for e in env.values():
            assert not (SECRET_NAME.search(e["name"]) and "value" in e), f"{e['name']} is inlined"


@pytest.mark.parametrize("directory", KUSTOMIZATIONS, ids=OVERLAY_IDS)
def test_pods_are_non_root_read_only_and_sized(directory):
    for obj, container, argv in _loadgen_containers(render(directory)):
        pod = _pod_spec(obj)
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] > 0
        security = container["securityContext"]
        assert security["readOnlyRootFilesystem"] is True
        assert security["allowPrivilegeEscalation"] is False
        requests, limits = container["resources"]["requests"], container["resources"]["limits"]
        assert {"cpu", "memory"} <= requests.keys() and {"cpu", "memory"} <= limits.keys()
        if argv[1] == "worker":
            # ~40% of a core keeps token timing under 1 ms: request half a core, cap at one.
            assert _quantity(requests["cpu"]) == 0.5 and _quantity(limits["cpu"]) == 1
            assert 256 <= _quantity(requests["memory"]) <= _quantity(limits["memory"]) <= 512


@pytest.mark.parametrize("directory", KUSTOMIZATIONS, ids=OVERLAY_IDS)
def test_master_files_are_mounted_and_results_writable(directory):
    objects = render(directory)
    ((master_obj, master, master_argv),) = _loadgen_containers(objects, "master")
    flags = parse_flags(master_argv)
    volumes = {v["name"]: v for v in master_obj["spec"]["template"]["spec"]["volumes"]}
    mounts = {m["mountPath"]: m for m in master["volumeMounts"]}
    results = mounts[flags["--results"]]
    assert not results.get("readOnly") and "persistentVolumeClaim" in volumes[results["name"]]
    config_maps = {o["metadata"]["name"]: o for o in objects if o["kind"] == "ConfigMap"}
    for flag in ("--workload", "--target-file"):
        directory_, _, key = flags[flag].rpartition("/")
        config_map = config_maps[volumes[mounts[directory_]["name"]]["configMap"]["name"]]
        assert key in config_map["data"], f"{flag} {flags[flag]} is not in the ConfigMap"


def test_example_workloads_are_valid_specs():
    (config_map,) = [o for o in render(K8S / "base") if o["kind"] == "ConfigMap"]
    droplet = yaml.safe_load((DROPLET / "master-cloud-init.yaml").read_text())
    (droplet_workload,) = [
        f["content"] for f in droplet["write_files"] if f["path"].endswith("workload.yaml")
    ]
    for where, text in [
        ("configmap.yaml", config_map["data"]["workload.yaml"]),
        ("droplet", droplet_workload),
    ]:
        parse_spec(yaml.safe_load(text), where=where)


@pytest.mark.parametrize("directory", KUSTOMIZATIONS, ids=OVERLAY_IDS)
def test_prometheus_scrapes_the_masters_metrics_port(directory):
    objects = render(directory)
    ((master_obj, master, argv),) = _loadgen_containers(objects, "master")
    flags = parse_flags(argv)
    port = int(flags["--prometheus-port"])
    assert flags["--prometheus-host"] == "0.0.0.0", "Prometheus scrapes from another pod"
    annotations = master_obj["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/path"] == "/metrics"
    assert int(annotations["prometheus.io/port"]) == port
    assert {p["name"]: p["containerPort"] for p in master["ports"]}["metrics"] == port
    (policy,) = [o for o in objects if o["kind"] == "NetworkPolicy"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= master_obj["spec"]["template"]["metadata"]["labels"].items()
    admitted = [r for r in policy["spec"]["ingress"] if any(p["port"] == port for p in r.get("ports", []))]
    assert admitted, f"the NetworkPolicy blocks the metrics port {port}"
    if master_obj["kind"] == "Job":
        # The pod ends with the run: it must outlive one scrape interval to show the final numbers.
        assert parse_duration_s(flags["--prometheus-linger"]) >= 15


def test_master_deployment_probes_the_web_port():
    ((obj, master, argv),) = _loadgen_containers(render(K8S / "base"), "master")
    web_port = int(parse_flags(argv).get("--web-port", 8089))
    ports = {p["name"]: p["containerPort"] for p in master["ports"]}
    for probe in ("readinessProbe", "livenessProbe"):
        assert ports[master[probe]["httpGet"]["port"]] == web_port == 8089
    assert obj["spec"]["replicas"] == 1 and obj["spec"]["strategy"]["type"] == "Recreate"


def test_ci_job_exit_code_is_the_verdict_and_results_can_be_collected():
    objects = render(K8S / "overlays" / "ci-job")
    assert not [o for o in objects if o["kind"] == "Deployment"]
    ((job, master, argv),) = _loadgen_containers(objects, "master")
    flags = parse_flags(argv)
    assert job["kind"] == "Job" and flags["--headless"] is True and flags["--slo"]
    assert job["spec"]["backoffLimit"] == 0
    assert job["spec"]["template"]["spec"]["restartPolicy"] == "Never"
    (fail_rule,) = [r for r in job["spec"]["podFailurePolicy"]["rules"] if r["action"] == "FailJob"]
    assert fail_rule["onExitCodes"] == {
        "containerName": master["name"],
        "operator": "In",
        "values": [1, 2, 3, 4],
    }
    (reader,) = load_documents(K8S / "overlays" / "ci-job" / "collect" / "results-reader.yaml")
    claims = {
        v["persistentVolumeClaim"]["claimName"]
        for o in (job, reader)
        for v in _pod_spec(o)["volumes"]
        if "persistentVolumeClaim" in v
    }
    assert len(claims) == 1, f"the reader must mount the Job's results volume, not {claims}"
    assert all(m.get("readOnly") for m in reader["spec"]["containers"][0]["volumeMounts"])


def test_one_pinned_image_for_master_workers_and_reader():
    base_images = {c["image"] for _, c, _ in _loadgen_containers(render(K8S / "base"))}
    assert len(base_images) == 1 and re.fullmatch(r"loadgen:\d+\.\d+\.\d+", base_images.pop())
    for directory in KUSTOMIZATIONS:
        images = {c["image"] for _, c, _ in _loadgen_containers(render(directory))}
        assert len(images) == 1, f"{directory}: master and workers run different images {images}"
    tags = {
        c["image"].rpartition(":")[2] for d in KUSTOMIZATIONS for _, c, _ in _loadgen_containers(render(d))
    }
    (reader,) = load_documents(K8S / "overlays" / "ci-job" / "collect" / "results-reader.yaml")
    tags.add(reader["spec"]["containers"][0]["image"].rpartition(":")[2])
    assert len(tags) == 1, f"one loadgen version everywhere, not {tags}"


# --- container image ----------------------------------------------------------------------------


def _dockerfile_instructions() -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", (REPO / "Dockerfile").read_text())
    lines = [line.strip() for line in text.splitlines()]
    return [tuple(line.split(None, 1)) for line in lines if line and not line.startswith("#")]


def test_dockerfile_runs_loadgen_as_non_root_without_secrets():
    instructions = _dockerfile_instructions()
    final = instructions[max(i for i, (op, _) in enumerate(instructions) if op.upper() == "FROM") :]
    assert re.match(r"python:\$\{PYTHON_VERSION\}-slim|python:3\.1[12]-slim", final[0][1])
    users = [arg for op, arg in final if op.upper() == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0")
    (entrypoint,) = [arg for op, arg in final if op.upper() == "ENTRYPOINT"]
    assert json.loads(entrypoint) == ["loadgen"]
    for op, arg in instructions:
        if op.upper() in ("ENV", "ARG"):
            assert not SECRET_NAME.search(arg), f"{op} {arg}: secrets come at run time, never in the image"
        if op.upper() == "RUN" and "pip" in arg:
            assert "[dev" not in arg and "routers" not in arg
    ignored = (REPO / ".dockerignore").read_text().split()
    assert {".git", ".venv", "results"} <= set(ignored)


# --- droplets -----------------------------------------------------------------------------------


def _units(path: Path) -> dict[str, str]:
    text = path.read_text()
    assert text.startswith("#cloud-config\n"), f"{path.name}: cloud-init needs the #cloud-config header"
    config = yaml.safe_load(text)
    assert "chrony" in config["packages"], "arrival times are anchored to wall clocks: sync them"
    pip = [cmd for cmd in config["runcmd"] if "install" in cmd and str(cmd[0]).endswith("pip")]
    assert pip and any(re.fullmatch(r"loadgen==\S+", str(arg)) for arg in pip[0]), "pin the version"
    for entry in config["write_files"]:
        assert not re.search(r"^\w*(KEY|TOKEN)\w*=", entry["content"], re.M), "no secret in user-data"
    return {
        Path(f["path"]).name: f["content"]
        for f in config["write_files"]
        if f["path"].startswith("/etc/systemd")
    }


def _exec_start(unit: str) -> list[str]:
    (line,) = [ln for ln in unit.splitlines() if ln.startswith("ExecStart=")]
    argv = shlex.split(line.removeprefix("ExecStart="))
    assert argv[0] == "/opt/loadgen/bin/loadgen"
    return ["loadgen", *argv[1:]]


def test_droplet_worker_units_connect_to_the_master():
    units = _units(DROPLET / "worker-cloud-init.yaml")
    flags = parse_flags(_exec_start(units["loadgen-worker@.service"]))
    assert flags == {"--master-host": "${MASTER_IP}", "--master-port": "5557"}
    assert "WantedBy=loadgen-worker.target" in units["loadgen-worker@.service"]
    assert "loadgen-worker.target" in units


def test_droplet_master_unit_binds_every_interface():
    units = _units(DROPLET / "master-cloud-init.yaml")
    flags = parse_flags(_exec_start(units["loadgen-master.service"]))
    assert flags["--bind"] == "0.0.0.0" and flags["--expect-workers"] == "${EXPECT_WORKERS}"
    assert flags["--api-key-env"] and flags["--results"].startswith("/var/lib/loadgen")
