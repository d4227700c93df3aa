"""`make demo`: the lab with its status table, and the tidal online load of a member.

Until the federation provider exists this shows the playground it will run on: an offline
cluster and three online members whose spare CPU rises and falls. The lab stays up afterwards
(`make down` stops it).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from e2e import lab as lab_mod
from e2e import online, state, status


async def demo(state_dir: Path) -> None:
    existing = state.load(state_dir.resolve()) if (state_dir / "state.json").exists() else None
    if existing and lab_mod.is_running(existing):
        lab = existing
        print(f"reusing the lab running in {state_dir}")
    else:
        print("starting the lab: offline + 3 members x 20 simulated nodes")
        lab = await lab_mod.up(state_dir, lab_mod.LabSpec(members=3, nodes_per_member=20))
    print(await status.table(lab))
    for share in (0.2, 0.6, 0.3):
        result = await online.set_load(lab.kubeconfig("member-1"), cpu_share=share, wait=True, name="web")
        print(f"\nonline tide in member-1 -> {result.describe()}")
        print(await status.table(lab))
    print(f"\nthe lab keeps running; kubeconfigs in {state_dir}/kubeconfig/, stop it with `make down`")


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m e2e.demo")
    parser.add_argument("--state", type=Path, default=Path(".lab"))
    args = parser.parse_args()
    try:
        asyncio.run(demo(args.state))
    except (lab_mod.LabError, online.LoadError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
