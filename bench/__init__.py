"""graphmon's benchmarks: one folder per question, shared helpers in bench/common (bench/README.md).
Not part of the graphmon package: graphmon never imports bench."""
