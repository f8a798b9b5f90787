"""``graphmon ab``: the decode-like A/B of uploaded vs lazy graphs on the GPU, or its report redone
from a raw-data folder (``--from DIR``, no GPU). Bad input raises :class:`AbInputError` (the CLI
prints it as one line, exit 2)."""

from __future__ import annotations

import argparse
import json
import os
import sys


class AbInputError(Exception):
    """A one-line error for the user."""


def run_ab_command(args: argparse.Namespace) -> int:
    """Run the decode-like A/B on the GPU (or redo the report from --from DIR) and write the report."""
    if args.source_dir and not args.out:  # its ab.json/ab.txt/ab.png are often the committed report
        raise AbInputError(f"--from {args.source_dir} needs --out DIR (the report would overwrite the one in "
                           f"{args.source_dir}; give --out {args.source_dir} to do that on purpose)")
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        from graphmon.buildinfo import install_hint

        raise AbInputError(f"graphmon ab needs matplotlib: {install_hint('ab')}") from None
    from graphmon.analysis import ab
    from graphmon.report.ab_files import load_raw, save_raw
    from graphmon.report.jsonsafe import json_safe
    from graphmon.report.plots import plot_ab

    if args.source_dir:
        arms, meta = load_raw(args.source_dir)
        out = args.out
    else:
        from graphmon.gpu.ab_runner import cuda_problem

        problem = cuda_problem()
        if problem:
            raise AbInputError(f"graphmon ab needs {problem} (or --from DIR to redo a report)")
        if args.instances < 2:
            raise AbInputError("--instances must be >= 2 (the step-time CI resamples instances)")
        from graphmon.gpu import ab_runner
        from graphmon.gpu.workloads import decode_like_arms

        factories = decode_like_arms(hidden=args.hidden, layers=args.layers, side_streams=args.side_streams,
                                     batch=args.batch)
        if args.baseline == "lazy":
            factories = {"lazy": factories["lazy"], "uploaded": factories["uploaded"]}
        arms = ab_runner.run_ab(factories, instances=args.instances, rounds=args.rounds,
                                replays_per_block=args.replays, windows=args.windows,
                                window_replays=args.window_replays, seed=args.seed,
                                progress=lambda m: print(f"graphmon ab: {m}", file=sys.stderr, flush=True))
        meta = {"command": "graphmon " + " ".join(sys.argv[1:]),
                "workload": {"hidden": args.hidden, "layers": args.layers, "side_streams": args.side_streams,
                             "batch": args.batch},
                "design": {"instances": args.instances, "rounds": args.rounds, "replays_per_block": args.replays,
                           "windows": args.windows, "window_replays": args.window_replays, "seed": args.seed},
                "gap_source": "torch.profiler (Kineto) windows read by graphmon's Kineto reader",
                "environment": ab_runner.environment()}
        out = args.out or "."
        save_raw(arms, out, meta)
    result = ab.analyze_ab(arms, meta=meta)
    os.makedirs(out, exist_ok=True)
    doc = json_safe(result.as_dict())
    with open(os.path.join(out, "ab.json"), "w") as fh:
        json.dump(doc, fh, indent=2)
    with open(os.path.join(out, "ab.txt"), "w") as fh:
        fh.write(result.format_table() + "\n")
    plot_ab(result, os.path.join(out, "ab.png"))
    if args.format == "json":
        json.dump(doc, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(result.format_table())
    return 0
