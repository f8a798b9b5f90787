"""What every graphmon subcommand shares: the one-line user error, server and log flags, settings.

The server flags are made from graphmon.settings.Settings (its fields, types, defaults and
descriptions): every setting of ``serve``, ``agent``, ``run`` and ``record`` is a flag, named in
``--help`` with its GRAPHMON_* variable, and a flag and its variable can never disagree.
"""

from __future__ import annotations

import argparse
import logging
import os

from graphmon.logs import LOG_FORMATS, LOG_LEVELS

EXIT_USAGE = 2
log = logging.getLogger("graphmon")

# Settings fields that are flags, per kind of command (rank and the nested CUPTI settings are not:
# the rank comes from the launcher, CUPTI knobs are run/record's own flags).
_HTTP_FIELDS = ("host", "port", "token", "token_file", "web_config_file", "protect_status", "max_graphs",
                "max_streams", "max_devices", "max_label_length", "stale_after_s", "cardinality", "trace_store_count",
                "trace_store_bytes", "max_capture_replays", "max_capture_ms", "max_connections", "header_timeout_s",
                "keep_alive_timeout_s", "max_trace_downloads", "trace_cache_bytes", "detail_graphs")
SERVER_FIELDS = {
    "serve": _HTTP_FIELDS + ("window_interval_s", "replays_per_window"),
    "agent": _HTTP_FIELDS + ("expect_processes", "state_dir"),  # agent, run and record
}
# Flags named as other exporters name them (node_exporter's --web.config.file), besides graphmon's own spelling.
FLAG_NAMES = {"web_config_file": ("--web.config.file", "--web-config-file")}


class CliError(Exception):
    """A one-line error for the user (exit code 2)."""


def _settings_from_args(args: argparse.Namespace):
    from pydantic import ValidationError

    from graphmon.settings import Settings

    over = {k: v for k in Settings.model_fields if (v := getattr(args, k, None)) is not None}
    try:
        settings = Settings(**over)
    except ValidationError as e:
        first = e.errors()[0]
        name = ".".join(map(str, first["loc"]))
        if name in Settings.model_fields:  # where the value came from: the flag, else the variable
            env = f"GRAPHMON_{name.upper()}"
            name = ("/".join(FLAG_NAMES.get(name, ("--" + name.replace("_", "-"),))[:1]) if name in over
                    else f"{env}={os.environ.get(env, '')!r}" if env in os.environ else name)
        why = first["msg"].removeprefix("Value error, ")
        raise CliError(f"bad setting {name}: {why}" if name else f"bad settings: {why}") from None
    if settings.web_config_file is not None:  # checked before anything starts: one line, exit 2
        from graphmon.export.webconfig import WebConfigError, load_web_config

        try:
            load_web_config(settings.web_config_file)
        except WebConfigError as e:
            raise CliError(str(e)) from None
    if settings.state_dir:  # an agent that cannot write its state directory: one line, before anything starts
        from graphmon.export.deploy_state import StateDir

        try:
            StateDir(settings.state_dir)
        except OSError as e:
            raise CliError(f"--state-dir {settings.state_dir}: {e.strerror or e}") from None
    return settings


def _warn_if_public(settings) -> None:
    if settings.is_public and settings.token is None and not _has_basic_auth(settings):
        log.warning("listening on a non-loopback address without GRAPHMON_TOKEN; POST /capture and GET /trace are "
                    "refused until a token (or basic auth in --web.config.file) is set")


def _has_basic_auth(settings) -> bool:
    from graphmon.export.webconfig import load_web_config

    return settings.web_config_file is not None and bool(load_web_config(settings.web_config_file).basic_auth_users)


def _fmt_default(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)


def _add_server_flags(p: argparse.ArgumentParser, kind: str = "serve", full: bool = True) -> None:
    """The Settings fields of ``kind`` ("serve" or "agent") as flags. ``full=False``: only their
    names, without help (the parser of another subcommand: its help needs pydantic, ~130 ms of
    imports that analyze and compare never use)."""
    from typing import Literal, Union, get_args, get_origin

    if not full:
        for name in SERVER_FIELDS[kind]:
            p.add_argument(*FLAG_NAMES.get(name, ("--" + name.replace("_", "-"),)), dest=name)
        return
    from graphmon.settings import Settings

    for name in SERVER_FIELDS[kind]:
        f = Settings.model_fields[name]
        ann = f.annotation
        typ = next(a for a in get_args(ann) if a is not type(None)) if get_origin(ann) is Union else ann  # Optional[X]
        default = "" if f.default is None else f"default {_fmt_default(f.default)}; "
        kw: dict = {"help": f"{f.description} ({default}env GRAPHMON_{name.upper()})".replace("%", "%%")}
        if get_origin(typ) is Literal:
            kw["choices"] = get_args(typ)
        elif typ is bool:
            kw["action"] = argparse.BooleanOptionalAction
        else:
            kw["type"] = typ
            kw["metavar"] = {int: "N", float: "X"}.get(typ, "FILE" if name.endswith("_file") else
                                                       "DIR" if name.endswith("_dir") else None)
        p.add_argument(*FLAG_NAMES.get(name, ("--" + name.replace("_", "-"),)), dest=name, **kw)


def _add_log_level(p: argparse.ArgumentParser) -> None:
    p.add_argument("--log-level", choices=LOG_LEVELS, type=str.lower,
                   help="graphmon's log level on stderr (default info; env GRAPHMON_LOG_LEVEL)")
    p.add_argument("--log-format", choices=LOG_FORMATS, type=str.lower,
                   help="log lines as text (default), json (one object a line) or logfmt (env GRAPHMON_LOG_FORMAT)")


def _setup_logging(args: argparse.Namespace) -> None:
    from graphmon import logs

    try:
        level, fmt = logs.resolve(getattr(args, "log_level", None), getattr(args, "log_format", None))
    except ValueError as e:
        raise CliError(str(e)) from None
    logs.setup(level, fmt)
