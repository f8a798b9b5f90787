"""graphmon's hook: ``graphmon run`` puts a folder holding (a link to) this file first on the
children's PYTHONPATH, so every descendant Python process runs it at start-up.

It does almost nothing at start-up: it chains to any other sitecustomize on the path, and, when
an agent is named (GRAPHMON_AGENT), installs a post-import hook on torch. The light collector
starts (and CUPTI is subscribed) only when the process captures its first CUDA graph
(graphmon.host.trigger). No port is opened in the process: windows go to the agent.
GRAPHMON_ATTACH=0 turns the hook off in a process; GRAPHMON_SUBSCRIBE=start subscribes at
start-up (graphs captured outside torch), =off never.
"""

import os as _os
import sys as _sys


def _graphmon_chain():
    import importlib.machinery
    import importlib.util

    here = _os.path.dirname(_os.path.abspath(__file__))
    real = _os.path.dirname(_os.path.realpath(__file__))
    path = [p for p in _sys.path if _os.path.abspath(p or ".") not in (here, real)]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is not None and spec.loader is not None:
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)


def _graphmon_hook():
    if _os.environ.get("GRAPHMON_ATTACH", "1") == "0" or not _os.environ.get("GRAPHMON_AGENT"):
        return
    fallback = _os.environ.get("GRAPHMON_HOOK_FALLBACK")
    if fallback and fallback not in _sys.path:
        # Last on the path: the engine's own numpy/cupti win; graphmon's only fill what is missing.
        _sys.path.append(fallback)
    mode = _os.environ.get("GRAPHMON_SUBSCRIBE", "graph")
    if mode == "off":
        return
    from graphmon.host.attach import attach_from_env

    if mode == "start":
        attach_from_env()
        return
    from graphmon.host.trigger import install

    install(attach_from_env)


try:
    _graphmon_chain()
except Exception as _e:
    print(f"graphmon: chained sitecustomize failed: {_e!r}", file=_sys.stderr)
try:
    _graphmon_hook()
except Exception as _e:  # never break the host program
    print(f"graphmon: hook failed: {_e!r}", file=_sys.stderr)
