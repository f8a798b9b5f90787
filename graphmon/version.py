"""graphmon's version, in a module of its own: the modules that report it (build info, the HTTP
apps, the CLI) import it from here, not from the package facade (graphmon/__init__.py), which
imports graphmon.host.attach and, through it, the exporter: that was an import cycle."""

__version__ = "0.1.0"
