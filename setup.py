"""Only the native decode pass lives here (pyproject.toml has everything else): setuptools
declares C extensions in setup.py. ``optional=True``: without a C compiler the install still
succeeds and graphmon decodes with numpy (graphmon.sources.cupti.native says which runs)."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("graphmon.sources.cupti._decode", ["graphmon/sources/cupti/_decode.c"],
                             extra_compile_args=["-O3", "-fvisibility=hidden"], optional=True)])
