"""The errors the lab raises; each names the thing, gives the cause and suggests the fix.

    LabError              a lab step failed at runtime (step, command, stderr)      exit 1
    ├── CommandError      a command run in a lab node exited non-zero               exit 1
    ├── UsageError        the command line asks for something that cannot be done    exit 2
    │   └── TopologyError a topology file is invalid (file, key, value, expected)   exit 2
    ├── LabExistsError    `up` of a lab whose name is already taken                   exit 1
    └── LabNotFoundError  `down`/`status`/`exec` of a lab that is not running        exit 1

Tests compare messages, so messages are part of the interface.
"""

from __future__ import annotations


class LabError(Exception):
    """A lab step failed at runtime; `step`, `command` and `stderr` say where and why."""

    exit_code = 1

    def __init__(
        self, message: str, *, step: str | None = None, command: str | None = None, stderr: str | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.step = step
        self.command = command
        self.stderr = stderr


class CommandError(LabError):
    """A command run in a lab node exited non-zero: the lab (or a DUT's adapter) failed, not the DUT's
    behaviour under test (a conformance check records it as an error, never as a finding)."""


class UsageError(LabError):
    """The command line asks for something that cannot be done (unknown node, bad argument)."""

    exit_code = 2


class TopologyError(UsageError):
    """A topology file is invalid: the message reads `FILE: KEY must be EXPECTED but got VALUE`."""

    def __init__(self, file: str, key: str, value: object, expected: str) -> None:
        super().__init__(f"{file}: {key} must be {expected} but got {value!r}")
        self.file = file
        self.key = key
        self.value = value
        self.expected = expected


class LabExistsError(LabError):
    """A lab of that name is already up (or left state behind): `l4lab down --name NAME` first."""


class LabNotFoundError(LabError):
    """No lab of that name is up."""
