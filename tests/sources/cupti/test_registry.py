"""The exec registry: upload-mode decisions, handle reuse, labels, graph-id resolution."""

import threading

import pytest

from graphmon.sources.cupti.registry import INSTANTIATE_FLAG_UPLOAD, GraphRegistry, exec_handle_of, label_graph


def test_upload_before_first_launch_is_uploaded():
    r = GraphRegistry()
    r.on_instantiate(0x10, flags=0, graph_id=5)
    assert r.pending_first_launch == 1
    r.on_upload(0x10, stream=7)
    assert r.pending_first_launch == 0
    assert r.on_launch(0x10, stream=7) is True
    assert r.on_launch(0x10, stream=7) is False
    g = r.get(0x10)
    assert (g.upload_mode, g.upload_stream, g.upload_stream_is_launch_stream) == ("uploaded", 7, True)
    assert g.key == "cap1"  # the first exec this process instantiated, whatever CUPTI's graph id


def test_launch_without_upload_is_lazy_and_upload_afterwards_changes_nothing():
    r = GraphRegistry()
    r.on_instantiate(0x20, graph_id=6)
    r.on_launch(0x20, stream=3)
    r.on_upload(0x20, stream=9)
    g = r.get(0x20)
    assert g.upload_mode == "lazy"
    assert r.pending_first_launch == 0


def test_instantiate_upload_flag():
    r = GraphRegistry()
    r.on_instantiate(0x30, flags=INSTANTIATE_FLAG_UPLOAD | 1, upload_stream=4, graph_id=7)
    assert r.pending_first_launch == 0
    r.on_launch(0x30, stream=8)
    g = r.get(0x30)
    assert (g.upload_mode, g.upload_stream, g.upload_stream_is_launch_stream) == ("instantiate_upload", 4, False)


def test_exec_created_before_attach_stays_unknown():
    r = GraphRegistry()
    r.on_upload(0x40, stream=1)  # never saw the instantiation
    r.on_launch(0x40, stream=1)
    assert r.get(0x40).upload_mode == "unknown"
    assert r.pending_first_launch == 0


def test_handle_reuse_after_destroy_starts_fresh_and_keeps_retired_info():
    r = GraphRegistry()
    r.on_instantiate(0x50, graph_id=1)
    r.on_launch(0x50, stream=1)
    r.on_destroy(0x50)
    r.on_instantiate(0x50, graph_id=2)
    r.on_upload(0x50, stream=1)
    modes = {g.graph_id: g.upload_mode for g in r.infos()}
    assert modes == {1: "lazy", 2: "uploaded"}


def test_destroy_before_launch_clears_pending():
    r = GraphRegistry()
    r.on_instantiate(0x60, graph_id=1)
    r.on_destroy(0x60)
    assert r.pending_first_launch == 0


def test_labels_before_and_after_seen():
    r = GraphRegistry()
    label_graph(0x70, name="decode_bs8", batch_size=8, registry=r)
    r.on_instantiate(0x70, graph_id=3)
    r.on_instantiate(0x80, graph_id=4)
    label_graph(0x80, name="prefill", registry=r)
    by_id = {g.graph_id: g for g in r.infos()}
    assert (by_id[3].label, by_id[3].batch_size, by_id[3].name) == ("decode_bs8", 8, "decode_bs8")
    assert by_id[4].label == "prefill"


def test_resolve_ids_uses_callable_and_survives_errors():
    calls = []

    def gid(h):
        calls.append(h)
        if h == 0x2:
            raise RuntimeError("destroyed")
        return h * 10

    r = GraphRegistry(graph_exec_id=gid)
    r.on_launch(0x1, stream=0)
    r.on_launch(0x2, stream=0)
    r.resolve_ids()
    assert sorted(calls) == [1, 2]
    assert [g.graph_id for g in r.infos()] == [10]
    assert r.get(0x2).graph_id == -1 and r.get(0x2).key == "exec:0x2"


def test_exec_handle_of_torch_like_and_ints():
    class FakeCUDAGraph:
        def raw_cuda_graph_exec(self):
            return 0xABC

    assert exec_handle_of(FakeCUDAGraph()) == 0xABC
    assert exec_handle_of(17) == 17
    with pytest.raises(TypeError):
        exec_handle_of(object())
    with pytest.raises(ValueError):
        label_graph(0, registry=GraphRegistry())


def test_concurrent_updates_keep_pending_count_consistent():
    r = GraphRegistry()
    n = 2000

    def work(base):
        for i in range(n):
            h = base + i
            r.on_instantiate(h, graph_id=h)
            if i % 2:
                r.on_upload(h, stream=1)
            r.on_launch(h, stream=1)

    ts = [threading.Thread(target=work, args=(k * 10**6 + 1,)) for k in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert r.pending_first_launch == 0
    modes = [g.upload_mode for g in r.infos()]
    assert modes.count("uploaded") == modes.count("lazy") == 2 * n


def test_a_first_launch_waited_for_only_so_long():
    # an exec never launched must not keep the launch callbacks on (pending) forever
    r = GraphRegistry()
    r.on_instantiate(0x10)
    r.on_instantiate(0x20)
    assert r.expire_first_launches(60.0) == 0 and r.pending_first_launch == 2  # not yet
    assert r.expire_first_launches(0.0) == 2 and r.pending_first_launch == 0
    r.on_launch(0x10, 7)  # its first launch may have come while nobody looked: not "lazy"
    assert r.get(0x10).upload_mode == "unknown"
    r.on_destroy(0x20)  # counted once: pending never goes negative
    r.on_upload(0x10, 7)
    assert r.pending_first_launch == 0
    r.on_instantiate(0x30)
    r.on_instantiate(0x40)
    assert r.expire_first_launches(0.0) == 2
    r.on_upload(0x30, 8)  # an upload after the wait still decides "uploaded", counted once
    assert r.get(0x30).upload_mode == "uploaded" and r.pending_first_launch == 0


def test_keys_are_the_instantiation_order_and_survive_a_restart():
    """Two processes of one build capture the same graphs in the same order; CUPTI's graph ids
    and the exec handles differ (other graphs, other allocations), the keys do not."""
    def process(handles, graph_ids, before_attach=()):
        r = GraphRegistry()
        for h in before_attach:  # execs made before attach: first seen at a launch
            r.on_launch(h, stream=1)
        for h, gid in zip(handles, graph_ids):
            r.on_instantiate(h, graph_id=gid)
            r.on_launch(h, stream=1)
        return r

    first = process([0x100, 0x200, 0x300], [2, 5, 8])
    second = process([0x900, 0xA00, 0xB00], [11, 3, 40])
    assert [first.get(h).key for h in (0x100, 0x200, 0x300)] == ["cap1", "cap2", "cap3"]
    assert [second.get(h).key for h in (0x900, 0xA00, 0xB00)] == ["cap1", "cap2", "cap3"]
    # a reused handle is a new exec: the next number
    first.on_destroy(0x100)
    first.on_instantiate(0x100, graph_id=9)
    assert first.get(0x100).key == "cap4"
    assert {g.key for g in first.infos()} == {"cap1", "cap2", "cap3", "cap4"}
    # an exec whose instantiation was not seen keeps CUPTI's (process-local) id, or its handle
    late = process([0x400], [6], before_attach=[0x50])
    late.graph_exec_id = lambda h: 77
    late.resolve_ids()
    assert late.get(0x50).key == "g77" and late.get(0x400).key == "cap1"
    assert GraphRegistry().get(0x1) is None
    r = GraphRegistry()
    r.on_launch(0x60, stream=1)
    assert r.get(0x60).key == "exec:0x60"
