"""`vkprovider`: the product's command line.

  vkprovider run --config FILE [--set section.key=value ...] [--node-name N] [--kubeconfig F] [--port P]
  vkprovider status [--url http://HOST:10255] [--since 24h | --reclaims 1h]
  vkprovider drain --config FILE [--deployment NS/NAME] [--timeout S]
  vkprovider onboard --tenant T --front-end-kubeconfig F --member-kubeconfig M [--member-name N]
                     [--quota cpu=...,memory=...] [--pod-security LEVEL] [--dry-run]
  vkprovider offboard --tenant T --front-end-kubeconfig F --member-kubeconfig M [--member-name N] [--force]
  vkprovider crds apply [-f FILE_OR_DIR ...] [--kubeconfig F] [--timeout S]
  vkprovider check --node N [--node N ...] [--namespace NS] [--timeout S] [--image I] [--kubeconfig F]

Bad settings end with one line on stderr and exit status 2; a runtime failure with status 1.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import importlib
import signal
import sys
from collections.abc import Callable
from pathlib import Path

import uvloop

from vkprovider import heap, logs, status
from vkprovider.kube.access import KubeconfigError
from vkprovider.runtime import Runtime, build_provider
from vkprovider.settings import SettingsError, load


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vkprovider", description="A virtual kubelet pooling member clusters.")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the virtual kubelet")
    run.add_argument("--config", type=Path, help="YAML settings file")
    run.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override one setting")
    run.add_argument("--node-name", help="name of the virtual node (node.name)")
    run.add_argument("--kubeconfig", type=Path, help="kubeconfig of the front-end cluster (kube.kubeconfig)")
    run.add_argument("--port", type=int, help="port of the kubelet API (http.port)")
    drain = sub.add_parser(
        "drain", help="take the provider out of every member (checkpoint notices first), then remove its nodes"
    )
    drain.add_argument("--config", type=Path, help="YAML settings file (the provider's)")
    drain.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override one setting")
    drain.add_argument("--deployment", help="NAMESPACE/NAME of the provider's Deployment, scaled to zero before")
    drain.add_argument("--timeout", type=float, default=900.0, help="seconds the whole drain may take")
    for module in TOOL_MODULES:
        importlib.import_module(module).add_arguments(sub)
    status = sub.add_parser("status", help="print capacity, use and health of members and virtual nodes")
    status.add_argument("--url", default="http://127.0.0.1:10255", help="the provider's plain HTTP port")
    shown = status.add_mutually_exclusive_group()
    shown.add_argument(
        "--since", default=None, help="instead: what each member lent and offline work used over 24h, 90m, 14d..."
    )
    shown.add_argument("--reclaims", default=None, metavar="SPAN", help="instead: the pods given back over 1h, 24h...")
    return parser


async def _run(runtime: Runtime) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, runtime.request_stop)
    await runtime.run()


def loop_factory(name: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The event loop the settings name: uvloop's, or None for the standard library's."""
    return uvloop.new_event_loop if name == "uvloop" else None


def _tune_gc() -> None:
    """The caches hold thousands of plain, acyclic dicts (pods, member records). At CPython's
    default thresholds (700, 10, 10) every few hundred pods set off a full collection that scans
    them all: in a 1,000-pod burst that was about 1.4 s of the provider's CPU, in pauses of up to
    175 ms. Collect young objects as before but rarely the old ones, and leave the objects of
    start-up (modules, settings) out of every collection."""
    gc.set_threshold(50_000, 20, 100)
    gc.freeze()
    heap.fix_mmap_threshold()  # and large blocks kept out of the C heap (vkprovider.heap)


#: Commands a provider adds (settings.provider.type -> command -> "module:function"), found by
#: name like the providers themselves: the runtime does not import the packages above it.
PROVIDER_COMMANDS = {"federation": {"drain": "federation.reclaim.drain:main"}}
#: Modules adding commands that need no settings (each has add_arguments(subparsers) and
#: main(args), and owns the commands it adds): `onboard`, `offboard`, `crds` and `check`.
TOOL_MODULES = {
    "federation.tenancy.onboard": ("onboard", "offboard"),
    "federation.members.crds": ("crds",),
    "vkprovider.check": ("check",),
}


def _drain(args: argparse.Namespace) -> int:
    try:
        settings = load(config=args.config, overrides=args.set)
    except SettingsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    target = PROVIDER_COMMANDS.get(settings.provider.type, {}).get("drain")
    if target is None:
        print(f"error: provider {settings.provider.type!r} has nothing to drain", file=sys.stderr)
        return 2
    module_name, _, function = target.partition(":")
    command = getattr(importlib.import_module(module_name), function)
    return int(command(settings, deployment=args.deployment, timeout=args.timeout))


def _end_on_sigterm() -> None:
    """A one-shot command (a hook's, the helm test's) is often its container's first process,
    and PID 1 ignores a signal it has no handler for: its pod's deletion would wait out the
    grace period. It ends on SIGTERM at once, with the shell's status for it (143)."""

    def end(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, end)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command != "run":
        _end_on_sigterm()
    if args.command == "status":
        return status.main(args.url, args.since, args.reclaims)
    if args.command == "drain":
        return _drain(args)
    for module, commands in TOOL_MODULES.items():
        if args.command in commands:
            return int(importlib.import_module(module).main(args))
    try:
        settings = load(
            config=args.config,
            overrides=args.set,
            **{"node.name": args.node_name, "kube.kubeconfig": args.kubeconfig, "http.port": args.port},
        )
        logs.configure(settings.log)
        provider = build_provider(settings)
    except (SettingsError, KubeconfigError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    _tune_gc()
    try:
        with asyncio.Runner(loop_factory=loop_factory(settings.runtime.event_loop)) as runner:
            runner.run(_run(Runtime(settings, provider)))
    except KubeconfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
