"""``dmlctl lab up``, ``down`` and ``status``: a bandwidth-limited network of SSH
hosts on this machine (:mod:`dmlctl.lab`). Parse → call → say what was done; the
library is imported inside the commands so ``dmlctl --help`` stays fast."""

from __future__ import annotations

from typing import Optional

import typer

from dmlctl.cli.common import stderr_console, stdout_console

app = typer.Typer(
    help="A bandwidth-limited lab network on this machine: SSH hosts in network "
    "namespaces, their links shaped with tc (root).",
    no_args_is_help=True,
)


@app.command()
def up(
    hosts: int = typer.Option(4, "--hosts", help="Hosts (network namespaces) in the lab."),
    bandwidth: str = typer.Option(
        "100mbit", "--bandwidth", help="Every host's link, each way: 100mbit, 1gbit, 500kbit."
    ),
    latency: Optional[str] = typer.Option(  # noqa: UP045 - typer needs Optional
        None, "--latency", help="Added delay each way, e.g. 5ms (needs the kernel's netem)."
    ),
    slots: int = typer.Option(1, "--slots", help="Worker slots per host in the cluster file."),
    force: bool = typer.Option(
        False, "--force", help="Replace a lab made from another DMLCTL_HOME (its runs are cut off)."
    ),
    slurm: bool = typer.Option(
        False,
        "--slurm",
        help="Also run a real Slurm over the hosts (munge, slurmctld, a slurmd per host; "
        "packages slurmctld, slurmd, slurm-client, munge) and write its cluster file, "
        "slurm.yaml.",
    ),
) -> int:
    """Make the lab (removing a previous one first) and write its cluster file."""
    from dmlctl.lab import up as lab_up
    from dmlctl.lab.rates import parse_bandwidth, parse_latency

    bits = parse_bandwidth(bandwidth)
    delay = None if latency is None else parse_latency(latency)
    if slots < 1:
        raise typer.BadParameter("must be at least 1", param_hint="--slots")
    err = stderr_console()
    with err.status("making the lab…") as status:
        cluster = lab_up(
            hosts,
            bits,
            delay,
            slots=slots,
            force=force,
            slurm=slurm,
            progress=lambda m: status.update(m),
        )
    what = f"{hosts} hosts at {bandwidth} each way" + (f", {latency} delay" if latency else "")
    what += ", Slurm over them (partition lab)" if slurm else ""
    out = stdout_console()
    out.print(f"lab up: {what}; cluster file {cluster}", markup=False)
    out.print(f"next: dmlctl launch job.yaml --cluster {cluster}", markup=False)
    return 0


@app.command()
def down() -> int:
    """Remove the lab: its processes, namespaces, links, known_hosts entries, files."""
    from dmlctl.lab import down as lab_down

    removed = lab_down()
    out = stdout_console()
    if not removed:
        out.print("no lab to remove", markup=False)
    for item in removed:
        out.print(f"removed {item}", markup=False)
    return 0


@app.command()
def status() -> int:
    """The lab's hosts, addresses and bandwidth, and whether each sshd answers."""
    from dmlctl.lab import default_dir
    from dmlctl.lab import status as lab_status

    record, answering = lab_status()
    out = stdout_console()
    if record is None:
        out.print("no lab (dmlctl lab up makes one)", markup=False)
        return 0
    delay = f", {record.latency_ms:g} ms delay" if record.latency_ms else ""
    out.print(f"lab: {len(record.hosts)} hosts at {record.bandwidth} each way{delay}", markup=False)
    for host, ok in zip(record.hosts, answering, strict=True):
        state = "sshd answers" if ok else "sshd DOES NOT ANSWER"
        out.print(f"  {host.name}  {host.address}  {host.namespace}  {state}", markup=False)
    out.print(f"cluster file: {default_dir() / 'cluster.yaml'}", markup=False)
    return 0 if all(answering) else 1
