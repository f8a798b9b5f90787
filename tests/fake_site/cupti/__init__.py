"""Fake cupti-python for child processes: ``from cupti import cupti`` gives a FakeCupti."""
from fake_cupti import FakeCupti

cupti = FakeCupti()
