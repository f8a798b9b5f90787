"""Helpers shared by the benches (bench/README.md): paths and command line, the agent and HTTP
load generators, the host-loop measurement of the overhead benches, the HF workload, and the
observer benches' statistics and GPU side. Nothing here is a bench of its own."""
