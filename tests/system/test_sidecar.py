"""The agent as shipped: `graphmon agent` run exactly as docker/Dockerfile and the Kubernetes
manifests (docker/k8s/agent-sidecar.yaml, agent-daemonset.yaml) run it, and an engine-side light
collector (fake CUPTI) as the manifest's engine user (root), over the manifest's socket path.

Everything the run uses is read from those files, not restated here: the image's ENTRYPOINT,
CMD, ENV and USER; each container's command/args, env and securityContext (uid, gid,
no_new_privs, capabilities, read-only root); the pods' fsGroup and supplementalGroups; the
socket volume (an in-memory emptyDir made as kubelet makes it with an fsGroup: tmpfs, mode 2777,
that group; or a hostPath folder, made root 0755 as DirectoryOrCreate does) and the init
containers that prepare it. What differs from a cluster, and why:
- the image's venv /opt/graphmon and its python3 are this test's venv and Python, the work dir /;
- a private mount namespace makes every mount read-only but /proc, /sys, /dev and the socket
  volume (a container's read-only root: its own mounts stay writable), and a private network
  namespace keeps the manifest's 0.0.0.0:9479 off the machine's network.

Skips (the test says which in its skip reason):
- not root or no util-linux setpriv/unshare/mount: nothing runs (the point is other uids);
- `unshare --mount --net` refused (a container without CAP_SYS_ADMIN): the users-and-groups part
  still runs, with the socket volume in a temporary folder (the init containers' commands pointed
  there), a writable root, and GRAPHMON_HOST=127.0.0.1 / GRAPHMON_PORT=0; then the test is
  reported skipped, naming the parts it could not check.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

HERE = Path(__file__).resolve()
TESTS = HERE.parents[1]
ROOT = TESTS.parent
K8S = ROOT / "docker" / "k8s"
DOCKERFILE = ROOT / "docker" / "Dockerfile"
IMAGE_VENV = "/opt/graphmon"  # where docker/Dockerfile installs graphmon

ENGINE = """
import signal, time, graphmon, torch
stop = []
signal.signal(signal.SIGTERM, lambda *a: stop.append(1))
lc = graphmon.attach(interval_s=0.1, first_window_s=0.0, window_launches=4, max_traced_share=1.0)
assert type(lc).__name__ == "LightCollector", lc
g = torch.cuda.CUDAGraph()
with torch.cuda.graph(g):
    pass
t0 = time.monotonic()
while not stop and time.monotonic() - t0 < 90:
    g.replay(); time.sleep(0.002)
"""


# ------------------------------------------------------------------ what the shipped files say
def dockerfile_config(text: str) -> dict:
    """ENTRYPOINT, CMD, ENV (ARG defaults substituted) and USER of a one-stage Dockerfile."""
    joined = re.sub(r"\\\n", " ", "\n".join(l for l in text.splitlines() if not l.lstrip().startswith("#")))
    args: dict[str, str] = {}
    cfg: dict = {"env": {}, "entrypoint": [], "cmd": [], "user": "0:0"}

    def sub(v: str) -> str:
        return re.sub(r"\$\{(\w+)\}", lambda m: args.get(m.group(1), cfg["env"].get(m.group(1), m.group(0))), v)

    for op, rest in re.findall(r"^(\w+)\s+(.*)$", joined, re.M):
        op = op.upper()
        if op == "ARG" and "=" in rest:
            k, v = rest.split("=", 1)
            args[k.strip()] = v.strip()
        elif op == "ENV":
            for tok in shlex.split(rest):
                k, v = tok.split("=", 1)
                cfg["env"][k] = sub(v)
        elif op in ("ENTRYPOINT", "CMD"):
            cfg[op.lower()] = json.loads(rest)
        elif op == "USER":
            cfg["user"] = rest.strip()
    return cfg


def manifest_spec(name: str) -> dict:
    """The agent's, its init containers' and the engine's processes as the image and the
    manifest start them."""
    import yaml

    image = dockerfile_config(DOCKERFILE.read_text())
    pods = [d["spec"]["template"]["spec"] for d in yaml.safe_load_all((K8S / name).read_text())
            if d and d["kind"] in ("Deployment", "DaemonSet")]
    where = {c["name"]: (c, pod) for pod in pods for c in pod["containers"]}
    user, _, group = image["user"].partition(":")

    def process(c: dict, pod: dict, default_uid: int, default_gid: int, image_env: dict) -> dict:
        sc, pod_sc = c.get("securityContext") or {}, pod.get("securityContext") or {}
        uid, gid = int(sc.get("runAsUser", default_uid)), int(sc.get("runAsGroup", default_gid))
        if sc.get("runAsNonRoot"):
            assert uid != 0, f"{c['name']}: runAsNonRoot with uid 0 would not start"
        pod_groups = [g for g in [pod_sc.get("fsGroup"), *pod_sc.get("supplementalGroups", [])] if g is not None]
        env = {**image_env, **{e["name"]: _env_value(e) for e in c.get("env", [])}}
        volumes = {v["name"]: v for v in pod["volumes"]}
        # the socket's volume: the mount that holds GRAPHMON_AGENT; Secrets: files the test writes
        (mount,) = [m for m in c["volumeMounts"] if m["mountPath"] == os.path.dirname(env["GRAPHMON_AGENT"])]
        volume = volumes[mount["name"]]
        secrets = [{"path": m["mountPath"], "files": [i["path"] for i in volumes[m["name"]]["secret"]["items"]]}
                   for m in c["volumeMounts"] if "secret" in volumes[m["name"]]]
        assert len(c["volumeMounts"]) == 1 + len(secrets), c["volumeMounts"]
        caps = sc.get("capabilities") or {}
        return {"env": env, "secrets": secrets,
                "uid": uid, "gid": gid, "groups": sorted({gid, *pod_groups}),
                "no_new_privs": sc.get("allowPrivilegeEscalation") is False,
                "drop_caps": "ALL" in caps.get("drop", []), "add_caps": [a.lower() for a in caps.get("add", [])],
                "read_only_root": bool(sc.get("readOnlyRootFilesystem")),
                "mount": mount["mountPath"], "volume": volume, "fs_group": pod_sc.get("fsGroup")}

    agent_c, agent_pod = where["graphmon-agent"]
    agent = process(agent_c, agent_pod, int(user), int(group or user), image["env"])
    # Kubernetes: command replaces ENTRYPOINT, args replace CMD
    agent["argv"] = (agent_c.get("command") or image["entrypoint"]) + (
        agent_c["args"] if "args" in agent_c or "command" in agent_c else image["cmd"])
    init = []
    for c in agent_pod.get("initContainers", []):
        p = process(c, agent_pod, int(user), int(group or user), image["env"])
        p["argv"] = c["command"] + c.get("args", [])
        init.append(p)
    # vllm/vllm-openai sets no USER: its processes run as root unless the manifest says otherwise
    engine = process(*where["engine"], 0, 0, {})
    for p in (agent, engine):
        host = p["volume"].get("hostPath")
        assert not host or host["path"] == p["mount"], "a hostPath is mounted at its own path here"
    return {"manifest": name, "agent": agent, "init": init, "engine": engine}


# The pod the downward API describes here: a Deployment's pod of template hash 5d8f7c9b6
POD_FIELDS = {"metadata.namespace": "serving", "metadata.name": "llm-engine-5d8f7c9b6-x2x9q",
              "metadata.labels['pod-template-hash']": "5d8f7c9b6"}


def _env_value(e: dict) -> str:
    if "value" in e:
        return e["value"]
    return POD_FIELDS[e["valueFrom"]["fieldRef"]["fieldPath"]]  # a field this test does not know: KeyError


# ------------------------------------------------------------------ the test
def _problem() -> str | None:
    if sys.platform != "linux" or os.geteuid() != 0:
        return "needs root on Linux (CI runs as root) to run the agent as uid 65534 and the engine as root"
    missing = [t for t in ("setpriv", "unshare", "mount") if not shutil.which(t)]
    if missing:
        return f"util-linux {', '.join(missing)} not installed"
    return None


def _namespaces_problem() -> str | None:
    r = subprocess.run(["unshare", "--mount", "--net", "true"], capture_output=True, text=True, timeout=30)
    return None if r.returncode == 0 else f"`unshare --mount --net` failed ({r.stderr.strip() or r.returncode})"


@pytest.mark.parametrize("manifest", ["agent-sidecar.yaml", "agent-daemonset.yaml"])
def test_agent_as_shipped_serves_a_root_engine_and_refuses_others(manifest):
    problem = _problem()
    if problem:
        pytest.skip(problem)
    spec = manifest_spec(manifest)
    ns_problem = _namespaces_problem()
    spec["isolated"] = ns_problem is None
    spec["venv_bin"] = str(Path(sys.executable).parent)
    spec["python"] = sys.executable
    cmd = [sys.executable, str(HERE), json.dumps(spec)]
    if spec["isolated"]:
        cmd = ["unshare", "--mount", "--net", "--propagation", "private", *cmd]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    res = json.loads(r.stdout.strip().splitlines()[-1])
    if res.get("skip"):
        pytest.skip(res["skip"])
    agent, engine = spec["agent"], spec["engine"]
    diag = json.dumps(res, indent=1)[-6000:]

    if spec["isolated"]:
        assert res["root_read_only"] and res["socket"] == agent["env"]["GRAPHMON_AGENT"], diag
    # the agent listened where the image and manifest say, as they say, and wrote nothing else
    assert res["agent_uid"] == agent["uid"] and res["agent_no_new_privs"] == agent["no_new_privs"], diag
    # the DaemonSet agent's --state-dir lies in the socket folder (docker/k8s/generate.py STATE_DIR)
    state = "GRAPHMON_STATE_DIR" in spec["agent"]["env"]
    assert res["socket_dir"] == ["agent.sock", *(["state"] if state else [])], diag
    allowed_gid = int(agent["env"]["GRAPHMON_AGENT_ALLOW_GIDS"])
    assert res["socket_stat"] == {"uid": agent["uid"], "gid": allowed_gid, "mode": "0660"}, diag
    # the manifest's engine (root, the pod's fsGroup as a supplementary group) got its windows in
    (proc,) = [p for p in res["status"]["processes"] if p["pid"] == str(res["engine_pid"])]
    assert proc["state"] == "running" and proc["records_total"] > 0, diag
    assert re.search(r'^graphmon_up\{[^}]*rank="[^"]*"[^}]*\} 1\.0$', res["metrics"], re.M), diag
    # the engine's workload identity from the downward API, on its series (issue 35 item 2)
    (up,) = [ln for ln in res["metrics"].splitlines() if ln.startswith("graphmon_up{")]
    for kv in ('namespace="serving"', 'pod="llm-engine-5d8f7c9b6-x2x9q"', 'container="engine"',
               'workload="llm-engine"', 'build="5d8f7c9b6"'):
        assert kv in up, (up, diag)
    assert not [l for l in res["engine_stderr"] if "graphmon link:" in l], diag
    # a root process without the group: the agent refuses it; once at WARNING on both sides,
    # however often it retried; counted; it was told what to set
    assert res["refused_root"]["attempts"] >= 2 and res["status"]["link_rejected"]["uid"] >= 2, diag
    agent_says = [l for l in res["agent_stderr"] if "refused a connection" in l]
    assert len(agent_says) == 1 and "uid 0 gid 0 groups [0]" in agent_says[0], diag
    assert f"group {allowed_gid}" in agent_says[0] and "--allow-uid 0" in agent_says[0], diag
    root_says = [l for l in res["refused_root"]["stderr"] if "graphmon link:" in l]
    assert len(root_says) == 1 and "refused this process" in root_says[0], diag
    assert f"run the process with group {allowed_gid}" in root_says[0], diag
    # a uid outside the group cannot open the 0660 socket; it says so once, with what to set
    other_says = [l for l in res["refused_uid"]["stderr"] if "graphmon link:" in l]
    assert len(other_says) == 1 and "permission denied" in other_says[0] and "--allow-gid" in other_says[0], diag
    # SIGTERM (a pod's stop): exit 0, socket removed
    assert res["agent_exit"] == 0 and res["socket_dir_after"] == (["state"] if state else []), diag
    if state:  # written by the agent as its unprivileged user under a read-only root, at its stop
        assert [f.split(".", 1)[1] for f in res["state_files"]] == ["current.npz"], diag
    assert res["init_exits"] == [0] * len(spec["init"]), diag
    assert agent["secrets"] and res["status"]["config"]["token_set"] and res["trace_with_secret_token"] == 404, diag
    if not spec["isolated"]:
        pytest.skip(f"ran the users-and-groups part only: {ns_problem}, so the read-only root, the manifest's "
                    "socket path and its 0.0.0.0:9479 were not checked")


# ------------------------------------------------------------------ the driver (root, in the namespaces)
class _Proc:
    """A process started through setpriv with its stderr collected by a thread."""

    def __init__(self, argv: list[str], env: dict, uid: int, gid: int, groups: list[int], no_new_privs=False,
                 drop_caps=False) -> None:
        cmd = ["setpriv", f"--reuid={uid}", f"--regid={gid}", f"--groups={','.join(map(str, groups))}"]
        if no_new_privs:
            cmd.append("--no-new-privs")
        if drop_caps:
            cmd += ["--inh-caps=-all", "--bounding-set=-all"]
        self.p = subprocess.Popen([*cmd, "--", *argv], env=env, cwd="/", stdin=subprocess.DEVNULL,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.lines: list[str] = []
        self._t = threading.Thread(target=self._read, daemon=True)
        self._t.start()

    def _read(self) -> None:
        for line in self.p.stderr:
            self.lines.append(line.rstrip("\n"))

    def stop(self, sig=signal.SIGTERM, timeout=20.0) -> int:
        if self.p.poll() is None:
            self.p.send_signal(sig)
        try:
            rc = self.p.wait(timeout)
        except subprocess.TimeoutExpired:
            self.p.kill()
            rc = self.p.wait(10)
        self._t.join(5)
        return rc


def _wait(pred, timeout: float, what: str):
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        v = pred()
        if v:
            return v
        time.sleep(0.1)
    raise RuntimeError(f"timed out waiting for {what}")


def _lo_up() -> None:
    import fcntl
    import socket
    import struct

    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    ifr = struct.pack("16sH", b"lo", 0)
    flags = struct.unpack("16sH", fcntl.ioctl(s, 0x8913, ifr)[:18])[1]  # SIOCGIFFLAGS
    fcntl.ioctl(s, 0x8914, struct.pack("16sH", b"lo", flags | 0x1))  # SIOCSIFFLAGS: IFF_UP
    s.close()


def _make_volume(path: str, volume: dict, fs_group, isolated: bool) -> None:
    """The socket volume as kubelet makes it. emptyDir: mode 0777, with an fsGroup 2777 in that
    group (medium Memory: a tmpfs). hostPath DirectoryOrCreate: a root 0755 folder if none."""
    if "emptyDir" in volume:
        mode = 0o2777 if fs_group is not None else 0o777
        if isolated:
            opts = [f"mode={mode:o}"] + ([f"gid={fs_group}"] if fs_group is not None else [])
            size = volume["emptyDir"].get("sizeLimit")
            if size:
                opts.append("size=" + size.replace("Mi", "m").replace("Gi", "g"))
            assert volume["emptyDir"].get("medium") == "Memory", volume
            subprocess.run(["mount", "-t", "tmpfs", "-o", ",".join(opts), "tmpfs", path], check=True)
        if fs_group is not None:
            os.chown(path, -1, fs_group)
        os.chmod(path, mode)
    elif "hostPath" in volume:
        assert volume["hostPath"].get("type") == "DirectoryOrCreate", volume
        os.chmod(path, 0o755)
        if isolated:  # its own mount, so that it stays writable when the root goes read-only
            subprocess.run(["mount", "--bind", path, path], check=True)
    else:
        raise RuntimeError(f"unsupported volume {volume}")


def _isolate(spec: dict) -> bool:
    """The pod's view: the socket volume at its mount path, everything else read-only."""
    mount = spec["agent"]["mount"]
    _lo_up()
    subprocess.run(["mount", "--make-rprivate", "/"], check=True)
    # the image's /run is part of its read-only root (the node's for a hostPath): a tmpfs here
    # holds the mount point only
    parent = os.path.dirname(mount)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=0755", "tmpfs", parent], check=True)
    os.makedirs(mount)
    _make_volume(mount, spec["agent"]["volume"], spec["agent"]["fs_group"], True)
    for secret in spec["agent"]["secrets"]:  # kubelet's Secret volume: root-owned files, 0644 (its defaultMode)
        assert secret["path"].startswith(parent + "/"), "the test writes Secrets into the tmpfs it mounted"
        _write_secret(secret["path"])
    keep = ("/proc", "/sys", "/dev", mount)
    with open("/proc/self/mountinfo") as fh:
        points = [line.split()[4].encode().decode("unicode_escape") for line in fh]
    for mp in dict.fromkeys(points):
        if not any(mp == k or mp.startswith(k + "/") for k in keep):
            subprocess.run(["mount", "-o", "remount,bind,ro", mp], capture_output=True)
    try:
        with open(os.path.join(parent, "probe"), "w"):
            pass
        return False
    except OSError:
        pass
    try:
        tempfile.mkdtemp()
        return False
    except OSError:
        return True


SECRET_VALUE = "sidecar-test-token"


def _write_secret(folder: str, files=("token",)) -> None:
    os.makedirs(folder, exist_ok=True)
    for name in files:
        path = os.path.join(folder, name)
        with open(path, "w") as fh:
            fh.write(SECRET_VALUE)
        os.chmod(path, 0o644)


def _get(url: str, token: str | None = None) -> bytes:
    if token is not None:
        url = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(url, timeout=5) as r:
        return r.read()


def _driver(spec: dict) -> dict:
    out: dict = {}
    agent_spec, engine_spec = spec["agent"], spec["engine"]
    env = dict(agent_spec["env"])
    env["PATH"] = env.get("PATH", "").replace(IMAGE_VENV + "/bin", spec["venv_bin"]).replace(
        "${PATH}", "/usr/local/bin:/usr/bin:/bin")
    if spec["isolated"]:
        out["root_read_only"] = _isolate(spec)
        sock = env["GRAPHMON_AGENT"]
    else:  # a folder made like the volume; loopback and any free port
        d = tempfile.mkdtemp(prefix="graphmon-sidecar-")
        os.chmod(d, 0o755)
        vol = os.path.join(d, os.path.basename(agent_spec["mount"]))
        os.mkdir(vol)
        _make_volume(vol, agent_spec["volume"], agent_spec["fs_group"], False)
        sock = env["GRAPHMON_AGENT"] = os.path.join(vol, os.path.basename(env["GRAPHMON_AGENT"]))
        if "GRAPHMON_STATE_DIR" in env:  # the state folder in the socket volume, as the manifest puts it
            env["GRAPHMON_STATE_DIR"] = env["GRAPHMON_STATE_DIR"].replace(agent_spec["mount"], vol)
        env["GRAPHMON_HOST"], env["GRAPHMON_PORT"] = "127.0.0.1", "0"
        for secret in agent_spec["secrets"]:  # the Secret's folder beside the volume, the variables pointed there
            here = os.path.join(d, "secret-" + os.path.basename(secret["path"]))
            _write_secret(here, secret["files"])
            for k, v in list(env.items()):
                if v.startswith(secret["path"] + "/"):
                    env[k] = here + v[len(secret["path"]):]
    out["socket"] = sock
    vol = os.path.dirname(sock)

    # the init containers (the DaemonSet's: give the host folder to the socket's group)
    out["init_exits"] = []
    for c in spec["init"]:
        argv = [spec["python"] if a == "python3" else a.replace(c["mount"], vol) for a in c["argv"]]
        caps = ["--inh-caps=-all", "--bounding-set=" + ",".join(["-all", *("+" + a for a in c["add_caps"])])]
        r = subprocess.run(["setpriv", f"--reuid={c['uid']}", f"--regid={c['gid']}",
                            f"--groups={','.join(map(str, c['groups']))}", *(["--no-new-privs"] if c["no_new_privs"] else []),
                            *(caps if c["drop_caps"] else []), "--", *argv], capture_output=True, text=True, cwd="/",
                           env={"PATH": "/usr/local/bin:/usr/bin:/bin"})
        out["init_exits"].append(r.returncode)
        if r.returncode:
            raise RuntimeError(f"init container {argv}: {r.stderr}")

    # the agent, as the image and the manifest start it
    check = subprocess.run(["setpriv", f"--reuid={agent_spec['uid']}", f"--regid={agent_spec['gid']}", "--clear-groups",
                            "--", shutil.which(agent_spec["argv"][0], path=env["PATH"]), "--version"],
                           capture_output=True, text=True, env=env, cwd="/")
    if check.returncode != 0:
        return {"skip": f"uid {agent_spec['uid']} cannot run this test's graphmon ({check.stderr.strip()[-300:]}): "
                        "its Python must be readable by that uid"}
    agent = _Proc(agent_spec["argv"], env, agent_spec["uid"], agent_spec["gid"], agent_spec["groups"],
                  agent_spec["no_new_privs"], agent_spec["drop_caps"])
    procs = [agent]
    try:
        line = _wait(lambda: next((l for l in agent.lines if "/metrics" in l), None) or (agent.p.poll() is not None
                     and RuntimeError("agent exited: " + "\n".join(agent.lines))), 60, "the agent")
        if isinstance(line, Exception):
            raise line
        port = re.search(r"http://[^ ]+:(\d+)/metrics", line).group(1)
        url = f"http://127.0.0.1:{port}"
        _wait(lambda: _get(url + "/healthz"), 30, "/healthz")
        agent_pid = agent.p.pid
        status = open(f"/proc/{agent_pid}/status").read()
        out["agent_uid"] = int(re.search(r"^Uid:\s+(\d+)", status, re.M).group(1))
        out["agent_no_new_privs"] = re.search(r"^NoNewPrivs:\s+(\d)", status, re.M).group(1) == "1"
        st = os.stat(sock)
        out["socket_stat"] = {"uid": st.st_uid, "gid": st.st_gid, "mode": f"{st.st_mode & 0o777:04o}"}
        out["socket_dir"] = sorted(os.listdir(vol))

        base = {"PATH": "/usr/local/bin:/usr/bin:/bin", "GRAPHMON_CUPTI_API": "cupti:cupti",
                "PYTHONPATH": os.pathsep.join([str(ROOT), str(TESTS), str(TESTS / "fake_site")]),
                "PYTHONDONTWRITEBYTECODE": "1"}
        eng_env = {**base, **engine_spec["env"]}
        if not spec["isolated"]:
            eng_env["GRAPHMON_AGENT"] = sock
        engine = _Proc([spec["python"], "-c", ENGINE], eng_env, engine_spec["uid"], engine_spec["gid"], engine_spec["groups"])
        procs.append(engine)
        out["engine_pid"] = engine.p.pid

        def running():
            st = json.loads(_get(url + "/status"))
            ok = any(p["pid"] == str(engine.p.pid) and p["state"] == "running" and p["records_total"] > 0
                     for p in st["processes"])
            return st if ok else None

        _wait(running, 60, "the engine's windows")
        # two processes the agent must not serve, side by side for a few seconds of retries
        root = _Proc([spec["python"], "-c", ENGINE], eng_env, 0, 0, [0])
        other = _Proc([spec["python"], "-c", ENGINE], eng_env, 1000, 1000, [1000])
        procs += [root, other]
        _wait(lambda: json.loads(_get(url + "/status"))["link_rejected"]["uid"] >= 1, 60, "a refusal")
        time.sleep(4.0)  # retries with back-off: 0.1, 0.2, 0.4, 0.8, 1.6 s
        out["refused_root"] = {"attempts": json.loads(_get(url + "/status"))["link_rejected"]["uid"]}
        root.stop()
        other.stop()
        out["refused_root"]["stderr"] = root.lines
        out["refused_uid"] = {"stderr": other.lines}
        out["status"] = json.loads(_get(url + "/status"))
        # the token came from the Secret's file: a protected endpoint takes it (404: no such window)
        try:
            _get(url + "/trace/none", token=SECRET_VALUE)
        except urllib.error.HTTPError as e:
            out["trace_with_secret_token"] = e.code
        out["metrics"] = _get(url + "/metrics").decode()
        engine.stop()
        out["engine_stderr"] = engine.lines
        out["agent_exit"] = agent.stop()
        out["agent_stderr"] = agent.lines
        out["socket_dir_after"] = sorted(os.listdir(vol))
        if "GRAPHMON_STATE_DIR" in env:
            out["state_files"] = sorted(os.listdir(env["GRAPHMON_STATE_DIR"]))
    except Exception as e:
        out["error"] = repr(e)
        out["agent_stderr"] = agent.lines
        raise RuntimeError(json.dumps(out)[-6000:]) from e
    finally:
        for p in procs:
            if p.p.poll() is None:
                p.stop(signal.SIGKILL, 5)
        if not spec["isolated"]:
            shutil.rmtree(os.path.dirname(vol), ignore_errors=True)
    return out


if __name__ == "__main__":
    print(json.dumps(_driver(json.loads(sys.argv[1]))))
