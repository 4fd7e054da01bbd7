"""The shipped deployment files: Kubernetes manifests valid against the Kubernetes API schemas (offline, with
kubernetes-validate), their gpuledger command lines accepted by the real CLI parser, the config they mount loadable,
and the systemd unit's command line likewise."""
from __future__ import annotations

import configparser
import shlex
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from gpuledger.analytics.config import load_config
from gpuledger.deploy.cli import build_parser

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"
MANIFESTS = sorted((DEPLOY / "kubernetes").glob("*.yaml"))
KUBERNETES = "1.30.0"  # an old enough release that every supported cluster has these APIs


def documents() -> list[tuple[str, dict]]:
    return [(f"{path.name}:{doc['kind']}/{doc['metadata']['name']}", doc)
            for path in MANIFESTS for doc in yaml.safe_load_all(path.read_text()) if doc]


@pytest.mark.parametrize("name,doc", documents(), ids=[n for n, _ in documents()])
def test_every_manifest_is_valid_for_kubernetes(name, doc):
    kubernetes_validate.validate(doc, KUBERNETES, strict=True)


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
