"""docker/: compose demo, Prometheus config, Grafana provisioning, Dockerfile and PodMonitor.

No Docker engine runs in CI, so these are structural checks: every file parses, every path the
compose file mounts or builds from exists, the wiring between services agrees (ports, service
names, mount targets vs provisioning paths), the graphmon command line is one graphmon accepts,
and promtool accepts the Prometheus config with the real alert rules beside it.
`docker compose config` runs too where the compose plugin is installed.
"""

from __future__ import annotations

import glob
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from _promutil import ALERTS, DASHBOARDS, ROOT, promtool

DOCKER = ROOT / "docker"
COMPOSE = yaml.safe_load((DOCKER / "compose.yml").read_text())
PROM_CFG = yaml.safe_load((DOCKER / "prometheus.yml").read_text())
DS_PROV = yaml.safe_load((DOCKER / "grafana/provisioning/datasources/prometheus.yml").read_text())
DASH_PROV = yaml.safe_load((DOCKER / "grafana/provisioning/dashboards/graphmon.yml").read_text())
PODMON_TEXT = (DOCKER / "k8s/podmonitor.yaml").read_text()
DOCKERFILE = (DOCKER / "Dockerfile").read_text()


def _binds(service: str) -> dict[str, Path]:
    """container path -> host path of a service's bind mounts (named volumes skipped)."""
    out = {}
    for vol in COMPOSE["services"][service].get("volumes", []):
        src, dst = vol.split(":")[:2]
        if src.startswith((".", "/")):
            out[dst] = (DOCKER / src).resolve()
    return out


def test_compose_services_and_paths_exist():
    services = COMPOSE["services"]
    assert set(services) == {"graphmon", "prometheus", "grafana"}
    build = services["graphmon"]["build"]
    context = (DOCKER / build["context"]).resolve()
    assert context == ROOT and (context / build["dockerfile"]).is_file()
    assert "BASE_IMAGE" in build["args"]
    for name, svc in services.items():
        for host in _binds(name).values():
            assert host.exists(), f"{name} mounts missing {host}"
        for port in svc.get("ports", []):
            # Demo ports stay on loopback: the exporter and Grafana are not for the network.
            assert port.startswith("127.0.0.1:"), f"{name} publishes {port} beyond loopback"
        for vol in svc.get("volumes", []):
            src = vol.split(":")[0]
            if not src.startswith((".", "/")):
                assert src in COMPOSE.get("volumes", {}), f"{name}: undeclared volume {src}"
        for dep in svc.get("depends_on", []):
            assert dep in services


def test_compose_graphmon_command_is_accepted_by_graphmon():
    from graphmon.cli import build_parser

    cmd = COMPOSE["services"]["graphmon"]["command"]
    args = build_parser().parse_args(cmd)
    assert args.command == "serve" and args.host == "0.0.0.0"
    published = COMPOSE["services"]["graphmon"]["ports"][0].rsplit(":", 1)[1]
    assert str(args.port) == published


def test_prometheus_scrapes_graphmon_and_loads_the_alerts():
    bind = _binds("prometheus")
    config_dir = Path("/etc/prometheus")
    assert bind[str(config_dir / "prometheus.yml")] == DOCKER / "prometheus.yml"
    for rule_file in PROM_CFG["rule_files"]:
        assert bind[str(config_dir / rule_file)] == ALERTS
    (job,) = [j for j in PROM_CFG["scrape_configs"] if j["job_name"] == "graphmon"]
    (target,) = [t for sc in job["static_configs"] for t in sc["targets"]]
    host, port = target.split(":")
    assert host == "graphmon"  # the compose service name
    graphmon_port = COMPOSE["services"]["graphmon"]["command"]
    assert graphmon_port[graphmon_port.index("--port") + 1] == port
    # The alert rule for scrape failures matches this job's name.
    assert re.fullmatch(".*graphmon.*", job["job_name"])


def test_promtool_check_config(tmp_path):
    """promtool checks the config and the rule files it names, laid out as in the container."""
    shutil.copy(DOCKER / "prometheus.yml", tmp_path / "prometheus.yml")
    for rule_file in PROM_CFG["rule_files"]:
        shutil.copy(ALERTS, tmp_path / rule_file)
    res = promtool("check", "config", str(tmp_path / "prometheus.yml"))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "SUCCESS" in res.stdout + res.stderr
    # It would notice a broken config.
    (tmp_path / "prometheus.yml").write_text("global:\n  scrape_interval: fast\n")
    assert promtool("check", "config", str(tmp_path / "prometheus.yml")).returncode != 0


def test_grafana_provisioning_matches_mounts_and_dashboards():
    binds = _binds("grafana")
    assert binds["/etc/grafana/provisioning"] == DOCKER / "grafana/provisioning"
    (ds,) = DS_PROV["datasources"]
    assert ds["type"] == "prometheus" and ds["isDefault"]
    assert ds["url"] == "http://prometheus:9090"  # compose service name, Prometheus's port
    assert ds["jsonData"]["timeInterval"] == PROM_CFG["global"]["scrape_interval"]
    (provider,) = DASH_PROV["providers"]
    assert provider["type"] == "file"
    path = provider["options"]["path"]
    assert binds[path] == DASHBOARDS
    assert sorted(DASHBOARDS.glob("*.json")), "no dashboards to provision"
    home = COMPOSE["services"]["grafana"]["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home.startswith(path + "/") and (DASHBOARDS / home[len(path) + 1:]).is_file()


def test_dockerfile_build_args_and_copies():
    # BASE_IMAGE declared before FROM so that FROM can use it; documented in the header.
    first_from = DOCKERFILE.index("\nFROM ")
    assert re.search(r"^ARG BASE_IMAGE=\S+", DOCKERFILE[:first_from], re.M)
    assert "FROM ${BASE_IMAGE}" in DOCKERFILE
    for arg in re.findall(r"^ARG (\w+)", DOCKERFILE, re.M):
        assert f"#   {arg}" in DOCKERFILE, f"build arg {arg} undocumented"
    ignore = (DOCKER / "Dockerfile.dockerignore").read_text().split()
    assert "*" in ignore  # the context is the repository root: send nothing (.venv!) by default
    for line in re.findall(r"^COPY (.+)$", DOCKERFILE, re.M):
        sources = line.split()[:-1]
        assert any(glob.glob(str(ROOT / s)) for s in sources), f"COPY copies nothing: {line}"
        for s in sources:
            assert "*" in s or (ROOT / s).exists(), f"COPY source missing: {s}"
            assert f"!{s}" in ignore or f"!{s}/**" in ignore, f"{s} is excluded from the build context"
    assert "EXPOSE ${PORT}" in DOCKERFILE and re.search(r"^ARG PORT=9464$", DOCKERFILE, re.M)


def test_podmonitor_one_endpoint_per_local_rank():
    from graphmon.settings import Settings

    doc = yaml.safe_load(PODMON_TEXT)
    assert doc["apiVersion"] == "monitoring.coreos.com/v1" and doc["kind"] == "PodMonitor"
    endpoints = doc["spec"]["podMetricsEndpoints"]
    assert [e["port"] for e in endpoints] == [f"graphmon-{r}" for r in range(len(endpoints))]
    for e in endpoints:
        assert e["path"] == "/metrics" and len(e["port"]) <= 15  # Kubernetes port-name limit
        assert {"targetLabel": "job", "replacement": "graphmon"} in e["relabelings"]
    # The container ports the comment tells users to declare: base port + local rank.
    documented = re.findall(r"name: graphmon-(\d+), containerPort: (\d+)", PODMON_TEXT)
    assert documented and all(int(port) == Settings().port + int(rank) for rank, port in documented)
    selector = doc["spec"]["selector"]["matchLabels"]
    assert all(f"{k}: \"{v}\"" in PODMON_TEXT for k, v in selector.items())


def test_docker_compose_config_when_available():
    docker = shutil.which("docker")
    if not docker or subprocess.run([docker, "compose", "version"], capture_output=True).returncode != 0:
        pytest.skip("docker compose plugin not installed; structural checks above cover compose.yml")
    res = subprocess.run([docker, "compose", "-f", str(DOCKER / "compose.yml"), "config", "-q"], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
