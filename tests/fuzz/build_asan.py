"""Build the compiled body reader (loadgen/engine/_reader.c), or another of the engine's C
modules, under AddressSanitizer and UndefinedBehaviorSanitizer with gcc, into a directory of its
own, for the fuzzer and the sanitized tests: the installed module (built by ``make setup``) is
left as it is.

    python tests/fuzz/build_asan.py build/fuzz              # prints the built module's path
    python tests/fuzz/build_asan.py build/fuzz _reader _chat

gcc has no libFuzzer, so the C code is not coverage-instrumented: it is checked for memory and
undefined-behaviour errors on every input, while the fuzzer's mutations are guided by the
coverage of the Python side (tests/fuzz/fuzz_reader.py).
"""

from __future__ import annotations

import subprocess
import sys
import sysconfig
from pathlib import Path

ENGINE = Path(__file__).resolve().parents[2] / "loadgen" / "engine"
FLAGS = [
    "-shared", "-fPIC", "-g", "-O1", "-std=c11", "-Wall", "-Wno-missing-field-initializers",
    "-fsanitize=address,undefined", "-fno-sanitize-recover=undefined", "-fno-omit-frame-pointer",
]  # fmt: skip


def build(out_dir: Path, module: str = "_reader") -> Path:
    """Compile the engine's C module ``module`` (default the reader) into ``out_dir``; return the
    module's path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    source = ENGINE / f"{module}.c"
    target = out_dir / (module + sysconfig.get_config_var("EXT_SUFFIX"))
    include = ["-I", sysconfig.get_paths()["include"], "-I", str(ENGINE)]
    subprocess.run(["gcc", *FLAGS, *include, str(source), "-o", str(target)], check=True)
    return target


def main() -> int:
    if len(sys.argv) < 2:
        print("usage: build_asan.py OUT_DIR [MODULE ...]  (MODULE: _reader, _chat; default _reader)", file=sys.stderr)
        return 2
    modules = sys.argv[2:] or ["_reader"]
    unknown = [m for m in modules if not (ENGINE / f"{m}.c").is_file()]
    if unknown:
        print(f"Error: no C module {unknown[0]!r} in {ENGINE} (known: _reader, _chat)", file=sys.stderr)
        return 2
    try:
        for module in modules:
            print(build(Path(sys.argv[1]), module))
    except FileNotFoundError:
        print("Error: gcc not found; the fuzzer's sanitized build needs it (apt-get install gcc)", file=sys.stderr)
        return 2
    except subprocess.CalledProcessError as e:
        print(f"Error: gcc failed building {e.cmd[-3]} (exit {e.returncode}); its messages are above", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
