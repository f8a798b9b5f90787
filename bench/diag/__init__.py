"""One-off GPU diagnostics whose answers are recorded in bench/results (kept to re-read their files)."""
