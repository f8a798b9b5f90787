"""graphmon command line: analyze | serve | record | run | compare | ab.

Errors the user can fix (bad files, bad flags) print one line and exit 2, with no traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Sequence

from graphmon.cli_common import (EXIT_USAGE, CliError, _add_log_level, _add_server_flags, _settings_from_args,
                                 _setup_logging, _warn_if_public, log)
from graphmon.cli_live import _add_attach_flags, _cmd_agent, _cmd_record, _cmd_run, _record_description

PLOT_MAX_GRAPHS = 12


def _cmd_analyze(args: argparse.Namespace) -> int:
    from graphmon.analysis.heap import reuse_heap_for_batch
    from graphmon.analysis.replays import analyze
    from graphmon.report.summary import analysis_json
    from graphmon.report.tables import format_table
    from graphmon.formats.read import read_trace

    reuse_heap_for_batch()  # a batch process: temporaries reused, not page-faulted in again
    if args.plot and len(args.paths) > 1:
        raise CliError("--plot draws one trace; give one PATH")
    _check_plot_path(args.plot)
    if args.top < 1:
        raise CliError("--top must be >= 1")
    if args.max_graphs < 1:
        raise CliError("--max-graphs must be >= 1")
    if (args.graphs or args.max_graphs != PLOT_MAX_GRAPHS) and not args.plot:
        raise CliError("--graphs and --max-graphs choose what --plot draws: give --plot OUT.png|OUT.html")
    docs = []
    for path in args.paths:
        trace = read_trace(path, progress=args.progress)
        if len(trace) == 0:
            raise CliError(f"{path}: no valid kernel records (invalid: {dict(trace.invalid) or 'none'})")
        docs.append(analysis_json(analyze(trace), by=args.by, source=path if len(args.paths) > 1 else None,
                                  top=args.top))
        if args.plot:
            from graphmon.report.plots_compare import plot_analysis

            graphs = [g.strip() for g in args.graphs.split(",") if g.strip()] if args.graphs else None
            left = plot_analysis(trace, args.plot, title=f"graphmon analyze {path}", graphs=graphs,
                                 max_graphs=args.max_graphs)
            if left:
                shown = ", ".join(left[:20]) + (f" and {len(left) - 20} more" if len(left) > 20 else "")
                print(f"graphmon: --plot left out {len(left)} graph{'s' if len(left) != 1 else ''} (--max-graphs "
                      f"{args.max_graphs}; choose with --graphs NAME,...): {shown}", file=sys.stderr)
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
        # Indented for a person at a terminal; compact into a pipe or file: indent=2 forces json's
        # pure-Python encoder, ~5x slower (bench/analysis/analyze_json.py: seconds with 100k graphs).
        tty = sys.stdout.isatty()
        sys.stdout.write(json.dumps(out, indent=2 if tty else None, separators=None if tty else (",", ":")) + "\n")
    else:
        print("\n\n".join(format_table(d, by=args.by, kernel_width=_kernel_width(args)) for d in docs))
    if args.plot:
        print(f"graphmon: wrote {args.plot}", file=sys.stderr)
    return 0


def _check_plot_path(path: str | None) -> None:
    """Refuse a bad --plot before the work: .png (matplotlib) or .html (plotly)."""
    import os

    if path is None:
        return
    ext = os.path.splitext(path)[1].lower()
    if ext not in (".png", ".html", ".htm"):
        raise CliError(f"--plot writes .png or .html, got {path!r}")
    mod = "matplotlib" if ext == ".png" else "plotly"
    try:
        __import__(mod)
    except ImportError:
        from graphmon.buildinfo import install_hint

        raise CliError(f"--plot {ext} needs {mod}: {install_hint('ab')}") from None


def _cmd_compare(args: argparse.Namespace) -> int:
    """Exit 1 when a regression of a --fail-on kind is found (so it can gate CI), 0 otherwise, 2 on bad input."""
    from graphmon.analysis.compare import Thresholds, compare, untraced_by_graph
    from graphmon.analysis.heap import reuse_heap_for_batch
    from graphmon.formats.read import read_trace_untraced

    reuse_heap_for_batch()

    pairs = []
    for spec in args.pair or ():
        if spec.count("=") != 1 or not all(spec.split("=")):
            raise CliError(f"--pair expects BASE=CUR, got {spec!r}")
        pairs.append(tuple(spec.split("=")))
    th = Thresholds(min_shift_ns=args.min_shift_ns, min_rel=args.min_rel, alpha=args.alpha,
                    min_replays=args.min_replays)
    from graphmon.analysis.deploy import Gate, judge

    gate = Gate(min_added_ns=args.min_added_ns, min_added_rel=args.min_added_rel, net_harm=not args.fail_on_widening)
    _check_plot_path(args.plot)
    if args.top < 1:
        raise CliError("--top must be >= 1")
    base, base_u = read_trace_untraced(args.baseline, progress=False)
    cur, cur_u = read_trace_untraced(args.current, progress=False)
    result = compare(base, cur, pairs=pairs, thresholds=th)
    from graphmon.analysis.boundaries import attribute
    from graphmon.report.boundary_tables import format_attribution

    attr = attribute(base, cur, pairs=pairs, top=args.top, min_shift_ns=th.min_shift_ns, min_rel=th.min_rel,
                     min_replays=th.min_replays)
    # untraced replay durations (graphmon's native files and its Chrome export): they confirm or veto a page; none: said "absent"
    verdict = judge(result, attr, gate, untraced=(untraced_by_graph(base_u, base.graph_names()),
                                                  untraced_by_graph(cur_u, cur.graph_names())))
    if args.format == "json":
        from graphmon.report.jsonsafe import json_safe

        json.dump(json_safe({**result.as_dict(), "boundaries": attr.to_json(), "verdict": verdict.to_json()}),
                  sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(result.format_table() + "\n" + format_attribution(attr, _kernel_width(args)) + "\n"
              + verdict.format_table(args.fail_on))
    if args.plot:
        from graphmon.report.plots_compare import plot_compare

        plot_compare(attr, args.plot, title=f"graphmon compare {args.baseline} -> {args.current}",
                     regressions=result.regressions,
                     boundary_regressions=[(g.graph, g.kind) for g in verdict.regressions() if g.why == "boundaries"])
        print(f"graphmon: wrote {args.plot}", file=sys.stderr)
    return 1 if verdict.regressions(args.fail_on) else 0


def _cmd_ab(args: argparse.Namespace) -> int:
    from graphmon.gpu.ab_command import AbInputError, run_ab_command

    try:
        return run_ab_command(args)
    except AbInputError as e:
        raise CliError(str(e)) from None


def bundled_trace_path() -> str:
    """The real H200 capture shipped with the package (the demo's default)."""
    from importlib.resources import files

    return str(files("graphmon") / "data" / "h200-decode.graphmon.npz")


def _cmd_serve(args: argparse.Namespace) -> int:
    import math
    import signal

    from graphmon.export.exporter import Exporter
    from graphmon.export.limits import bind, make_server

    _setup_logging(args)
    settings = _settings_from_args(args)
    if not (math.isfinite(args.speed) and 0 < args.speed <= 1e6):
        raise CliError(f"--speed must be a number > 0 and <= 1e6 (got {args.speed!r})")
    if args.source == "cupti":
        from graphmon.sources.cupti.collector import CuptiSource

        source = CuptiSource(settings=settings.cupti)
    else:
        from graphmon.formats.read import read_trace
        from graphmon.sources.replay import ReplaySource

        path = args.replay or bundled_trace_path()
        trace = read_trace(path, progress=None)
        source = ReplaySource(trace, interval_s=settings.window_interval_s, speed=args.speed, name=path)
    try:  # bound before anything starts: a busy port is one line, not uvicorn's own error
        sock = bind(settings.host, settings.port)
    except OSError as e:
        raise CliError(f"cannot listen on {settings.host}:{settings.port}: {e.strerror or e}") from None
    _warn_if_public(settings)
    exporter = Exporter(source, settings)
    exporter.start()
    server = make_server(exporter.app, settings)
    scheme = "https" if server.graphmon_web.tls is not None else "http"
    log.info("serving %s metrics on %s://%s:%d/metrics (status: /status, links: /)", source.backend, scheme,
             settings.host, sock.getsockname()[1])
    # uvicorn shuts down gracefully on SIGTERM and then re-raises the signal; with the default
    # action that kills the process before the finally below (no exporter.stop(), pending window
    # lost). A handler of our own turns that re-raise into a normal exit. SIGHUP reloads the
    # token file and web config (it would end the process otherwise).
    def _terminated(signum, frame):
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, _terminated)
    signal.signal(signal.SIGHUP, lambda signum, frame: server.graphmon_web.reload_and_log())
    try:
        server.run(sockets=[sock])
    finally:
        exporter.stop()
    return 0


def _add_wide(p: argparse.ArgumentParser) -> None:
    from graphmon.report.names import KERNEL_WIDTH

    p.add_argument("--wide", action="store_true",
                   help=f"kernel names whole (default: demangled and cut to {KERNEL_WIDTH} characters from the ends "
                        "of their longest template arguments, the function name kept)")


def _kernel_width(args: argparse.Namespace):
    from graphmon.report.names import KERNEL_WIDTH

    return None if getattr(args, "wide", False) else KERNEL_WIDTH


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The whole parser; with ``command`` (the subcommand about to run) the CUPTI flags of run and
    record are built only when it is one of them: their help needs graphmon.settings (pydantic,
    ~130 ms of imports) that analyze and compare never use."""
    p = argparse.ArgumentParser(prog="graphmon", description="CUDA-graph kernel-gap monitor")
    from graphmon.buildinfo import VersionAction

    p.add_argument("--version", action=VersionAction, help="show graphmon's version and build details, then exit")
    # Not required=True: argparse would then answer `graphmon --bogus` with "the following arguments
    # are required: command" instead of naming --bogus; main() asks for the command itself.
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    full = command not in ("analyze", "serve", "agent", "compare", "ab")  # None (every parser) or run/record
    server = command in (None, "serve", "agent", "run", "record")  # Settings-made flags: their help needs pydantic

    a = sub.add_parser("analyze", help="per-graph, per-stream gap statistics of recorded traces")
    a.add_argument("paths", nargs="+", metavar="PATH", help="graphmon .npz, Kineto .json[.gz], raw CUPTI .npz, or Nsight Systems .sqlite export")
    a.add_argument("--format", choices=("table", "json"), default="table",
                   help="json: indented on a terminal, compact on one line into a pipe or file (pipe to `jq .` to read)")
    a.add_argument("--by", choices=("graph", "stream", "boundary"), default="graph",
                   help="boundary: the widest kernel boundaries of each graph")
    a.add_argument("--top", type=int, default=10, help="boundaries listed per graph with --by boundary (default 10)")
    a.add_argument("--plot", metavar="OUT.png|OUT.html", help="draw the gap distributions and a replay timeline")
    a.add_argument("--graphs", metavar="NAME,...", help="--plot: only these graphs (display name, label or key)")
    a.add_argument("--max-graphs", type=int, default=PLOT_MAX_GRAPHS,
                   help=f"--plot: at most this many graphs, the most replayed first; the rest are named on stderr "
                        f"(default {PLOT_MAX_GRAPHS})")
    _add_wide(a)
    prog = a.add_mutually_exclusive_group()
    prog.add_argument("--progress", dest="progress", action="store_true", default=None, help="always show a progress bar")
    prog.add_argument("--no-progress", dest="progress", action="store_false", help="never show a progress bar")
    a.set_defaults(func=_cmd_analyze)

    sv = sub.add_parser("serve", help="run the exporter (replays the bundled H200 trace when no GPU source is chosen)")
    sv.add_argument("--replay", metavar="PATH", help="replay this trace in a loop (default: the bundled H200 trace)")
    sv.add_argument("--source", choices=("replay", "cupti"), default="replay",
                    help="replay a recorded trace (default) or collect live with CUPTI in this process")
    sv.add_argument("--speed", type=float, default=1.0, help="replay speed relative to the recorded pace")
    _add_server_flags(sv, "serve", server)
    _add_log_level(sv)
    sv.set_defaults(func=_cmd_serve)

    rn = sub.add_parser("run", help="run a command with graphmon attached to its Python processes (GPU host)",
                        description="Without cupti-python, run warns and still serves health metrics "
                        "(record refuses with exit 2: it could record nothing).")
    _add_attach_flags(rn, full or command == "run", server)
    rn.set_defaults(func=_cmd_run)

    ag = sub.add_parser("agent", help="run the graphmon agent alone (sidecar/DaemonSet): processes attach via GRAPHMON_AGENT")
    _add_server_flags(ag, "agent", server)
    _add_log_level(ag)
    ag.add_argument("--socket", metavar="PATH", help="Unix socket the processes connect to (env GRAPHMON_AGENT; "
                    "default: a private temporary directory). Its directory must exist: a volume shared with the engine")
    ag.add_argument("--allow-uid", action="append", metavar="UID[,UID]",
                    help="also accept processes of these uids (repeatable; env GRAPHMON_AGENT_ALLOW_UIDS; "
                    "the agent's own uid always)")
    ag.add_argument("--allow-gid", action="append", metavar="GID[,GID]",
                    help="also accept processes with one of these groups, primary or supplementary (repeatable; env "
                    "GRAPHMON_AGENT_ALLOW_GIDS); the socket is then 0660 and owned by the first, e.g. the pod's fsGroup")
    ag.set_defaults(func=_cmd_agent, interval_s=None, max_traced_share=None, max_interval_s=None, window_launches=None,
                    window_duration_ms=None,
                    window_interval_s=None, max_drain_ms=None, close=None)
    rc = sub.add_parser("record", help="run a command with graphmon attached and save its windows to a trace file",
                        description=_record_description() if full else None)
    rc.add_argument("-o", "--output", required=True, help="graphmon native trace file to write (.graphmon.npz)")
    rc.add_argument("--windows", type=int, default=1, help="windows to record, then stop sampling (0 = until exit)")
    _add_attach_flags(rc, full or command == "record", server)
    rc.set_defaults(func=_cmd_record)

    cp = sub.add_parser("compare", help="flag gap regressions between two traces: per stream and per boundary, "
                                        "paging only when the replay got slower as a whole "
                                        "(exit 1 on a regression of a --fail-on kind)")
    cp.add_argument("baseline", metavar="BASELINE", help="trace file (any format graphmon reads)")
    cp.add_argument("current", metavar="CURRENT", help="trace file (any format graphmon reads)")
    cp.add_argument("--format", choices=("table", "json"), default="table")
    cp.add_argument("--pair", action="append", metavar="BASE=CUR",
                    help="match these graphs explicitly (display name, label or key); repeatable")
    cp.add_argument("--min-shift-ns", type=float, default=128.0, help="smallest gap shift that counts (default 128 = 4 ticks)")
    cp.add_argument("--min-rel", type=float, default=0.20, help="smallest relative gap shift that counts (default 0.20)")
    cp.add_argument("--alpha", type=float, default=0.01, help="significance level after Bonferroni (default 0.01)")
    cp.add_argument("--min-replays", type=int, default=5, help="replays needed per side to test a stream (default 5)")
    cp.add_argument("--top", type=int, default=5, help="boundaries listed per graph, by median shift (default 5)")
    cp.add_argument("--fail-on", choices=("uniform", "concentrated", "any"), default="any",
                    help="exit 1 on this kind of regressed graph (its boundary verdict): uniform (the whole graph "
                         "widened), concentrated (a few boundaries; or mixed), any (default; also kind untraced: the "
                         "untraced replay time alone rose >= 1%%, where both files carry it)")
    cp.add_argument("--min-added-ns", type=float, default=1000.0,
                    help="a boundary verdict regresses when its widened boundaries add at least this much gap per "
                         "replay (default 1000 ns) ...")
    cp.add_argument("--min-added-rel", type=float, default=0.02,
                    help="... and at least this share of the baseline's median idle time per replay (default 0.02)")
    cp.add_argument("--fail-on-widening", action="store_true",
                    help="exit 1 on any widening that passes the gate, even when the replay as a whole did not get "
                         "slower or its untraced replay time did not rise (default: a widening is a regression only "
                         "when the median idle time or span per replay rose by --min-added-ns with a bootstrap "
                         "interval above 0 and, where both files carry untraced replay times, those rose too)")
    cp.add_argument("--plot", metavar="OUT.png|OUT.html",
                    help="draw per-stream gap distributions before/after and the per-boundary shift")
    _add_wide(cp)
    cp.set_defaults(func=_cmd_compare)

    abp = sub.add_parser("ab", help="A/B of graph variants on the GPU: uploaded vs lazy decode-like graphs")
    abp.add_argument("--out", metavar="DIR", help="write ab.json, ab.txt, ab.png and the raw data here (default .; required with --from)")
    abp.add_argument("--from", dest="source_dir", metavar="DIR", help="redo the report from a raw-data folder (no GPU; needs --out)")
    abp.add_argument("--format", choices=("table", "json"), default="table")
    abp.add_argument("--baseline", choices=("uploaded", "lazy"), default="lazy", help="arm the other is compared to")
    abp.add_argument("--instances", type=int, default=8, help="graph instances captured per arm (default 8)")
    abp.add_argument("--rounds", type=int, default=12, help="interleaved rounds (default 12)")
    abp.add_argument("--replays", type=int, default=20, help="event-timed replays per instance per round (default 20)")
    abp.add_argument("--windows", type=int, default=3, help="torch.profiler windows (default 3)")
    abp.add_argument("--window-replays", type=int, default=3, help="replays per instance per window (default 3)")
    abp.add_argument("--hidden", type=int, default=1024)
    abp.add_argument("--layers", type=int, default=48)
    abp.add_argument("--side-streams", type=int, default=3)
    abp.add_argument("--batch", type=int, default=1)
    abp.add_argument("--seed", type=int, default=0)
    abp.set_defaults(func=_cmd_ab)

    return p


def _command_of(argv: Sequence[str]) -> str | None:
    """The subcommand in ``argv`` (the first word that is not an option), or None."""
    return next((a for a in argv if not a.startswith("-")), None)


def _user_errors() -> tuple:
    """Exceptions that are the user's to fix: one line, exit 2. AgentStartError only once
    graphmon.host.launch was imported (nothing else raises it)."""
    from graphmon.model.trace import TraceError

    launch = sys.modules.get("graphmon.host.launch")
    return (TraceError, CliError) + ((launch.AgentStartError,) if launch is not None else ())


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(_command_of(argv))
    args = parser.parse_args(argv)
    if args.command is None:
        parser.error("a command is required: " + ", ".join(parser._subparsers._group_actions[0].choices))
    try:
        return int(args.func(args) or 0)
    except Exception as e:
        if not isinstance(e, _user_errors()):
            if isinstance(e, FileNotFoundError):
                print(f"graphmon: error: {e.filename}: no such file", file=sys.stderr)
                return EXIT_USAGE
            if isinstance(e, BrokenPipeError):
                return 0
            raise
        print(f"graphmon: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
