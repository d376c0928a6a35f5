"""The compiled body reader (loadgen/engine/_reader.c), chat chunk path (loadgen/engine/_chat.c) and
capture relay pump (loadgen/capture/_relay.c),
built by ``pip install`` with the system's C compiler. Where there is none, or it fails, the install goes on without it and says so in one
line: the worker then reads replies on the Python path (loadgen/engine/http_reply.py), which is
the reference the compiled one is tested against. The project's metadata is in pyproject.toml.
"""

from __future__ import annotations

import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


class OptionalBuildExt(build_ext):
    """``build_ext`` that leaves a working install when the extension cannot be built."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as e:  # no compiler at all (distutils raises before compiling)
            self._skipped("C reader and relay", e)

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as e:  # the compiler is there but fails (or is `false`)
            self._skipped(ext.name, e)

    @staticmethod
    def _skipped(what: str, e: BaseException) -> None:
        reason = " ".join(str(e).split())[:200] or type(e).__name__
        print(f"loadgen: {what} not built ({reason}); using the Python path instead", file=sys.stderr)


setup(
    ext_modules=[
        Extension(
            "loadgen.engine._reader",
            sources=["loadgen/engine/_reader.c"],
            depends=["loadgen/engine/_reader_api.h"],
            extra_compile_args=["-O2", "-std=c11", "-Wall", "-Wno-missing-field-initializers"],
            optional=True,
        ),
        # An OpenAI chat stream's chunk lines, parsed and applied to the stream's state in C.
        Extension(
            "loadgen.engine._chat",
            sources=["loadgen/engine/_chat.c"],
            depends=["loadgen/engine/_reader_api.h"],
            extra_compile_args=["-O2", "-std=c11", "-Wall", "-Wno-missing-field-initializers"],
            optional=True,
        ),
        # The capture relay's body pump: upstream reply bodies to their clients without Python per chunk.
        Extension(
            "loadgen.capture._relay",
            sources=["loadgen/capture/_relay.c"],
            extra_compile_args=["-O2", "-std=c11", "-Wall", "-Wno-missing-field-initializers"],
            optional=True,
        ),
    ],
    cmdclass={"build_ext": OptionalBuildExt},
)
