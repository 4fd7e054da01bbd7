"""The shipped deployment files: the Kubernetes install (a kustomize base, a monitoring part and an overlay per
environment, rendered by the real `kubectl kustomize`) valid against the Kubernetes API schemas (offline, with
kubernetes-validate) and the prometheus-operator's CRDs, its gpuledger command lines accepted by the real CLI parser,
the config it mounts loadable, its alerting rules the shipped ones and passing promtool; and the systemd unit's
command line likewise."""
from __future__ import annotations

import configparser
import functools
import os
import shlex
import shutil
import subprocess
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

from gpuledger.analytics.config import load_config
from gpuledger.deploy.cli import build_parser

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"
OVERLAYS = sorted(p.name for p in (DEPLOY / "kubernetes" / "overlays").iterdir() if p.is_dir())
KUBERNETES = "1.30.0"  # an old enough release that every supported cluster has these APIs
OPERATOR_CRDS = Path(__file__).resolve().parent / "data" / "schemas"  # the prometheus-operator's (README there)
OPERATOR_KINDS = {"ServiceMonitor": "monitoring.coreos.com_servicemonitors.yaml",
                  "PrometheusRule": "monitoring.coreos.com_prometheusrules.yaml"}


@functools.cache
def rendered(overlay: str) -> list[dict]:
    """The overlay as `kubectl kustomize` renders it (the machine's kubectl; CI's image has one)."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        if os.environ.get("CI"):
            pytest.fail("CI needs kubectl (kustomize v5) to render deploy/kubernetes/overlays")
        pytest.skip("kubectl is not installed")
    done = subprocess.run([kubectl, "kustomize", str(DEPLOY / "kubernetes" / "overlays" / overlay)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "Warning" not in done.stderr, done.stderr  # no deprecated kustomize field
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def documents(overlay: str = "single-server") -> list[tuple[str, dict]]:
    return [(f"{doc['kind']}/{doc['metadata']['name']}", doc) for doc in rendered(overlay)]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_object_of_every_overlay_is_valid(overlay):
    objects = rendered(overlay)
    kinds = {doc["kind"] for doc in objects}
    assert {"Namespace", "ServiceAccount", "ConfigMap", "Deployment", "DaemonSet", "Service", "ServiceMonitor",
            "PrometheusRule"} <= kinds, kinds
    for doc in objects:
        where = f"{overlay}: {doc['kind']}/{doc['metadata']['name']}"
        if doc["kind"] in OPERATOR_KINDS:
            crd = yaml.safe_load((OPERATOR_CRDS / OPERATOR_KINDS[doc["kind"]]).read_text())
            (version,) = [v for v in crd["spec"]["versions"] if f"{crd['spec']['group']}/{v['name']}" ==
                          doc["apiVersion"]]
            jsonschema.Draft7Validator(version["schema"]["openAPIV3Schema"]).validate(doc)
        else:
            kubernetes_validate.validate(doc, KUBERNETES, strict=True)
        assert doc["metadata"].get("namespace", "gpuledger") == "gpuledger", where
        assert doc["metadata"]["labels"]["app.kubernetes.io/part-of"] == "gpuledger", where
        spec = doc.get("spec", {}).get("template", {}).get("spec")
        if spec:  # every pod: its own service account, no API token mounted, probes on the server's
            assert spec["serviceAccountName"].startswith("gpuledger-") and not spec["automountServiceAccountToken"]
            for container in spec["containers"]:
                args = build_parser().parse_args(container["args"])
                if args.command == "serve":
                    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz", where
                    assert container["livenessProbe"]["httpGet"]["path"] == "/livez", where


def test_the_ducklake_overlay_has_one_writer_and_read_replicas_on_one_catalog():
    deployments = {doc["metadata"]["name"]: doc for doc in rendered("ducklake") if doc["kind"] == "Deployment"}
    serving = {name: build_parser().parse_args(c["args"]) for name, d in deployments.items()
               for c in d["spec"]["template"]["spec"]["containers"] if c["args"][0] == "serve"}
    writer, reader = serving["gpuledger"], serving["gpuledger-read"]
    assert not writer.read_only and reader.read_only and deployments["gpuledger"]["spec"]["replicas"] == 1
    assert writer.db == reader.db == "ducklake:postgres:$(GPULEDGER_LAKE)"  # Kubernetes expands it from the Secret
    assert deployments["gpuledger-read"]["spec"]["replicas"] >= 2


def test_the_prometheus_rule_carries_the_shipped_alert_rules_and_passes_promtool(tmp_path):
    shipped = yaml.safe_load((DEPLOY / "prometheus" / "gpuledger-alerts.yml").read_text())
    for overlay in OVERLAYS:
        (rule,) = [doc for doc in rendered(overlay) if doc["kind"] == "PrometheusRule"]
        assert rule["spec"]["groups"] == shipped["groups"], overlay
    promtool = shutil.which("promtool")
    if promtool is None:
        if os.environ.get("CI"):
            pytest.fail("CI must install Debian's prometheus package (it ships promtool)")
        pytest.skip("promtool (Debian's prometheus package) is not installed")
    (tmp_path / "rules.yml").write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    checked = subprocess.run([promtool, "check", "rules", str(tmp_path / "rules.yml")], capture_output=True,
                             text=True, timeout=60)
    assert checked.returncode == 0 and "SUCCESS" in checked.stdout, checked.stdout + checked.stderr


def test_the_service_monitor_scrapes_the_servers_metrics_port_with_a_token():
    (monitor,) = [doc for doc in rendered("single-server") if doc["kind"] == "ServiceMonitor"]
    (service,) = [doc for doc in rendered("single-server") if doc["kind"] == "Service"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]} and endpoint["path"] == "/metrics"
    assert endpoint["authorization"]["credentials"]["key"] == "token"


def containers(kind: str) -> list[dict]:
    return [c for _, doc in documents() if doc["kind"] == kind for c in doc["spec"]["template"]["spec"]["containers"]]


def test_the_agent_daemonset_names_its_node_from_the_downward_api():
    (daemonset,) = [doc for _, doc in documents() if doc["kind"] == "DaemonSet"]
    (agent,) = daemonset["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e for e in agent["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert "GPULEDGER_TOKEN" not in env  # each node its own agent:<node> token, from the Secret's files
    args = build_parser().parse_args(agent["args"])
    assert (args.command, args.source, args.node) == ("agent", "dcgm", "$(NODE_NAME)")  # Kubernetes expands it
    mounts = {m["mountPath"]: m["name"] for m in agent["volumeMounts"]}
    assert set(mounts) == {str(args.spool), str(args.token_file.parent)}
    volumes = {v["name"]: v for v in daemonset["spec"]["template"]["spec"]["volumes"]}
    assert volumes[mounts[str(args.token_file.parent)]]["secret"]["secretName"] == "gpuledger-agent-tokens"


def test_the_server_and_dashboard_command_lines_parse_and_the_config_loads(tmp_path):
    for container in containers("Deployment"):
        args = build_parser().parse_args(container["args"])
        assert args.command in ("serve", "dashboard")
        if args.command == "serve":
            assert args.host == "0.0.0.0" and args.source == "none"
    (configmap,) = [doc for _, doc in documents() if doc["kind"] == "ConfigMap"]
    (tmp_path / "gpuledger.toml").write_text(configmap["data"]["gpuledger.toml"])
    load_config(tmp_path / "gpuledger.toml")


def test_the_systemd_unit_runs_a_valid_agent_command():
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str
    unit.read(DEPLOY / "systemd" / "gpuledger-agent.service")
    command = shlex.split(unit["Service"]["ExecStart"])
    assert command[0].endswith("/gpuledger")
    args = build_parser().parse_args(command[1:])
    assert (args.command, args.source) == ("agent", "nvml")
    assert unit["Install"]["WantedBy"] == "multi-user.target" and unit["Service"]["Restart"] == "always"
