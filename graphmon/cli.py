"""graphmon command line: analyze | serve | record | run | compare | ab.

Errors the user can fix (bad files, bad flags) print one line and exit 2, with no traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Sequence

EXIT_USAGE = 2


class CliError(Exception):
    """A one-line error for the user (exit code 2)."""


def _cmd_analyze(args: argparse.Namespace) -> int:
    from .analysis import analyze
    from .report import analysis_json, format_table
    from .sources.readers import read_trace

    docs = []
    for path in args.paths:
        trace = read_trace(path, progress=args.progress)
        docs.append(analysis_json(analyze(trace), by=args.by, source=path if len(args.paths) > 1 else None))
    if args.format == "json":
        if len(docs) == 1:
            out = docs[0]
        else:
            # Several files: graphs listed per file (graph ids are process-local, never merged).
            out = {"graphs": [], "invalid_records": {}, "files": docs}
            for d in docs:
                for g in d["graphs"]:
                    out["graphs"].append({**g, "source": d["source"]})
                for k, v in d["invalid_records"].items():
                    out["invalid_records"][k] = out["invalid_records"].get(k, 0) + v
        json.dump(out, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print("\n\n".join(format_table(d, by=args.by) for d in docs))
    return 0


def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    p = argparse.ArgumentParser(prog="graphmon", description="CUDA-graph kernel-gap monitor")
    p.add_argument("--version", action="version", version=f"graphmon {__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    a = sub.add_parser("analyze", help="per-graph, per-stream gap statistics of recorded traces")
    a.add_argument("paths", nargs="+", metavar="PATH", help="graphmon .npz, Kineto .json[.gz], or raw CUPTI .npz")
    a.add_argument("--format", choices=("table", "json"), default="table")
    a.add_argument("--by", choices=("graph", "stream"), default="graph")
    prog = a.add_mutually_exclusive_group()
    prog.add_argument("--progress", dest="progress", action="store_true", default=None, help="always show a progress bar")
    prog.add_argument("--no-progress", dest="progress", action="store_false", help="never show a progress bar")
    a.set_defaults(func=_cmd_analyze)

    return p


def main(argv: Sequence[str] | None = None) -> int:
    from .trace import TraceError

    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (TraceError, CliError) as e:
        print(f"graphmon: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except FileNotFoundError as e:
        print(f"graphmon: error: {e.filename}: no such file", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
