"""What every graphmon subcommand shares: the one-line user error, server and log flags, settings."""

from __future__ import annotations

import argparse
import sys

EXIT_USAGE = 2
LOG_LEVELS = ("debug", "info", "warning", "error")


class CliError(Exception):
    """A one-line error for the user (exit code 2)."""


def _settings_from_args(args: argparse.Namespace):
    from pydantic import ValidationError

    from graphmon.settings import Settings

    over = {k: v for k, v in {
        "host": args.host, "port": args.port, "token": args.token,
        "window_interval_s": getattr(args, "window_interval_s", None), "max_graphs": args.max_graphs, "max_streams": args.max_streams,
        "cardinality": getattr(args, "cardinality", None), "stale_after_s": getattr(args, "stale_after_s", None),
        "detail_graphs": getattr(args, "detail_graphs", None),
    }.items() if v is not None}
    try:
        return Settings(**over)
    except ValidationError as e:
        first = e.errors()[0]
        raise CliError(f"bad setting {'.'.join(map(str, first['loc']))}: {first['msg']}") from None


def _warn_if_public(settings) -> None:
    if settings.is_public and settings.token is None:
        print("graphmon: warning: listening on a non-loopback address without GRAPHMON_TOKEN; "
              "POST /capture and GET /trace are refused until a token is set", file=sys.stderr)


def _add_server_flags(p: argparse.ArgumentParser, replay: bool = True) -> None:
    p.add_argument("--host", help="bind address (default 127.0.0.1; env GRAPHMON_HOST)")
    p.add_argument("--port", type=int, help="port (default 9479; env GRAPHMON_PORT)")
    p.add_argument("--token", help="bearer token for POST /capture (env GRAPHMON_TOKEN)")
    p.add_argument("--cardinality", choices=("low", "standard", "full"),
                   help="series per rank (default standard: per-graph series for the detail graphs only; full: "
                        "every graph, every bucket; low: no histograms; env GRAPHMON_CARDINALITY)")
    p.add_argument("--detail-graphs", type=int,
                   help="graphs per rank with series of their own at standard and low: the ones the GPU "
                        "spends most time in (default 2; env GRAPHMON_DETAIL_GRAPHS)")
    if replay:
        p.add_argument("--stale-after-s", type=float,
                       help="drop series of graphs not sampled this long (default 600; env GRAPHMON_STALE_AFTER_S)")
        p.add_argument("--window-interval-s", type=float,
                       help="seconds between replayed windows (env GRAPHMON_WINDOW_INTERVAL_S)")
    p.add_argument("--max-graphs", type=int, help="graphs per device before folding into 'other' (default 64)")
    p.add_argument("--max-streams", type=int, help="streams per graph before folding into 'other' (default 16)")


def _add_log_level(p: argparse.ArgumentParser) -> None:
    p.add_argument("--log-level", choices=LOG_LEVELS, type=str.lower,
                   help="graphmon's log level on stderr (default info; env GRAPHMON_LOG_LEVEL)")


def _setup_logging(args: argparse.Namespace) -> None:
    import logging
    import os

    level = (getattr(args, "log_level", None) or os.environ.get("GRAPHMON_LOG_LEVEL") or "info").lower()
    if level not in LOG_LEVELS:
        raise CliError(f"GRAPHMON_LOG_LEVEL must be one of {', '.join(LOG_LEVELS)} (got {level!r})")
    logging.basicConfig(level=getattr(logging, level.upper()), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger().setLevel(getattr(logging, level.upper()))
