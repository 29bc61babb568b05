"""The exceptions the controller raises, one tree whose messages are part of the interface.

::

    LbError                      anything the controller refuses or fails to do
    ├── ConfigError              a configuration value is wrong (file, key, value, expected)
    ├── RingError                a Maglev ring cannot be built from the reals given (also a ValueError)
    ├── DatapathError            the kernel refused an operation on a program, interface or map
    │   └── AbiMismatchError     a compiled object does not match the controller's view of the ABI
    └── HostError                the host lacks what the command needs (bpffs, a capability, a free
        │                        port, the instance's lock), found before anything was changed
        └── InstanceOwnedError   another process (`lbctl run`) holds the instance's lock

An error outside this tree is a bug: the CLIs print one line and the path of a log holding its
traceback (``crash_report``), never the traceback itself.

Every message names the thing, gives the cause and, where one exists, the fix::

    lb.toml: vips[2].port must be 1..65535 but got 0
    cannot attach XDP program to 'lb-rt': Operation not supported; try --mode generic

Tests compare these messages: change them only together with the tests.
"""

from __future__ import annotations

import os
import tempfile
import time
import traceback

__all__ = ["AbiMismatchError", "ConfigError", "DatapathError", "HostError", "InstanceOwnedError", "LbError",
           "RingError", "crash_report", "show_value"]


class LbError(Exception):
    """Base of every error the controller raises on purpose; the CLI prints its message on one line."""


class ConfigError(LbError):
    """A configuration value is missing, malformed or inconsistent.

    ``key`` is the dotted path with list indexes (``vips[2].port``); ``value`` is what the file
    holds; ``expected`` says what would be accepted, phrased to follow "must be". The message is
    ``<file>: <key> must be <expected> but got <value>``, unless ``message`` is given: then it is
    ``<file>: <message>``, for rules a single "must be" cannot say (several keys, unknown keys).
    """

    def __init__(
        self,
        file: str,
        key: str,
        value: object,
        expected: str,
        *,
        message: str | None = None,
    ) -> None:
        self.file = file
        self.key = key
        self.value = value
        self.expected = expected
        if message is None:
            message = f"{key} must be {expected} but got {show_value(value)}"
        super().__init__(f"{file}: {message}")


class RingError(LbError, ValueError):
    """A Maglev ring cannot be built: a size that is not prime, a bad weight or id, a duplicate address."""


class DatapathError(LbError):
    """The kernel (or libbpf) refused an operation on a named program, interface or map.

    ``what`` says what was attempted on what (``attach XDP program to 'lb-rt'``); ``errno`` is the
    positive error number reported (0 when there is none); ``hint`` suggests the fix. The message
    is ``cannot <what>: <strerror(errno)>; <hint>``, each part present only when known.
    """

    def __init__(self, what: str, errno: int = 0, hint: str = "") -> None:
        self.what = what
        self.errno = abs(errno)
        self.hint = hint
        text = f"cannot {what}"
        if self.errno:
            text += f": {os.strerror(self.errno)}"
        if hint:
            text += f"; {hint}"
        super().__init__(text)


class AbiMismatchError(DatapathError):
    """A compiled BPF object's BTF does not match the ABI the controller was generated from."""


class HostError(LbError):
    """The host lacks something the command needs; raised by the checks that run before any change."""


class InstanceOwnedError(HostError):
    """The instance's lock is held: ``owner`` is what the lock file says (``lbctl run (pid 812)``)."""

    def __init__(self, message: str, instance: str, owner: str) -> None:
        super().__init__(message)
        self.instance = instance
        self.owner = owner

    @property
    def by_daemon(self) -> bool:
        """Whether the owner is a daemon (`lbctl run`), which takes requests on its control socket."""
        return self.owner.startswith("lbctl run")


def crash_report(prog: str, exc: BaseException, log_dirs: tuple[str, ...] = ()) -> str:
    """Write exc's traceback to a log file; return the one line a CLI prints for it.

    The log goes to the first of log_dirs that can be written, else to the temporary directory.
    """
    stamp = time.strftime("%Y%m%dT%H%M%S")
    text = "".join(traceback.format_exception(exc))
    for directory in (*log_dirs, tempfile.gettempdir()):
        try:
            os.makedirs(directory, exist_ok=True)
            fd, path = tempfile.mkstemp(prefix=f"{prog}-crash-{stamp}-", suffix=".log", dir=directory)
            with os.fdopen(fd, "w") as f:
                f.write(text)
            break
        except OSError:
            continue
    else:
        path = "(no writable directory for the log)"
    what = f"{type(exc).__name__}: {exc}".splitlines()[0] if str(exc) else type(exc).__name__
    return f"{prog}: unexpected error ({what}); the traceback is in {path}"


def show_value(value: object) -> str:
    """Render a config value as TOML would write it, so the user can find it in the file."""
    if isinstance(value, str):
        return _toml_string(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(show_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {show_value(v)}" for k, v in value.items()) + " }"
    return str(value)


def _toml_string(text: str) -> str:
    """A TOML basic string: quotes and backslashes escaped, control characters (and DEL) as \\uXXXX."""
    out = ['"']
    for ch in text:
        if ch in ('"', "\\"):
            out.append("\\" + ch)
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)
