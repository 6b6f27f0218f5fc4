"""The C compiler that builds the native forward (worker/engine/native/build.py): `CC` (a name on PATH or a
path), else gcc or cc on PATH. Outside the engine because the loader's `auto` pick asks whether there is one
(q4 only where it can be built; worker/cpu_features.py) before any engine exists.
"""

from __future__ import annotations

import shutil

from worker.settings import c_compiler


class NativeUnavailable(RuntimeError):
    """The native forward cannot be built or loaded here; the message is one line that says why."""


def compiler() -> str:
    """The C compiler's path."""
    configured = c_compiler()
    if configured:
        found = shutil.which(configured)
        if not found:
            raise NativeUnavailable(f"quantization q4 needs a C compiler: CC={configured!r} is not an executable")
        return found
    found = shutil.which("gcc") or shutil.which("cc")
    if not found:
        raise NativeUnavailable("quantization q4 needs a C compiler (gcc: apt-get install build-essential)")
    return found


def compiler_problem() -> str | None:
    """None when there is a C compiler to build the native forward with, else why not (one line)."""
    try:
        compiler()
    except NativeUnavailable as error:
        return str(error)
    return None
