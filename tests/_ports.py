"""A TCP port for a process group the tests start themselves (``MASTER_PORT``).

A port the kernel hands out (bind to port 0, close, pass the number on) can be handed out
again, to any socket of another test, before the group's store binds it: the store then
connects to a stranger and the rendezvous fails after its time-out. Ports below the start of
the kernel's ephemeral range (``/proc/sys/net/ipv4/ip_local_port_range``, 32768 by default) are
never handed out that way, so one drawn there and found free stays free unless a process asks
for that very number."""

import random
import socket

_LOW = 20000


def _ephemeral_start() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range", encoding="ascii") as handle:
            return int(handle.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def unused_port() -> int:
    """A free port below the ephemeral range, drawn at random (so that two workers of the suite
    rarely draw one), checked free by binding it."""
    high = max(_LOW + 1000, _ephemeral_start())
    draw = random.Random()  # (not the global RNG: a test's seed does not decide the port)
    for _ in range(200):
        port = draw.randrange(_LOW, high)
        with socket.socket() as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in [{_LOW}, {high})")
