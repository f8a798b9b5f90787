"""Fake cupti-python for child processes: ``from cupti import cupti`` gives a FakeCupti."""
from fake_cupti import FakeCupti

cupti = FakeCupti()

# The collector times replays with CUDA events through libcuda (observer.CudaEvents), which a
# child process on the fake GPU lacks: its events run on the fake GPU's clock instead, so that
# reference phases and untraced bursts time replays here as on a GPU.
import graphmon.sources.cupti.collector as _collector  # noqa: E402
from fake_cupti import FakeEvents  # noqa: E402

_collector.CudaEvents = lambda: FakeEvents(cupti)
