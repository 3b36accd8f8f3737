"""An emulated cluster on one machine: every MPI rank in its own network namespace, links shaped.

    .venv/bin/python scripts/studies/emulated_cluster.py --workers 8 --rate 1gbit -- \\
        .venv/bin/python -m gtopk_hvd.bench comm

Topology: a Linux bridge in the root namespace is the switch; rank r lives in namespace
`<prefix>-r` with one veth pair to the bridge (address 10.213.<n>.(r+1)/24, the bridge .254).
Each veth is shaped by a token bucket (tc tbf) at both ends, so every worker sends and receives
at most RATE, like a NIC on a switch port. Added latency (--delay) needs the kernel's sch_netem;
where it is missing (as on this project's VMs) the script says so and stops before starting.

MPI: OpenMPI over TCP only (pml ob1, btl tcp,self, no shared-memory collectives), out-of-band
and PMIx traffic over the bridge; each rank is started by `ip netns exec <prefix>-$RANK`.

Everything this script creates carries a prefix with its process id and is torn down on exit,
on an exception, on SIGINT/SIGTERM and when the command runs past --timeout (its whole process
group is killed first). Needs root (or CAP_NET_ADMIN) and the `ip` and `tc` tools.
After the run it prints the bytes each worker's link carried (from the kernel's counters).
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

from gtopk_hvd._mpirun import stop_mpirun

RATE_PATTERN = re.compile(r"^\d+(\.\d+)?(bit|kbit|mbit|gbit)$")
DELAY_PATTERN = re.compile(r"^\d+(\.\d+)?(us|ms)$")
QUEUE_PATTERN = re.compile(r"^\d+(kb|mb)$")


class ClusterError(RuntimeError):
    """Setting up the emulated cluster failed; the message names the step."""


def _ip(*args: str) -> None:
    _run(["ip", *args])


def _run(command: Sequence[str]) -> str:
    done = subprocess.run(list(command), capture_output=True, text=True)
    if done.returncode != 0:
        raise ClusterError(f"`{' '.join(command)}` failed: {done.stderr.strip()}")
    return done.stdout


@dataclass
class Cluster:
    """The namespaces, links and addresses of one emulated cluster (made by `emulated_cluster`).
    """

    workers: int
    rate: str
    delay: str | None
    prefix: str = field(default_factory=lambda: f"gk{os.getpid() % 100000}")
    subnet: int = field(default_factory=lambda: 1 + os.getpid() % 250)

    @property
    def bridge(self) -> str:
        return f"{self.prefix}br"

    def namespace(self, rank: int) -> str:
        return f"{self.prefix}-{rank}"

    def host_link(self, rank: int) -> str:
        return f"{self.prefix}v{rank}"

    def address(self, rank: int) -> str:
        return f"10.213.{self.subnet}.{rank + 1}"

    @property
    def network(self) -> str:
        return f"10.213.{self.subnet}.0/24"

    def link_bytes(self) -> list[tuple[int, int]]:
        """(bytes sent, bytes received) by each rank's interface so far."""
        counters = []
        for rank in range(self.workers):
            base = f"/sys/class/net/{self.host_link(rank)}/statistics"
            # The host end of the veth receives what the rank sends, and vice versa.
            with open(f"{base}/rx_bytes") as sent, open(f"{base}/tx_bytes") as received:
                counters.append((int(sent.read()), int(received.read())))
        return counters


def _shape(namespace: str | None, device: str, rate: str, delay: str | None,
           queue: str | None = None) -> None:
    """Token bucket at `rate` on device's egress, netem delay in front when asked for.

    The queue behind the bucket holds 100 ms at the rate: at low rates that is little (125 KB
    at 10 Mbit/s), and a larger message loses packets, which a real link at 100x the rate with a
    buffer of the same bytes would not. With `queue` (bytes, e.g. "4mb") the link is shaped by
    `_shape_with_ack_band` instead.

    The bucket holds half a millisecond at the rate (62.5 KB at 1 Gbit/s, at least two frames):
    measured here at 1 Gbit/s, a 200 KB message then takes 1.5 ms (ideal 1.6 ms; a 125 KB bucket
    lets it through in 0.9 ms) and bulk transfers reach 0.84 Gbit/s (16 KB: 0.6 Gbit/s, as
    64 KB segments must be split)."""
    burst = max(int(rate_bits(rate) / 8 / 2000), 2 * 1514 + 64)
    exec_in = ["ip", "netns", "exec", namespace] if namespace else []
    if queue:
        _shape_with_ack_band(exec_in, device, rate, delay, queue)
        return
    tbf = ["tbf", "rate", rate, "burst", str(burst), "latency", "100ms"]
    if delay:
        _run([*exec_in, "tc", "qdisc", "add", "dev", device, "root", "handle", "1:", "netem",
              "delay", delay])
        _run([*exec_in, "tc", "qdisc", "add", "dev", device, "parent", "1:1", "handle", "10:",
              *tbf])
    else:
        _run([*exec_in, "tc", "qdisc", "add", "dev", device, "root", *tbf])


def _shape_with_ack_band(exec_in: list[str], device: str, rate: str, delay: str | None,
                         queue: str) -> None:
    """--queue: an htb at `rate` whose packets under 512 bytes (TCP's acknowledgements,
    MPI's control messages) go first, the rest through a FIFO of `queue` bytes (a port's
    buffer). With one FIFO behind the token bucket, a worker that sends and receives at once
    (a ring, a pairwise exchange) queues the acknowledgements of what it receives behind what
    it sends, and the sender waits on them: such transfers reached half the rate at 10 Mbit/s.
    A host's per-flow queueing (fq_codel) avoids that; this kernel lacks it, hence the band."""
    # htb charges a GSO packet (up to 64 KB) whole after sending it, unlike tbf, which splits
    # it: one segment per packet keeps a message from passing ahead of the rate.
    _run([*exec_in, "ip", "link", "set", "dev", device, "gso_max_segs", "1"])
    tc = [*exec_in, "tc"]
    root = "1:"
    if delay:
        _run([*tc, "qdisc", "add", "dev", device, "root", "handle", "1:", "netem", "delay",
              delay])
        root = "2:"
        _run([*tc, "qdisc", "add", "dev", device, "parent", "1:1", "handle", root, "htb",
              "default", "20"])
    else:
        _run([*tc, "qdisc", "add", "dev", device, "root", "handle", root, "htb", "default",
              "20"])
    major = root[:-1]
    bursts = ["burst", "1600", "cburst", "1600"]  # one frame: no head start past the rate
    _run([*tc, "class", "add", "dev", device, "parent", root, "classid", f"{major}:1", "htb",
          "rate", rate, "ceil", rate, *bursts])
    ack_rate = f"{rate_bits(rate) / 10:.0f}bit"
    for band, band_rate, priority in (("10", ack_rate, "0"), ("20", rate, "1")):
        _run([*tc, "class", "add", "dev", device, "parent", f"{major}:1", "classid",
              f"{major}:{band}", "htb", "rate", band_rate, "ceil", rate, "prio", priority,
              *bursts])
    _run([*tc, "qdisc", "add", "dev", device, "parent", f"{major}:20", "bfifo", "limit",
          queue])
    _run([*tc, "filter", "add", "dev", device, "parent", root, "protocol", "ip", "prio", "1",
          "u32", "match", "u16", "0x0000", "0xfe00", "at", "2", "flowid", f"{major}:10"])


def rate_bits(rate: str) -> float:
    """A tc rate ("1gbit", "100mbit", ...) in bits per second."""
    number, unit = RATE_PATTERN.match(rate).group(0, 2)
    scale = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9}[unit]
    return float(number[: -len(unit)]) * scale


def _check_netem() -> None:
    probe = Cluster(1, "1gbit", None, prefix=f"gk{os.getpid() % 100000}p")
    _run(["ip", "netns", "add", probe.namespace(0)])
    try:
        done = subprocess.run(["ip", "netns", "exec", probe.namespace(0), "tc", "qdisc", "add",
                               "dev", "lo", "root", "netem", "delay", "1ms"],
                              capture_output=True, text=True)
    finally:
        subprocess.run(["ip", "netns", "del", probe.namespace(0)], capture_output=True)
    if done.returncode != 0:
        raise ClusterError("--delay needs the kernel's netem queueing discipline (sch_netem), "
                           f"which this kernel lacks: {done.stderr.strip()}. Run without --delay "
                           "(rate shaping alone uses tbf).")


def _teardown(cluster: Cluster) -> None:
    for rank in range(cluster.workers):
        subprocess.run(["ip", "netns", "del", cluster.namespace(rank)], capture_output=True)
        subprocess.run(["ip", "link", "del", cluster.host_link(rank)], capture_output=True)
    subprocess.run(["ip", "link", "del", cluster.bridge], capture_output=True)


@contextmanager
def emulated_cluster(workers: int, rate: str = "1gbit", delay: str | None = None,
                     queue: str | None = None) -> Iterator[Cluster]:
    """Creates the cluster, yields it, and removes everything it created, whatever happens."""
    if workers < 1:
        raise ClusterError(f"--workers must be >= 1, got {workers}")
    if not RATE_PATTERN.match(rate):
        raise ClusterError(f"--rate {rate!r} is not a tc rate such as 1gbit or 100mbit")
    if delay and not DELAY_PATTERN.match(delay):
        raise ClusterError(f"--delay {delay!r} is not a delay such as 0.2ms or 50us")
    if queue and not QUEUE_PATTERN.match(queue):
        raise ClusterError(f"--queue {queue!r} is not a size such as 4mb or 512kb")
    if os.geteuid() != 0:
        raise ClusterError("network namespaces need root (or CAP_NET_ADMIN)")
    if delay:
        _check_netem()
    cluster = Cluster(workers, rate, delay)
    try:
        _ip("link", "add", cluster.bridge, "type", "bridge")
        _ip("addr", "add", f"10.213.{cluster.subnet}.254/24", "dev", cluster.bridge)
        _ip("link", "set", cluster.bridge, "up")
        for rank in range(workers):
            namespace, link = cluster.namespace(rank), cluster.host_link(rank)
            _ip("netns", "add", namespace)
            _ip("link", "add", link, "type", "veth", "peer", "name", "eth0", "netns", namespace)
            _ip("link", "set", link, "master", cluster.bridge, "up")
            _ip("-n", namespace, "addr", "add", f"{cluster.address(rank)}/24", "dev", "eth0")
            _ip("-n", namespace, "link", "set", "eth0", "up")
            _ip("-n", namespace, "link", "set", "lo", "up")
            _shape(namespace, "eth0", rate, delay, queue)  # what the rank sends
            _shape(None, link, rate, delay, queue)  # what the rank receives
        yield cluster
    finally:
        _teardown(cluster)


def mpirun_command(cluster: Cluster, command: Sequence[str]) -> list[str]:
    """mpirun over TCP between the namespaces; each rank enters its own namespace first."""
    enter = ('exec ip netns exec "$NS_PREFIX-$OMPI_COMM_WORLD_RANK" "$@"')
    return [
        "mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(cluster.workers),
        "--mca", "pml", "ob1", "--mca", "btl", "tcp,self", "--mca", "coll", "^sm,han",
        "--mca", "btl_tcp_if_include", cluster.network,
        "--mca", "oob_tcp_if_include", cluster.bridge,
        "-x", f"NS_PREFIX={cluster.prefix}", "-x", "OMP_NUM_THREADS=1", "-x", "PYTHONPATH",
        "-x", "TF_CPP_MIN_LOG_LEVEL=3",
        "sh", "-c", enter, "sh", *command,
    ]


def _without_launcher_variables(environment: dict[str, str]) -> dict[str, str]:
    """The environment without what an MPI launcher gave this process (e.g. a Python that
    imported mpi4py, an MPI singleton): inherited, those make mpirun's ranks join the wrong job.
    The user's own MCA settings (OMPI_MCA_*, PMIX_MCA_*) stay, except the launcher's."""
    def from_launcher(name: str) -> bool:
        if name.startswith(("OMPI_MCA_ess", "OMPI_MCA_orte_", "OMPI_MCA_pmix")):
            return True
        if name.startswith(("OMPI_MCA_", "PMIX_MCA_")):
            return False
        return name.startswith(("PMIX_", "ORTE_", "OMPI_", "PRTE_"))

    return {name: value for name, value in environment.items() if not from_launcher(name)}


def run_in_cluster(cluster: Cluster, command: Sequence[str], timeout_s: float) -> int:
    """Runs `command` on every rank; kills the whole job past timeout_s. Returns mpirun's exit
    status (124 on timeout)."""
    env = dict(_without_launcher_variables(os.environ),
               PMIX_MCA_ptl_tcp_if_include=cluster.bridge,
               PMIX_MCA_ptl_tcp_remote_connections="1",
               PYTHONPATH=os.pathsep.join(filter(None, [os.getcwd(),
                                                        os.environ.get("PYTHONPATH")])))
    process = subprocess.Popen(mpirun_command(cluster, command), env=env,
                               start_new_session=True)
    try:
        return process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        print(f"emulated_cluster: the command ran past {timeout_s} s; killing it",
              file=sys.stderr, flush=True)
        return 124
    finally:
        stop_mpirun(process)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=4, help="MPI ranks, one per namespace")
    parser.add_argument("--rate", default="1gbit", help="each link's rate, each way (tc units)")
    parser.add_argument("--delay", default=None,
                        help="one-way added latency per link, e.g. 0.1ms (needs sch_netem)")
    parser.add_argument("--queue", default=None,
                        help="each link's buffer in bytes, e.g. 4mb, and acknowledgements "
                             "first (default: one token bucket holding 100 ms at --rate)")
    parser.add_argument("--timeout", type=float, default=900, help="seconds before the job is "
                        "killed and everything torn down")
    parser.add_argument("command", nargs=argparse.REMAINDER,
                        help="-- then the command every rank runs")
    args = parser.parse_args(argv)
    if args.command[:1] == ["--"]:
        args.command = args.command[1:]
    if not args.command:
        parser.error("give the command every rank runs after --")
    return args


def _raise_on_signal(number: int, _frame: object) -> None:
    raise SystemExit(128 + number)  # unwinds through emulated_cluster's teardown


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _raise_on_signal)
    try:
        with emulated_cluster(args.workers, args.rate, args.delay, args.queue) as cluster:
            print(f"emulated_cluster: {args.workers} workers in namespaces {cluster.prefix}-*, "
                  f"links {args.rate} each way, added delay {args.delay or 'none'}, queue "
                  f"{args.queue or '100 ms'}", flush=True)
            status = run_in_cluster(cluster, args.command, args.timeout)
            for rank, (sent, received) in enumerate(cluster.link_bytes()):
                print(f"emulated_cluster: rank {rank} link sent {sent:,} B, received "
                      f"{received:,} B", flush=True)
    except ClusterError as error:
        print(f"emulated_cluster: {error}", file=sys.stderr)
        return 2
    return status


if __name__ == "__main__":
    sys.exit(main())
