"""Every Kubernetes overlay renders, validates against the Kubernetes schemas
(strict: unknown fields are errors) and passes checkov with no failed check; the
Dockerfiles pass hadolint and checkov too. Skips live in the manifests themselves,
each with its reason, so this test never needs a skip list of its own.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
OVERLAYS = sorted(p.name for p in (K8S / "overlays").iterdir() if p.is_dir())
DOCKERFILES = [ROOT / "deploy" / "Dockerfile", ROOT / "deploy" / "Dockerfile.gpu"]
#: Custom resources (Prometheus Operator, KEDA) have no schema in kubernetes-validate.
CUSTOM_KINDS = {"ServiceMonitor", "PrometheusRule", "PodMonitor", "ScaledObject",
                "TriggerAuthentication"}
#: The Kubernetes version whose schemas the manifests must satisfy.
K8S_VERSION = "1.30.0"


def tool(name: str) -> str:
    """A tool from this venv, the deploy tools venv (make deploy-tools) or PATH."""
    for candidate in (Path(sys.executable).parent / name, ROOT / ".venv-tools" / "bin" / name):
        if candidate.exists():
            return str(candidate)
    found = shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is missing: run `make deploy-tools` (or make install)")
    return found


def checkov(framework: str, path: Path) -> dict[str, Any]:
    """checkov's report on one file, offline (no guideline download, no upload)."""
    proc = subprocess.run(
        [tool("checkov"), "--quiet", "--compact", "-o", "json", "--skip-download",
         "--framework", framework, "-f", str(path)],
        capture_output=True, text=True, env={**os.environ, "BC_SKIP_MAPPING": "TRUE"})
    try:
        report = json.loads(proc.stdout)
    except json.JSONDecodeError:
        pytest.fail(f"checkov gave no report (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    reports = report if isinstance(report, list) else [report]
    assert len(reports) == 1, reports
    return dict(reports[0])


def failed_checks(report: dict[str, Any]) -> list[tuple[str, str]]:
    return [(c["check_id"], c["resource"]) for c in report["results"]["failed_checks"]]


def render(overlay: str) -> list[dict[str, Any]]:
    out = subprocess.run([tool("kubectl"), "kustomize", str(K8S / "overlays" / overlay)],
                         check=True, capture_output=True, text=True).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


@pytest.fixture(scope="module", params=OVERLAYS)
def rendered(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
             ) -> tuple[str, list[dict[str, Any]], Path]:
    docs = render(request.param)
    path = tmp_path_factory.mktemp(request.param) / "rendered.yaml"
    path.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    return request.param, docs, path


def test_overlays_are_the_expected_ones() -> None:
    assert OVERLAYS == ["canary", "cpu", "gpu", "ingress", "live", "model-volume", "redis"]


def test_objects_validate_against_kubernetes_schemas(
        rendered: tuple[str, list[dict[str, Any]], Path]) -> None:
    _, docs, _ = rendered
    import kubernetes_validate

    for doc in docs:
        if doc["kind"] in CUSTOM_KINDS:
            continue
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_checkov_finds_no_failure(rendered: tuple[str, list[dict[str, Any]], Path]) -> None:
    name, docs, path = rendered
    if name == "canary":  # checked as it runs: beside the main overlay, whose
        # NetworkPolicy, Service and PDB select its pods too
        path = path.with_name("beside-cpu.yaml")
        path.write_text(yaml.safe_dump_all(render("cpu") + docs, sort_keys=False))
    report = checkov("kubernetes", path)
    assert failed_checks(report) == [], name
    assert report["summary"]["resource_count"] >= len(docs)
    assert report["summary"]["passed"] > 50


def test_deployment_contract(rendered: tuple[str, list[dict[str, Any]], Path]) -> None:
    """What the image and the server expect from the pod, in every overlay."""
    name, docs, _ = rendered
    deploy = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"]
                  == ("facefuse-canary" if name == "canary" else "facefuse"))
    spec = deploy["spec"]["template"]["spec"]
    # the canary runs on the main overlay's settings
    settings = next(d for d in (render("cpu") if name == "canary" else docs)
                    if d["kind"] == "ConfigMap"
                    and d["metadata"]["name"] == "facefuse-settings")["data"]
    (container,) = [c for c in spec["containers"] if c["name"] == "facefuse"]
    assert deploy["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    assert "--workers" in container["args"] and container["args"][container["args"].index("--workers") + 1] == "1"
    # The drain fits: preStop + FACEFUSE_SHUTDOWN_GRACE_S < terminationGracePeriodSeconds.
    pre_stop = int(container["lifecycle"]["preStop"]["exec"]["command"][-1])
    assert pre_stop + int(settings["FACEFUSE_SHUTDOWN_GRACE_S"]) < spec["terminationGracePeriodSeconds"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    sc, psc = container["securityContext"], spec["securityContext"]
    assert psc["runAsNonRoot"] and psc["runAsUser"] == 10001  # the image's USER
    assert sc["readOnlyRootFilesystem"] and sc["capabilities"]["drop"] == ["ALL"]
    assert psc["seccompProfile"]["type"] == "RuntimeDefault"
    assert spec["automountServiceAccountToken"] is False
    assert any(m["mountPath"] == "/tmp" for m in container["volumeMounts"])
    tag = container["image"].rsplit(":", 1)[-1]
    assert tag != "latest" and "-" in tag  # version-revision
    hpas = [d for d in docs if d["kind"] == "HorizontalPodAutoscaler"]
    if name == "canary":
        assert hpas == []  # the main's HPA scales the main only
        return
    (hpa,) = hpas
    assert hpa["spec"]["scaleTargetRef"]["name"] == "facefuse"
    assert any(m["type"] == "Pods" and m["pods"]["metric"]["name"] == "facefuse_pipeline_requests"
               for m in hpa["spec"]["metrics"])
    if name == "gpu":
        assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
        assert settings["FACEFUSE_PRECISION"] == "fp16"
    if name == "model-volume":
        assert any(m["mountPath"] == "/models" and m.get("readOnly") for m in container["volumeMounts"])


def test_worker_contract() -> None:
    """The redis overlay runs job workers: one job per pod, scaled by KEDA on the
    queue's Redis list, with time to hand a job back on SIGTERM; the queue has a Redis
    of its own (never evicts, AOF fsynced on every write), the cache's stays LRU."""
    from facefuse.serving.jobs.queue import NAMESPACE, QUEUE
    from facefuse.serving.jobs.worker import SHUTDOWN_MARGIN_S

    docs = render("redis")
    by = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    spec = by[("Deployment", "facefuse-worker")]["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    assert container["command"] == ["facefuse", "worker"]
    # The worker image (PyAV, FFmpeg), with the API's tag; the API image has no PyAV.
    (api,) = by[("Deployment", "facefuse")]["spec"]["template"]["spec"]["containers"]
    assert container["image"] == api["image"].replace("/facefuse:", "/facefuse-worker:")
    settings = by[("ConfigMap", "facefuse-settings")]["data"]
    grace = int(settings["FACEFUSE_SHUTDOWN_GRACE_S"])
    assert grace + SHUTDOWN_MARGIN_S <= spec["terminationGracePeriodSeconds"]
    assert int(settings["FACEFUSE_MAX_BODY_BYTES"]) >= int(settings["FACEFUSE_VIDEO_MAX_BYTES"])

    def env(spec: dict[str, Any], name: str) -> dict[str, str]:
        (c,) = [c for c in spec["containers"] if c["name"] == name]
        return {e["name"]: e["valueFrom"]["secretKeyRef"]["key"] for e in c.get("env", [])
                if "valueFrom" in e}

    api = by[("Deployment", "facefuse")]["spec"]["template"]["spec"]
    assert env(api, "facefuse")["FACEFUSE_JOBS_REDIS_URL"] == "jobs-redis-url"
    assert env(spec, "worker") == {"FACEFUSE_JOBS_REDIS_URL": "jobs-redis-url"}
    # Sized from bench/worker_memory.py: the largest clip admitted (~1.9 GiB PSS) on
    # top of a worker at its soft limit, which restarts above it.
    values = {e["name"]: e.get("value") for e in container["env"]}
    soft_mib = int(values["FACEFUSE_JOBS_SOFT_MEMORY_MB"])
    memory = container["resources"]["limits"]["memory"]
    assert memory == container["resources"]["requests"]["memory"] and memory.endswith("Mi")
    assert soft_mib + 1900 <= int(memory[:-2])
    scaled = by[("ScaledObject", "facefuse-worker")]["spec"]
    assert scaled["scaleTargetRef"]["name"] == "facefuse-worker"
    (trigger,) = scaled["triggers"]
    assert trigger["type"] == "redis" and trigger["metadata"]["listName"] == f"{NAMESPACE}:{QUEUE}"
    assert trigger["metadata"]["address"].startswith("redis-jobs.")
    auth = by[("TriggerAuthentication", trigger["authenticationRef"]["name"])]["spec"]
    assert auth["secretTargetRef"][0]["key"] == "redis-jobs-password"
    cache_conf = by[("ConfigMap", "redis-config")]["data"]["redis.conf"].split("\n")
    assert "maxmemory-policy allkeys-lru" in cache_conf and "appendonly no" in cache_conf
    jobs_conf = by[("ConfigMap", "redis-jobs-config")]["data"]["redis.conf"].split("\n")
    assert {"maxmemory-policy noeviction", "appendonly yes", "appendfsync always"} <= set(
        jobs_conf)
    jobs_redis = by[("StatefulSet", "redis-jobs")]["spec"]
    assert jobs_redis["volumeClaimTemplates"][0]["metadata"]["name"] == "data"
    # Who may talk to whom: API and workers reach the jobs Redis, and it admits them.
    def egress_names(policy: str) -> set[str]:
        rules = by[("NetworkPolicy", policy)]["spec"]["egress"]
        return {p["podSelector"]["matchLabels"]["app.kubernetes.io/name"]
                for r in rules for p in r["to"] if "namespaceSelector" not in p}

    assert "redis-jobs" in egress_names("facefuse")
    assert egress_names("facefuse-worker") == {"redis-jobs"}
    admitted = {p["podSelector"]["matchLabels"].get("app.kubernetes.io/component")
                for p in by[("NetworkPolicy", "redis-jobs")]["spec"]["ingress"][0]["from"]}
    assert {"api", "worker"} <= admitted
    assert container["securityContext"]["readOnlyRootFilesystem"]
    assert any(m["mountPath"] == "/tmp" for m in container["volumeMounts"])


@pytest.mark.parametrize(("component", "rules"), [("monitoring", "facefuse-rules.yml"),
                                                  ("jobs", "facefuse-jobs-rules.yml")])
def test_prometheus_rule_matches_the_rule_file(component: str, rules: str) -> None:
    rule = yaml.safe_load((K8S / "components" / component / "prometheusrule.yaml").read_text())
    plain = yaml.safe_load((ROOT / "deploy" / "prometheus" / rules).read_text())
    assert rule["spec"]["groups"] == plain["groups"]


def test_live_runs_apart_on_the_worker_image_scaled_on_sessions() -> None:
    """The live overlay: the photo API plus a Deployment of its own on the worker image
    (PyAV and aiortc), one uvicorn worker (a session lives in one process), its
    sessions bounded, KEDA on the sessions open, a ClientIP-affine Service, and media
    out to a TURN server only."""
    by = {(d["kind"], d["metadata"]["name"]): d for d in render("live")}
    pod = by[("Deployment", "facefuse-live")]["spec"]["template"]["spec"]
    live = pod["containers"][0]
    assert live["image"].endswith("/facefuse-worker:0.1.0-0000000")
    assert live["command"] == ["facefuse", "serve"] and "--workers" in live["args"]
    assert live["args"][live["args"].index("--workers") + 1] == "1"
    env = {e["name"]: e for e in live["env"]}
    assert env["FACEFUSE_LIVE_MAX_SESSIONS"]["value"] == "2"
    assert env["FACEFUSE_LIVE_ICE_SERVERS"]["valueFrom"]["secretKeyRef"]["key"] == \
        "live-ice-servers"
    trigger = by[("ScaledObject", "facefuse-live")]["spec"]["triggers"][0]
    assert trigger["type"] == "prometheus" and "facefuse_live_sessions" in \
        trigger["metadata"]["query"]
    assert by[("Service", "facefuse-live")]["spec"]["sessionAffinity"] == "ClientIP"
    udp = {(p.get("port"), p.get("endPort")) for r in
           by[("NetworkPolicy", "facefuse-live")]["spec"]["egress"] for p in r["ports"]
           if p["protocol"] == "UDP"}
    assert udp == {(3478, None), (49152, 65535), (53, None)}
    assert ("Deployment", "facefuse") in by  # the photo API beside it


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_dockerfile_lint(dockerfile: Path) -> None:
    proc = subprocess.run([tool("hadolint"), "--no-color", str(dockerfile)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = checkov("dockerfile", dockerfile)
    assert failed_checks(report) == []
    assert report["summary"]["passed"] > 10


def test_gpu_dockerfile_keeps_in_step_with_the_cpu_one() -> None:
    """Same runtime contract as the CPU API image (its shared runtime stage and its
    ``api`` stage, not the worker's): user, ports, entrypoint, healthcheck, stop signal,
    workdir."""
    def contract(path: Path) -> list[str]:
        keep = ("USER", "EXPOSE", "ENTRYPOINT", "CMD", "STOPSIGNAL", "HEALTHCHECK", "WORKDIR")
        stages = re.split(r"^FROM ", path.read_text().replace("\\\n", " "), flags=re.M)
        lines = [ln for st in stages if not st.startswith("runtime AS worker")
                 for ln in st.splitlines()]
        return sorted(" ".join(line.split()) for line in lines if line.startswith(keep))

    cpu, gpu = contract(DOCKERFILES[0]), contract(DOCKERFILES[1])
    assert cpu == gpu and any("facefuse\", \"serve" in line for line in cpu)


def _selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def test_canary_runs_beside_the_main_deployment_on_its_service() -> None:
    """Rendered next to the cpu overlay: a Deployment of its own (name, labels,
    selector), 1 replica of another image, reached through the main Service; nothing
    else, and neither Deployment (nor the HPA) selects the other's pods."""
    main, canary = render("cpu"), render("canary")
    assert [(d["kind"], d["metadata"]["name"]) for d in canary] == [
        ("Deployment", "facefuse-canary")]
    (can,) = canary
    (stable,) = [d for d in main if d["kind"] == "Deployment"]
    can_pods = can["spec"]["template"]["metadata"]["labels"]
    stable_pods = stable["spec"]["template"]["metadata"]["labels"]
    assert can["spec"]["replicas"] == 1 < stable["spec"]["replicas"]
    assert can_pods["track"] == "canary" and stable_pods["track"] == "stable"
    assert _selects(can["spec"]["selector"]["matchLabels"], can_pods)
    assert not _selects(can["spec"]["selector"]["matchLabels"], stable_pods)
    assert not _selects(stable["spec"]["selector"]["matchLabels"], can_pods)
    by_kind = {d["kind"]: d for d in main}
    for kind, path in (("Service", ("spec", "selector")),
                       ("PodDisruptionBudget", ("spec", "selector", "matchLabels")),
                       ("NetworkPolicy", ("spec", "podSelector", "matchLabels"))):
        selector = by_kind[kind]
        for key in path:
            selector = selector[key]
        assert _selects(selector, can_pods) and _selects(selector, stable_pods), kind
    (c_box,) = can["spec"]["template"]["spec"]["containers"]
    (s_box,) = stable["spec"]["template"]["spec"]["containers"]
    assert c_box["image"] != s_box["image"]
    assert c_box["envFrom"] == s_box["envFrom"] and c_box["env"] == s_box["env"]
    assert {k: v for k, v in c_box.items() if k != "image"} == {
        k: v for k, v in s_box.items() if k != "image"}  # the same pod, new image


def test_ingress_takes_its_parameters_and_routes_only_the_public_api() -> None:
    docs = render("ingress")
    text = yaml.safe_dump_all(docs)
    assert "PARAMETER" not in text and "ingress-parameters" not in text
    params = dict(line.split("=", 1) for line in
                  (K8S / "overlays" / "ingress" / "parameters.env").read_text().splitlines()
                  if line and not line.startswith("#"))
    (ing,) = [d for d in docs if d["kind"] == "Ingress"]
    notes = ing["metadata"]["annotations"]
    prefix = "nginx.ingress.kubernetes.io/"
    assert notes[prefix + "proxy-body-size"] == params["body-size"] == "10m"
    for key in ("connect-timeout", "read-timeout", "send-timeout"):
        assert notes[prefix + "proxy-" + key] == params[key]
    # the proxy waits longer than the server's own deadline, which then answers 504
    cpu_settings = next(d for d in docs if d["kind"] == "ConfigMap")["data"]
    assert int(params["read-timeout"]) > int(cpu_settings["FACEFUSE_REQUEST_TIMEOUT_S"])
    (tls,) = ing["spec"]["tls"]
    (rule,) = ing["spec"]["rules"]
    assert tls == {"hosts": [params["host"]], "secretName": params["tls-secret"]}
    assert rule["host"] == params["host"]
    assert ing["spec"]["ingressClassName"] == params["ingress-class"]
    paths = {p["path"] for p in rule["http"]["paths"]}
    assert "/v1/" in paths and "/" in paths
    assert not {"/metrics", "/healthz", "/readyz"} & paths
    services = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Service"}
    for p in rule["http"]["paths"]:
        backend = p["backend"]["service"]
        assert backend["port"]["name"] in {q["name"] for q in
                                           services[backend["name"]]["spec"]["ports"]}
    # the NetworkPolicy admits the ingress-nginx controller's pods
    policy = next(d for d in docs if d["kind"] == "NetworkPolicy")
    sources = [f["namespaceSelector"]["matchLabels"] for f in policy["spec"]["ingress"][0]["from"]]
    assert {"kubernetes.io/metadata.name": "ingress-nginx"} in sources


def test_prometheus_adapter_config_serves_the_hpa_metric() -> None:
    """The Helm values and the plain adapter config carry one rule, for the metric the
    HPA asks for and the server exports."""
    adapter = K8S / "prometheus-adapter"
    values = yaml.safe_load((adapter / "values.yaml").read_text())
    config = yaml.safe_load((adapter / "config.yaml").read_text())
    assert values["rules"]["custom"] == config["rules"]
    assert values["rules"]["default"] is False and set(config) == {"rules"}
    assert values["prometheus"]["url"].startswith("http") and values["prometheus"]["port"]
    (rule,) = config["rules"]
    hpa = yaml.safe_load((K8S / "base" / "hpa.yaml").read_text())
    wanted = {m["pods"]["metric"]["name"] for m in hpa["spec"]["metrics"] if m["type"] == "Pods"}
    assert {rule["name"]["as"]} == wanted
    assert rule["seriesQuery"].startswith(rule["name"]["as"] + "{")
    assert set(rule["resources"]["overrides"]) == {"namespace", "pod"}
    from facefuse.serving.metrics import Metrics

    exported = Metrics().render()[0].decode()
    assert re.search(rf"^# TYPE {rule['name']['as']} gauge$", exported, re.M)
