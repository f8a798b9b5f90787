"""graphmon.host.workload: the engine's workload identity from the downward API's variables."""

from graphmon.host.workload import workload_identity, workload_of


def test_a_deployments_pod():
    env = {"GRAPHMON_POD_NAMESPACE": "serving", "GRAPHMON_POD_NAME": "vllm-7d9f8b6c4-x2x9q",
           "GRAPHMON_CONTAINER_NAME": "engine", "GRAPHMON_POD_TEMPLATE_HASH": "7d9f8b6c4"}
    assert workload_identity(env) == {"namespace": "serving", "pod": "vllm-7d9f8b6c4-x2x9q", "container": "engine",
                                      "workload": "vllm", "build": "7d9f8b6c4"}


def test_the_users_build_and_workload_win():
    env = {"GRAPHMON_POD_NAME": "vllm-7d9f8b6c4-x2x9q", "GRAPHMON_POD_TEMPLATE_HASH": "7d9f8b6c4",
           "GRAPHMON_BUILD": " v0.9.1-cu130 ", "GRAPHMON_WORKLOAD": "llama-8b"}
    got = workload_identity(env)
    assert got["build"] == "v0.9.1-cu130" and got["workload"] == "llama-8b"


def test_outside_kubernetes_everything_is_empty():
    assert set(workload_identity({}).values()) == {""}


def test_workload_of():
    assert workload_of("vllm-7d9f8b6c4-x2x9q", "7d9f8b6c4") == "vllm"
    assert workload_of("my-svc-abc-7d9f8b6c4-x2x9q", "7d9f8b6c4") == "my-svc-abc"
    assert workload_of("engine-0", "") == "engine-0"  # a StatefulSet or a bare pod: its own name
    assert workload_of("vllm-other-x2x9q", "7d9f8b6c4") == "vllm-other-x2x9q"


def test_the_hello_carries_it(monkeypatch):
    from graphmon.host.link import identity
    from graphmon.host.workload import PROCESS_START_S

    monkeypatch.setenv("GRAPHMON_POD_NAME", "vllm-7d9f8b6c4-x2x9q")
    monkeypatch.setenv("GRAPHMON_POD_TEMPLATE_HASH", "7d9f8b6c4")
    ident = identity()
    assert ident["workload"] == "vllm" and ident["build"] == "7d9f8b6c4" and ident["pod"] == "vllm-7d9f8b6c4-x2x9q"
    assert ident["process_start_s"] == PROCESS_START_S and float(PROCESS_START_S) > 1.7e9
