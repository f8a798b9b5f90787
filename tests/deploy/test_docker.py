"""docker/: compose demo, Prometheus config, Grafana provisioning, the agent and engine Dockerfiles.

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
import sys
from pathlib import Path

import pytest
import yaml

from _promutil import ALERTS, DASHBOARDS, ROOT, promtool

DOCKER = ROOT / "docker"
COMPOSE = yaml.safe_load((DOCKER / "compose.yml").read_text())
PROM_CFG = yaml.safe_load((DOCKER / "prometheus.yml").read_text())
DS_PROV = yaml.safe_load((DOCKER / "grafana/provisioning/datasources/prometheus.yml").read_text())
DASH_PROV = yaml.safe_load((DOCKER / "grafana/provisioning/dashboards/graphmon.yml").read_text())
DOCKERFILE = (DOCKER / "Dockerfile").read_text()
ENGINE_DOCKERFILE = (DOCKER / "Dockerfile.engine").read_text()
PORT = 9479  # graphmon's default port (9464 is the OpenTelemetry Prometheus exporter's)


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


def _instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of a Dockerfile, continuation lines joined, comments dropped."""
    joined = re.sub(r"\\\n", " ", "\n".join(l for l in text.splitlines() if not l.lstrip().startswith("#")))
    return [(m.group(1).upper(), m.group(2)) for m in re.finditer(r"^(\w+)\s+(.*)$", joined, re.M)]


@pytest.mark.parametrize("name", ["Dockerfile", "Dockerfile.engine"])
def test_dockerfile_build_args_and_copies(name):
    text = (DOCKER / name).read_text()
    instructions = _instructions(text)
    # The base image is a build arg declared before FROM (so that FROM can use it), documented in the header.
    first_from = [i for i, (op, _) in enumerate(instructions) if op == "FROM"][0]
    base_arg = [a for op, a in instructions[:first_from] if op == "ARG"]
    assert base_arg and instructions[first_from][1] == "${%s}" % base_arg[0].split("=")[0]
    for arg in re.findall(r"^ARG (\w+)", text, re.M):
        assert f"#   {arg}" in text, f"build arg {arg} undocumented"
    ignore = (DOCKER / f"{name}.dockerignore").read_text().split()
    assert "*" in ignore  # the context is the repository root: send nothing (.venv!) by default
    for op, line in instructions:
        if op != "COPY":
            continue
        sources = line.split()[:-1]
        assert any(glob.glob(str(ROOT / s)) for s in sources), f"COPY copies nothing: {line}"
        for s in sources:
            assert "*" in s or (ROOT / s).exists(), f"COPY source missing: {s}"
            assert f"!{s}" in ignore or f"!{s}/**" in ignore, f"{s} is excluded from the build context"
    assert all("OpenTelemetry" in text[max(0, m.start() - 200):m.end() + 200] for m in re.finditer("9464", text))


def test_agent_image_is_graph_free_and_runs_the_agent():
    instructions = _instructions(DOCKERFILE)
    ops = [op for op, _ in instructions]
    assert ("ARG", f"PORT={PORT}") in instructions and ("EXPOSE", "${PORT}") in instructions
    assert ("ENTRYPOINT", '["graphmon"]') in instructions and ("CMD", '["agent"]') in instructions
    assert ("USER", "65534:65534") in instructions and ops.index("USER") > max(i for i, o in enumerate(ops) if o == "RUN")
    # No CUDA, torch or CUPTI in the agent: it only aggregates and serves.
    assert not re.search(r"cupti|torch|nvidia/cuda|\[cupti\]", " ".join(a for op, a in instructions if op in ("RUN", "FROM", "ARG")))
    # graphmon is installed from the checkout into a venv (it is not on PyPI).
    run = " ".join(a for op, a in instructions if op == "RUN")
    assert "python3 -m venv /opt/graphmon" in run and "/opt/graphmon/bin/pip install '.[web]'" in run
    # setup.py (the native CUPTI-buffer decode) is in the build, a compiler too, and the build fails
    # unless the decode is the native one
    copied = " ".join(a for op, a in instructions if op == "COPY")
    assert "setup.py" in copied and "gcc" in run and "grep -Eq '^ +decode: +native$'" in run
    version = subprocess.run([sys.executable, "-m", "graphmon.cli", "--version"], capture_output=True, text=True).stdout
    assert re.search(r"^ +decode: +\S", version, re.M)
    env = " ".join(a for op, a in instructions if op == "ENV")
    assert f"GRAPHMON_PORT=${{PORT}}" in env and "GRAPHMON_HOST=0.0.0.0" in env
    # Its socket path is the one the Kubernetes sidecar example shares with the engine container.
    socket = re.search(r"GRAPHMON_AGENT=(\S+)", env).group(1)
    k8s_gen = (DOCKER / "k8s" / "generate.py").read_text()
    assert f'SOCKET_DIR = "{socket.rsplit("/", 1)[0]}"' in k8s_gen and socket.endswith("/agent.sock")


def test_engine_image_adds_the_hook_and_keeps_the_engine_in_charge():
    instructions = _instructions(ENGINE_DOCKERFILE)
    ops = [op for op, _ in instructions]
    # The engine's own user, entrypoint and command stay in force.
    assert not {"USER", "ENTRYPOINT", "CMD", "EXPOSE"} & set(ops)
    args = dict(a.split("=", 1) for op, a in instructions if op == "ARG")
    assert re.match(r"nvidia/cuda:13\.", args["ENGINE_IMAGE"]), "the stand-in base must be a CUDA 13 stack"
    reqs = args["CUPTI_REQUIREMENTS"].strip('"').split()
    assert "cupti-python==13.4.0" in reqs and "nvidia-cuda-cupti==13.4.92" in reqs and "cuda-bindings>=13" in reqs
    run = " ".join(a for op, a in instructions if op == "RUN")
    assert "pip install --no-deps ${CUPTI_REQUIREMENTS}" in run and "pip install /opt/graphmon-src" in run
    # The supported stack is stated where the image is built.
    for fact in ("580.159.04", "torch 2.11.0+cu130", "CUPTI 13.4.92", "cupti-python 13.4.0", "CUPTI >= 13.1 Update 1"):
        assert fact in ENGINE_DOCKERFILE, fact
    assert not re.search(r"cuda:12|cu12", ENGINE_DOCKERFILE)


def test_default_port_everywhere():
    from graphmon.settings import Settings

    assert Settings().port == PORT
    owned = [*DOCKER.rglob("*"), *DASHBOARDS.glob("*.yml"), ROOT / "docs/deployment.md", ROOT / "docs/dashboards.md"]
    for path in owned:
        if path.is_file() and path.suffix != ".json":
            text = path.read_text()
            for m in re.finditer("9464", text):
                # 9464 may only appear where we say why it is not ours.
                near = text[max(0, m.start() - 200):m.end() + 200]
                assert "OpenTelemetry" in near, f"{path} still uses the old port: {near!r}"


def test_docker_compose_config_when_available():
    docker = shutil.which("docker")
    if not docker or subprocess.run([docker, "compose", "version"], capture_output=True).returncode != 0:
        pytest.skip("docker compose plugin not installed; structural checks above cover compose.yml")
    res = subprocess.run([docker, "compose", "-f", str(DOCKER / "compose.yml"), "config", "-q"], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


def test_compose_demo_answers_the_documented_token_from_the_docker_network():
    """Requests from the host reach the demo through Docker's network (not its loopback), so the
    protected endpoints need the token: the compose secret's file, which the docs' curl lines send."""
    from starlette.testclient import TestClient

    from graphmon.cli import build_parser
    from graphmon.export.exporter import Exporter
    from graphmon.settings import Settings
    from graphmon.sources.replay import ReplaySource
    from helpers import synthetic_trace

    svc = COMPOSE["services"]["graphmon"]
    args = build_parser().parse_args(svc["command"])
    (secret,) = svc["secrets"]
    assert args.token_file == f"/run/secrets/{secret}"  # where compose mounts a secret
    token_path = DOCKER / COMPOSE["secrets"][secret]["file"]
    ex = Exporter(ReplaySource(synthetic_trace()), Settings(host=args.host, port=0, token_file=str(token_path)))
    bridge = TestClient(ex.app, client=("172.18.0.1", 40000))  # Docker's gateway, as the container sees the host
    assert bridge.post("/capture").status_code == 401
    token = token_path.read_text().strip()
    assert bridge.post("/capture", headers={"Authorization": f"Bearer {token}"}).status_code == 200
    assert bridge.get("/metrics").status_code == bridge.get("/status").status_code == 200
    docs = (ROOT / "docs" / "deployment.md").read_text()
    compose_part = docs[docs.index("## Compose demo"):]
    for path in ("/capture", "/trace/", "/baseline"):
        assert re.search(rf'curl [^\n]*-H "Authorization: Bearer \$\(cat docker/demo-token\)" [^\n]*{path}', compose_part), path
