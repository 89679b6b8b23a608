"""What the front door's peer-account check costs per new connection, with many sockets on the machine.

Opens ``--sockets`` loopback sockets (connected pairs, so the kernel's table holds that many), then
accepts ``--connections`` more and times, for each, the exact netlink lookup the daemon makes
(``sidecar.net.peer``) and, for comparison, one scan of ``/proc/net/tcp`` (what the lookup replaces).
Prints p50 and p99 in microseconds. Linux only.

    .venv/bin/python scripts/bench_peer.py --sockets 10000 --connections 500
"""

from __future__ import annotations

import argparse
import resource
import socket
import statistics
import time

from sidecar.net.peer import PeerOwners


def _percentiles(samples: list[float]) -> str:
    ordered = sorted(samples)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return f"p50 {statistics.median(ordered):8.1f} us   p99 {p99:8.1f} us"


def _proc_scan() -> int:
    rows = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table, "rb") as f:
                rows += sum(1 for _ in f)
        except OSError:
            pass
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sockets", type=int, default=10_000, help="loopback sockets held open (pairs)")
    parser.add_argument("--connections", type=int, default=500, help="new connections measured")
    args = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = args.sockets + args.connections * 2 + 64
    if soft < need:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(need, hard), hard))
    owners = PeerOwners()
    if not owners.available:
        raise SystemExit(f"the peer check is off here: {owners.reason}")
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4096)
    address = listener.getsockname()
    held: list[socket.socket] = []
    while len(held) < args.sockets:
        held.append(socket.create_connection(address))
        held.append(listener.accept()[0])
    print(f"sockets held open: {len(held)}; rows in /proc/net/tcp*: {_proc_scan()}")
    lookups: list[float] = []
    scans: list[float] = []
    for _ in range(args.connections):
        with socket.create_connection(address):
            accepted, _ = listener.accept()
            with accepted:
                started = time.perf_counter()
                uid = owners.owner_of(accepted)
                lookups.append((time.perf_counter() - started) * 1e6)
                if uid is None:
                    raise SystemExit("the lookup did not answer for a live connection")
                started = time.perf_counter()
                _proc_scan()
                scans.append((time.perf_counter() - started) * 1e6)
    print(f"netlink exact lookup (per new connection): {_percentiles(lookups)}")
    print(f"/proc/net/tcp scan, for comparison:        {_percentiles(scans)}")
    for sock in held:
        sock.close()
    listener.close()
    owners.close()


if __name__ == "__main__":
    main()
