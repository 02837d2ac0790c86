"""A real Slurm over the lab's hosts (``dmlctl lab up --slurm``): munge for its
authentication, ``slurmctld`` in the root namespace on the bridge's address, and one
``slurmd`` per lab namespace (node ``lab-<i>`` at the host's address), all with a
configuration of their own under ``<lab dir>/slurm`` and ports of their own, so that
a Slurm of this machine, if any, is left alone. Debian/Ubuntu packages: slurmctld,
slurmd, slurm-client, munge.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from dmlctl.lab.net import LabError, address, gateway, namespace, run
from dmlctl.slurm.commands import run as slurm_command

CTLD_PORT = 6917
SLURMD_PORT = 6918
"""Not Slurm's own 6817/6818, which a Slurm installed on this machine may hold."""
PARTITION = "lab"
URGENT = "urgent"
"""A partition over the same nodes whose jobs preempt (cancel) the lab partition's:
how a test meets a preemption."""
READY_TIMEOUT_S = 30.0
MUNGE_SOCKET_DIR = Path("/run/munge")
MUNGE_KEY = Path("/etc/munge/munge.key")
TOOLS = ("slurmctld", "slurmd", "sbatch", "srun", "squeue", "scontrol", "sinfo", "munged")


def require_tools() -> None:
    """LabError naming what is missing for a Slurm lab."""
    missing = [t for t in TOOLS if shutil.which(t) is None and not Path("/usr/sbin", t).exists()]
    if missing:
        raise LabError(
            f"dmlctl lab up --slurm needs {', '.join(missing)}: "
            "apt-get install -y slurmctld slurmd slurm-client munge"
        )


def slurm_dir(lab_dir: Path) -> Path:
    return lab_dir / "slurm"


def conf_path(lab_dir: Path) -> Path:
    return slurm_dir(lab_dir) / "slurm.conf"


def node_name(i: int) -> str:
    return f"lab-{i}"


def write_conf(lab_dir: Path, n: int, cpus: int) -> Path:
    """The lab's ``slurm.conf``: partition ``lab`` of ``n`` nodes of ``cpus`` CPUs
    each and partition ``urgent`` over the same nodes, whose jobs preempt lab's;
    processes tracked by their parent (no cgroups needed), no accounting."""
    d = slurm_dir(lab_dir)
    for sub in ("ctld", *(node_name(i) for i in range(n))):
        (d / sub).mkdir(parents=True, exist_ok=True)
    nodes = "\n".join(
        f"NodeName={node_name(i)} NodeHostname={node_name(i)} NodeAddr={address(i)} "
        f"CPUs={cpus} State=UNKNOWN"
        for i in range(n)
    )
    text = _CONF.format(
        host=socket.gethostname().split(".")[0],
        gateway=gateway(),
        ctld=CTLD_PORT,
        slurmd=SLURMD_PORT,
        dir=d,
        nodes=nodes,
        partition=PARTITION,
        urgent=URGENT,
        names=",".join(node_name(i) for i in range(n)),
    )
    path = conf_path(lab_dir)
    path.write_text(text, encoding="utf-8")
    return path


_CONF = """# dmlctl lab: a Slurm over the lab's network namespaces (`dmlctl lab down` removes it)
ClusterName=dmlctl-lab
SlurmctldHost={host}({gateway})
SlurmctldPort={ctld}
SlurmdPort={slurmd}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation={dir}/ctld
SlurmctldPidFile={dir}/ctld/slurmctld.pid
SlurmctldLogFile={dir}/ctld/slurmctld.log
SlurmdSpoolDir={dir}/%n
SlurmdPidFile={dir}/%n/slurmd.pid
SlurmdLogFile={dir}/%n/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
SchedulerType=sched/backfill
PreemptType=preempt/partition_prio
PreemptMode=CANCEL
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
SlurmdParameters=config_overrides
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
KillWait=5
MinJobAge=600
{nodes}
PartitionName={partition} Nodes={names} Default=YES MaxTime=INFINITE State=UP PriorityTier=1
PartitionName={urgent} Nodes={names} MaxTime=INFINITE State=UP PriorityTier=10
"""


def start_munge(lab_dir: Path) -> bool:
    """A munge daemon that answers: this machine's when one runs, else one started
    here as the ``munge`` user (key made first where there is none). True when it was
    started here (``down`` stops it then)."""
    if _munge_answers():
        return False
    if not MUNGE_KEY.exists():
        run("mungekey", "-c", "-k", str(MUNGE_KEY))
        shutil.chown(MUNGE_KEY, "munge", "munge")
    MUNGE_SOCKET_DIR.mkdir(parents=True, exist_ok=True)
    shutil.chown(MUNGE_SOCKET_DIR, "munge", "munge")
    run("runuser", "-u", "munge", "--", _sbin("munged"))
    deadline = time.monotonic() + 10
    while not _munge_answers():
        if time.monotonic() > deadline:
            raise LabError("munged started but does not answer (`munge -n | unmunge`)")
        time.sleep(0.1)
    (slurm_dir(lab_dir) / "munged.ours").write_text("started by dmlctl lab\n")
    return True


def start(lab_dir: Path, n: int) -> Path:
    """munge, slurmctld and a slurmd per lab host, waited for until every node is idle;
    the configuration's path. LabError (with the daemon's log line) when one fails."""
    conf = write_conf(lab_dir, n, os.cpu_count() or 1)
    start_munge(lab_dir)
    run(_sbin("slurmctld"), "-f", str(conf))
    for i in range(n):
        netns = f"--net=/var/run/netns/{namespace(i)}"
        run("nsenter", netns, _sbin("slurmd"), "-N", node_name(i), "-f", str(conf))
    wait_idle(conf, n)
    return conf


def wait_idle(conf: Path, n: int) -> None:
    """Wait until ``sinfo`` shows all ``n`` nodes idle; LabError after
    :data:`READY_TIMEOUT_S` with what it shows then."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    shown = ""
    while time.monotonic() < deadline:
        proc = slurm_command(["sinfo", "-h", "-N", "-o", "%N %T"], str(conf), check=False)
        # one line per node and partition: a node of both partitions is listed twice
        states = dict(line.split()[:2] for line in proc.stdout.splitlines() if line.strip())
        shown = ", ".join(f"{k} {v}" for k, v in states.items()) or proc.stderr.strip()
        if len(states) == n and all(s == "idle" for s in states.values()):
            return
        time.sleep(0.2)
    raise LabError(f"Slurm nodes not idle after {READY_TIMEOUT_S:g} s: {shown or 'no answer'}")


def stop(lab_dir: Path) -> list[str]:
    """Stop slurmctld and a munged the lab started (the slurmds go with their
    namespaces); what was stopped, in words."""
    stopped = []
    pid_file = slurm_dir(lab_dir) / "ctld" / "slurmctld.pid"
    if _kill_pid_file(pid_file):
        stopped.append("slurmctld")
    ours = (slurm_dir(lab_dir) / "munged.ours").exists()
    if ours and _kill_pid_file(MUNGE_SOCKET_DIR / "munged.pid"):
        stopped.append("munged")
    return stopped


def _kill_pid_file(path: Path) -> bool:
    try:
        pid = int(path.read_text().strip())
    except (OSError, ValueError):
        return False
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
        return True
    return False


def _munge_answers() -> bool:
    if shutil.which("munge") is None:
        return False
    made = subprocess.run(["munge", "-n"], capture_output=True, timeout=10)
    if made.returncode != 0:
        return False
    back = subprocess.run(["unmunge"], input=made.stdout, capture_output=True, timeout=10)
    return back.returncode == 0


def _sbin(tool: str) -> str:
    return shutil.which(tool) or str(Path("/usr/sbin", tool))
