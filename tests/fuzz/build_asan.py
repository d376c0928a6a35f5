"""Build the compiled body reader (loadgen/engine/_reader.c) under AddressSanitizer and
UndefinedBehaviorSanitizer with gcc, into a directory of its own, for the fuzzer: the installed
module (built by ``make setup``) is left as it is.

    python tests/fuzz/build_asan.py build/fuzz      # prints the built module's path

gcc has no libFuzzer, so the C code is not coverage-instrumented: it is checked for memory and
undefined-behaviour errors on every input, while the fuzzer's mutations are guided by the
coverage of the Python side (tests/fuzz/fuzz_reader.py).
"""

from __future__ import annotations

import subprocess
import sys
import sysconfig
from pathlib import Path

SOURCE = Path(__file__).resolve().parents[2] / "loadgen" / "engine" / "_reader.c"
FLAGS = [
    "-shared", "-fPIC", "-g", "-O1", "-std=c11", "-Wall", "-Wno-missing-field-initializers",
    "-fsanitize=address,undefined", "-fno-sanitize-recover=undefined", "-fno-omit-frame-pointer",
]  # fmt: skip


def build(out_dir: Path) -> Path:
    """Compile the reader into ``out_dir``; return the module's path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / ("_reader" + sysconfig.get_config_var("EXT_SUFFIX"))
    cmd = ["gcc", *FLAGS, "-I", sysconfig.get_paths()["include"], str(SOURCE), "-o", str(target)]
    subprocess.run(cmd, check=True)
    return target


def main() -> int:
    if len(sys.argv) != 2:
        print("usage: build_asan.py OUT_DIR", file=sys.stderr)
        return 2
    try:
        print(build(Path(sys.argv[1])))
    except FileNotFoundError:
        print("Error: gcc not found; the fuzzer's sanitized build needs it (apt-get install gcc)", file=sys.stderr)
        return 2
    except subprocess.CalledProcessError as e:
        print(f"Error: gcc failed building {SOURCE} (exit {e.returncode}); its messages are above", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
