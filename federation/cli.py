"""`federation`: commands of the federation side.

federation agent --kubeconfig MEMBER.yaml --listen ADDR [--member NAME] [--tls-cert F --tls-key F]
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from pathlib import Path

from federation import labels
from federation.agent.server import serve
from federation.members.watch import MemberWatcher
from vkprovider import logs
from vkprovider.kube.access import KubeconfigError, load_kubeconfig
from vkprovider.settings import LogSettings


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="federation")
    sub = parser.add_subparsers(dest="command", required=True)
    agent = sub.add_parser("agent", help="serve one member's capacity to providers over gRPC")
    agent.add_argument("--kubeconfig", type=Path, required=True, help="kubeconfig of the member cluster")
    agent.add_argument("--listen", required=True, help="address to serve on, e.g. 0.0.0.0:50051")
    agent.add_argument("--member", default=None, help="the member's name (default: the kubeconfig's context)")
    agent.add_argument("--network-pod-label", default=labels.NETWORK_POD)
    agent.add_argument("--heartbeat", type=float, default=5.0, help="seconds between heartbeats when idle")
    agent.add_argument("--tls-cert", type=Path, default=None)
    agent.add_argument("--tls-key", type=Path, default=None)
    agent.add_argument("--log-format", choices=("auto", "json", "console"), default="auto")
    return parser


async def _agent(args: argparse.Namespace) -> None:
    access = load_kubeconfig(args.kubeconfig)
    watcher = MemberWatcher(
        args.member or access.name,
        access,
        on_change=lambda: None,
        network_pod_label=args.network_pod_label,
        track_owners=True,
    )
    tls = (args.tls_cert.read_bytes(), args.tls_key.read_bytes()) if args.tls_cert and args.tls_key else None
    task = asyncio.create_task(serve(watcher, listen=args.listen, tls=tls, heartbeat=args.heartbeat), name="agent")
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, task.cancel)
    try:
        await task
    except asyncio.CancelledError:
        pass


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logs.configure(LogSettings(format=args.log_format))
    if bool(args.tls_cert) != bool(args.tls_key):
        print("error: --tls-cert and --tls-key go together", file=sys.stderr)
        return 2
    try:
        asyncio.run(_agent(args))
    except KubeconfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
