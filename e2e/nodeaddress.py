"""An address of the lab's own that the apiservers will proxy to (issue 37, item 2).

kube-apiserver refuses to proxy to a node whose address is not global unicast (the node
proxy's `isProxyableHostname`: no loopback, no link-local), so a virtual kubelet that
advertises 127.0.0.1 serves logs and exec but never `/api/v1/nodes/NODE/proxy/...` (metrics
scrapes, `/pods`, `/runningpods/`). The lab adds a /32 in 10.234.0.0/16 to the loopback
interface: traffic stays on this machine, and the machine's kernel has no dummy-interface
module to make one apart. One address per lab, from its port base (two running labs never share
a base), removed when the lab stops. Needs root (CAP_NET_ADMIN); without it the lab has none and
says so, and the node proxy is unavailable.
"""

from __future__ import annotations

import ipaddress
import subprocess

PREFIX = ipaddress.IPv4Network("10.234.0.0/16")


def for_port_base(base: int) -> str:
    """Pure: the lab's node address for its port base (20000-32000: unique in the /16)."""
    return str(PREFIX.network_address + (base % PREFIX.num_addresses))


def _ip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=10, check=False)


def claim(address: str) -> str | None:
    """Add `address` to the loopback interface; None when done (or there already: a lab that
    died unstopped left it), else why not."""
    try:
        done = _ip("addr", "add", f"{address}/32", "dev", "lo")
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"cannot run ip: {exc}"
    if done.returncode == 0 or "File exists" in done.stderr:
        return None
    return done.stderr.strip() or f"ip exited with {done.returncode}"


def release(address: str) -> None:
    """Remove `address` from the loopback interface (gone already is fine)."""
    try:
        _ip("addr", "del", f"{address}/32", "dev", "lo")
    except (OSError, subprocess.TimeoutExpired):
        return
