"""`python -m e2e`: the lab's command line (see shared/DESIGN.md for the contract).

Every failure ends with one line on stderr and exit status 1; nothing prints a traceback for
bad input.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from e2e import lab as lab_mod
from e2e import online, stacks, status
from e2e.binaries import BinaryError, ensure_all
from vkprovider.kube import ApiError


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m e2e", description="The vkprovider lab: real control planes.")
    sub = parser.add_subparsers(dest="command", required=True)

    up = sub.add_parser("up", help="start the offline cluster and N member clusters")
    up.add_argument("--members", type=int, default=3)
    up.add_argument("--nodes-per-member", type=int, default=20)
    up.add_argument("--profiles", default="", help="comma-separated node profiles per member (cpu,gpu-v100,gpu-t4)")
    up.add_argument(
        "--offline-nodes", type=int, default=0, help="native simulated nodes in the offline cluster (default: none)"
    )
    up.add_argument(
        "--offline-profile", default="gpu-v100", help="node profile of the offline cluster's nodes (default: gpu-v100)"
    )
    up.add_argument(
        "--port-base", type=int, default=None, help="first of a block of loopback ports (default: any free)"
    )
    up.add_argument("--bin-dir", type=Path, default=None, help="take binaries from here instead of the build cache")
    up.add_argument(
        "--with",
        dest="stacks",
        default="",
        help=f"offline stacks to run in the front end, comma-separated ({','.join(stacks.KNOWN)})",
    )
    up.add_argument("--state", type=Path, required=True)

    for name, text in (("down", "stop every process of the lab"), ("status", "print clusters, nodes and pods")):
        p = sub.add_parser(name, help=text)
        p.add_argument("--state", type=Path, required=True)
    for name, text in (("stop", "stop one cluster's apiserver (an outage)"), ("start", "restart it")):
        p = sub.add_parser(name, help=text)
        p.add_argument("--cluster", required=True)
        p.add_argument("--state", type=Path, required=True)

    cfg = sub.add_parser("config", help="print a provider config for the lab")
    cfg.add_argument("--state", type=Path, required=True)
    cfg.add_argument("--provider", choices=("memory", "federation"), default="memory")

    load = sub.add_parser("online", help="set the online load of a member cluster")
    load.add_argument("--cluster", required=True)
    load.add_argument("--cpu", required=True, help="share of the member's allocatable CPU, e.g. 60%% or 0.6")
    load.add_argument("--pod-cpu", default="4", help="CPU request of one online replica (cores)")
    load.add_argument("--name", default="web", help="the online Deployment to create or scale")
    load.add_argument("--wait", action="store_true", help="return once the replicas are Running")
    load.add_argument("--state", type=Path, required=True)

    sub.add_parser("build", help="build (or find in the cache) the control-plane binaries, helm and promtool")
    return parser


async def _run(args: argparse.Namespace) -> int:
    if args.command == "build":
        for name, path in ensure_all().items():
            print(f"{name}\t{path}")
        return 0
    if args.command == "up":
        spec = lab_mod.LabSpec(
            members=args.members,
            nodes_per_member=args.nodes_per_member,
            profiles=tuple(p for p in args.profiles.split(",") if p),
            offline_nodes=args.offline_nodes,
            offline_profile=args.offline_profile,
            port_base=args.port_base,
            bin_dir=args.bin_dir,
            stacks=stacks.parse(args.stacks),
        )
        lab = await lab_mod.up(args.state, spec)
        print(await status.table(lab))
        return 0
    if args.command == "down":
        stopped = lab_mod.down(args.state)
        print(f"stopped {len(stopped)} processes" + (f": {', '.join(stopped)}" if stopped else ""))
        return 0
    if args.command == "status":
        print(await status.table(lab_mod.load_running(args.state)))
        return 0
    if args.command == "stop":
        lab_mod.stop_cluster(args.state, args.cluster)
        print(f"{args.cluster} kube-apiserver stopped")
        return 0
    if args.command == "start":
        await lab_mod.start_cluster(args.state, args.cluster)
        print(f"{args.cluster} kube-apiserver ready")
        return 0
    if args.command == "config":
        print(lab_mod.provider_config(lab_mod.load_running(args.state), args.provider), end="")
        return 0
    if args.command == "online":
        lab = lab_mod.load_running(args.state)
        fraction = online.parse_share(args.cpu)
        result = await online.set_load(
            lab.kubeconfig(lab_mod.cluster_of(lab, args.cluster).name),
            cpu_share=fraction,
            pod_cpu=float(args.pod_cpu),
            name=args.name,
            wait=args.wait,
        )
        print(result.describe())
        return 0
    raise AssertionError(args.command)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return asyncio.run(_run(args))
    except (lab_mod.LabError, BinaryError, online.LoadError, stacks.StackError) as exc:
        print(f"error: {exc}", file=sys.stderr)
    except ApiError as exc:
        print(f"error: the apiserver refused: {exc}", file=sys.stderr)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
    return 1
