"""handover.py: what a verb that writes does when `lbctl run` owns the instance.

The daemon keeps the instance matching its config file, so a write that bypassed it would be undone
by its next reload, or would race its health applies. Instead:

* ``lbctl upgrade [--object X]`` is handed to the daemon (balancer/control.py), which swaps the
  program behind its links and keeps its health checks running;
* ``lbctl apply FILE`` of the daemon's own config file is handed over as a reload (what SIGHUP does,
  but answered, so the command's exit status says whether it applied);
* any other write (``apply`` of another file, ``vip``/``real`` edits, ``load``, ``unload``) is
  refused in one line naming the owner and the command that works.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from balancer import control, controller, objects
from balancer.errors import InstanceOwnedError, LbError

__all__ = ["hand_over"]


def hand_over(args: argparse.Namespace, owned: InstanceOwnedError) -> int:
    """Carry out args through the daemon that owns the instance, or raise the refusal; the exit status."""
    if not owned.by_daemon:
        raise owned
    sock = control.socket_path(controller.STATE_ROOT, args.instance)
    if args.cmd == "upgrade":
        obj = os.path.abspath(objects.find(args.object))  # the daemon's working folder is not ours
        return _report(control.request(sock, "upgrade", object=obj))
    daemon = control.request(sock, "describe")
    config = str(daemon.get("config", ""))
    if args.cmd == "apply" and _same_file(args.file, config):
        return _report(control.request(sock, "reload"), getattr(args, "json", False))
    raise InstanceOwnedError(f"instance '{owned.instance}' is owned by {owned.owner}, which keeps it matching "
                             f"{config}; {_remedy(args, config, int(daemon.get('pid', 0)))}",
                             owned.instance, owned.owner)


def _remedy(args: argparse.Namespace, config: str, pid: int) -> str:
    apply = f"`lbctl --instance {args.instance} apply {config}` (or `systemctl reload lbctl`)"
    if args.cmd == "apply":
        return f"put the new config in {config}, then {apply}"
    if args.cmd in ("vip", "real"):
        return f"edit the {args.cmd}s in {config}, then {apply}"
    return f"stop the daemon first (`systemctl stop lbctl`, or `kill {pid}`): the datapath keeps forwarding"


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _report(answer: dict[str, object], as_json: bool = False) -> int:
    """Print the daemon's answer as the verb's own output: stdout when done (a JSON object with
    --json), one line on stderr if not."""
    message = str(answer.get("message", ""))
    if answer.get("ok"):
        print(json.dumps({"handed_to": "lbctl run", "message": message}, indent=1) if as_json else message)
        return 0
    code = answer.get("exit")
    if code == 2:
        print(f"lbctl: {message}", file=sys.stderr)
        return 2
    raise LbError(f"the daemon refused: {message}" if message else "the daemon refused without a reason")
