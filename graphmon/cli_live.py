"""The live subcommands (run, record, agent): they start the agent and attach graphmon to a command."""

from __future__ import annotations

import argparse

from graphmon.cli_common import (SERVER_FIELDS, CliError, _add_log_level, _add_server_flags, _settings_from_args,
                                 _setup_logging, _warn_if_public, log)

ATTACH_COMMANDS = ("run", "record")  # their CUPTI flags' help comes from graphmon.settings (pydantic)
# the CuptiSettings fields run/record take as flags (with boundary and close, which have choices)
CUPTI_FLAGS = (("interval_s", float), ("max_traced_share", float), ("max_interval_s", float), ("window_launches", int),
               ("window_duration_ms", float), ("max_drain_ms", float), ("buffer_size_bytes", int), ("max_buffers", int),
               ("max_window_records", int), ("untraced_burst_launches", int), ("untraced_burst_interval_s", float),
               ("untraced_burst_duration_ms", float))


def _attach_settings(args: argparse.Namespace) -> dict:
    """attach() keyword arguments from run/record flags (unset flags keep attach's defaults)."""
    keys = SERVER_FIELDS["agent"] + tuple(name for name, _ in CUPTI_FLAGS) + ("boundary", "close")
    out = {k: getattr(args, k, None) for k in keys}  # `agent` has no sampling flags: its processes bring theirs
    out = {k: v for k, v in out.items() if v is not None}
    if getattr(args, "window_interval_s", None) is not None:
        out["interval_s"] = args.window_interval_s
    return out


def _command_argv(args: argparse.Namespace) -> list[str]:
    argv = list(args.cmd)
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv:
        raise CliError(f"no command given (usage: graphmon {args.command} [options] -- python serve.py ...)")
    return argv


def _cmd_run(args: argparse.Namespace) -> int:
    from graphmon.host.launch import cupti_problem, run_command

    argv = _command_argv(args)
    _setup_logging(args)
    settings = _settings_from_args(args)  # bad flags: one error line, before anything starts

    def warn(agent, port) -> None:  # once the port is bound (a taken port stays one error line)
        _warn_if_public(settings)
        problem = cupti_problem()
        if problem:  # the agent still serves /metrics and /healthz: warn, do not refuse
            log.warning("%s; no kernel timings will be collected", problem)

    return run_command(argv, _attach_settings(args), ready=warn)


def _cmd_record(args: argparse.Namespace) -> int:
    from graphmon.host.launch import cupti_problem, record_command

    if args.windows < 0:
        raise CliError("--windows must be >= 0 (0 = every window until the command exits)")
    argv = _command_argv(args)
    problem = cupti_problem()
    if problem:  # nothing could be recorded: say so before the command starts
        raise CliError(problem)
    _setup_logging(args)
    return record_command(argv, args.output, windows=args.windows, settings=_attach_settings(args))


def _cmd_agent(args: argparse.Namespace) -> int:
    import os

    from graphmon.host.launch import agent_command
    from graphmon.host.link import AGENT_ENV
    from graphmon.sources.remote import PeerPolicy

    _setup_logging(args)
    _warn_if_public(_settings_from_args(args))  # bad flags: one error line, before anything starts
    try:
        peers = PeerPolicy.from_env(uids=",".join(args.allow_uid) if args.allow_uid else None,
                                    gids=",".join(args.allow_gid) if args.allow_gid else None)
    except ValueError as e:
        raise CliError(str(e)) from None
    # the engine's processes read the same variable: one setting names the socket for both sides
    socket_path = args.socket or os.environ.get(AGENT_ENV) or None
    return agent_command(_attach_settings(args), socket_path=socket_path, peers=peers)


def _record_description() -> str:
    from graphmon.host.launch import EXIT_FEWER_WINDOWS, EXIT_NOTHING_RECORDED

    return ("Needs cupti-python in graphmon's environment: without it, record exits 2 before starting the command. "
            "Exit status: the command's own when it failed; else 0 when every attached process sent --windows "
            "windows (at least one with --windows 0), "
            f"exit {EXIT_NOTHING_RECORDED} when nothing was recorded (no process attached, or none sent a window: "
            f"no file written), exit {EXIT_FEWER_WINDOWS} when a process sent fewer windows than --windows (its file "
            "holds those it sent); each case names the processes and their last state.")


def _add_attach_flags(p: argparse.ArgumentParser, cupti_flags: bool = True, server_flags: bool = True) -> None:
    """run/record flags. ``cupti_flags=False``: the server flags and the command only (the parser
    of another subcommand: its CUPTI flags are never parsed, so their help is not built)."""
    _add_server_flags(p, "agent", server_flags)
    _add_log_level(p)
    if not cupti_flags:
        p.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- COMMAND", help="the command to run, after --")
        return
    from graphmon.settings import CuptiSettings

    fields = CuptiSettings.model_fields  # the one source of CUPTI defaults (env GRAPHMON_<FIELD> too)
    for name, typ in CUPTI_FLAGS:
        f = fields[name]
        p.add_argument("--" + name.replace("_", "-"), type=typ,
                       help=f"{f.description} (default {f.default:g}; env GRAPHMON_{name.upper()})" if typ is float
                       else f"{f.description} (default {f.default}; env GRAPHMON_{name.upper()})")
    p.add_argument("--boundary", choices=("launch", "collector"),
                   help=f"{fields['boundary'].description} (default {fields['boundary'].default}; env GRAPHMON_BOUNDARY)")
    p.add_argument("--close", choices=("drain_first", "disable_first"),
                   help=f"{fields['close'].description} (default {fields['close'].default}; env GRAPHMON_CLOSE)")
    p.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- COMMAND", help="the command to run, after --")
