"""``jobsapp queue|domain pause|resume|list``: flow control from the command line.

``register(subparsers, run, actor)`` adds the commands to ``jobsapp``, whose ``run`` runs
an operator action (its exit status and refusal lines) and ``actor`` names who acts. Exit
0 done, 1 refused (an unknown domain), 2 bad input; pausing what is paused already says
so and exits 0.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from functools import partial
from typing import Any

from jobsapp.lifecycle.flow.gating import Kind

Run = Callable[[Callable[[], str]], int]
Actor = Callable[[argparse.Namespace], str]


def _act(run: Run, actor: Actor, pausing: bool, args: argparse.Namespace) -> int:
    from jobsapp import flow_control
    from jobsapp.db import get_engine

    kind = Kind(args.kind)
    act = flow_control.pause if pausing else flow_control.resume

    def done() -> str:
        changed = act(get_engine(), kind, args.name, actor=actor(args), reason=args.reason)
        verb = "paused" if pausing else "resumed"
        return f"{kind} {args.name} {verb}" if changed else f"{kind} {args.name} was already {verb}"

    return run(done)


def show(args: argparse.Namespace) -> int:
    from jobsapp import flow_control
    from jobsapp.db import get_engine

    found = [p for p in flow_control.paused(get_engine()) if p.kind == args.kind]
    if args.json:
        lines = [json.dumps([p.as_json() for p in found])]
    else:
        lines = [
            f"{p.name}\tpaused {p.paused_at.isoformat()} by {p.paused_by}: {p.reason or ''}"
            for p in found
        ] or [f"no {args.kind} is paused"]
    sys.stdout.write("".join(f"{line}\n" for line in lines))
    return 0


def register(sub: Any, run: Run, actor: Actor) -> None:
    for kind, what in ((Kind.QUEUE, "a broker queue"), (Kind.DOMAIN, "a domain (run table)")):
        group = sub.add_parser(kind.value, help=f"pause or resume {what}")
        actions = group.add_subparsers(dest=f"{kind.value}_action", required=True)
        for name, pausing, verb in (
            ("pause", True, "publish and claim nothing of"),
            ("resume", False, "publish and claim again"),
        ):
            action = actions.add_parser(name, help=f"{verb} {what}; leaves an audit row")
            action.add_argument(
                "name",
                help="the queue's name"
                if kind is Kind.QUEUE
                else "the domain's module (jobs, attachments, ...)",
            )
            action.add_argument("--reason", required=True, help="why, for the audit row")
            action.add_argument("--actor", help="who acts (default: $USER), as operator:<actor>")
            action.set_defaults(handler=partial(_act, run, actor, pausing), kind=kind.value)
        listing = actions.add_parser("list", help=f"every paused {kind.value}")
        listing.add_argument("--json", action="store_true", help="JSON instead of lines")
        listing.set_defaults(handler=show, kind=kind.value)
