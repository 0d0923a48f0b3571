"""A one-node SLURM cluster on localhost, from Debian's slurm-wlm and munge, for the tests of the workflow on SLURM.

`start_cluster` writes a slurm.conf into a fresh temporary folder (state, spool, logs and pid files there too),
links it to /etc/slurm/slurm.conf (the executor plugin removes SLURM_CONF from a job's environment before the job's
inner `srun`, which then reads the default path; an existing file is moved aside and put back by `stop`), starts
its own munged (own socket, named in the config through AuthInfo), `slurmctld -D` and `slurmd -D -N localhost`, and
waits until `sinfo` shows the node idle. `Cluster.stop` cancels what is left, stops the three daemons by pid and
restores /etc/slurm/slurm.conf.

Choices (see the module's `slurm_conf`):
- proctrack/linuxproc and task/none: no cgroups needed, so it runs in a container; select/cons_tres with CR_Core
  (so `--gpus` and `--cpus-per-gpu` are scheduled; memory is checked against the node but not consumed).
- GPUs: a GRES `gpu` whose `File`s are character devices made here with mknod (copies of /dev/null). Slurm 22.05
  drops a file-less GPU GRES ("Removing file-less GPU"), so `Count` alone is not enough; with the devices SLURM
  really allocates them: a `--gpus=1` job waits for a free one and gets CUDA_VISIBLE_DEVICES set.
- The node declares the CPUs the profile's GPU jobs ask for (`SlurmdParameters=config_overrides` lets it declare
  more than the machine has): the test runs `--profile profiles/slurm` unchanged.
- No accounting database (no slurmdbd, no MariaDB): the executor plugin reads job states with `squeue`, and the
  tests read every job (state, partition, time limit, comment = rule and wildcards, GPUs, exit code) with
  `scontrol show job`. Both see a finished job for MinJobAge seconds: 3600 s here, longer than a test session
  (the plugin needs at least 120 s).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

SLURM_CONF = Path("/etc/slurm/slurm.conf")
DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "squeue", "sinfo", "scancel", "scontrol", "srun")
PACKAGES = ("slurm-wlm", "munge")


class Unavailable(Exception):
    """SLURM cannot be installed or started here; the message says why (the tests skip with it)."""


def _which(name: str) -> str | None:
    return shutil.which(name) or next((str(p) for d in ("/usr/sbin", "/sbin") if (p := Path(d) / name).exists()), None)


def ensure_installed() -> None:
    """Install slurm-wlm and munge with apt-get when missing and we are root; raise Unavailable otherwise."""
    missing = [n for n in (*DAEMONS, *CLIENTS) if not _which(n)]
    if not missing:
        return
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        raise Unavailable(
            f"SLURM is not installed ({', '.join(missing)} missing) and cannot be installed here "
            f"(needs root and apt-get): apt-get install {' '.join(PACKAGES)}"
        )
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", *PACKAGES]):
        try:
            result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
        except subprocess.TimeoutExpired:
            raise Unavailable(f"`{' '.join(cmd)}` timed out") from None
        if result.returncode != 0:
            raise Unavailable(f"`{' '.join(cmd)}` failed: {(result.stderr or result.stdout)[-500:]}")
    missing = [n for n in (*DAEMONS, *CLIENTS) if not _which(n)]
    if missing:
        raise Unavailable(f"installed {' '.join(PACKAGES)} but {', '.join(missing)} still missing")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _memory_mb() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) // 1024
    return 4096


def _fake_gpu_devices(folder: Path, count: int) -> str:
    """`count` character devices (copies of /dev/null) as the GPUs' `File`s; returns the gres.conf File= value."""
    folder.mkdir()
    for i in range(count):
        try:
            os.mknod(folder / f"gpu{i}", 0o666 | 0o020000, os.makedev(1, 3))
        except OSError as err:
            message = f"cannot make the fake GPU devices (mknod: {err}); a GPU GRES needs device files"
            raise Unavailable(message) from err
    return f"{folder}/gpu[0-{count - 1}]" if count > 1 else f"{folder}/gpu0"


@dataclass
class Cluster:
    root: Path
    partitions: tuple[str, ...]
    cpus: int
    gpus: int
    env: dict  # environment for SLURM clients (SLURM_CONF set)
    _procs: dict = field(default_factory=dict)  # name -> Popen of the daemons started here
    _conf_backup: Path | None = None

    def run(self, *cmd: str, timeout: float = 30) -> subprocess.CompletedProcess:
        return subprocess.run(cmd, env=self.env, capture_output=True, text=True, timeout=timeout)

    def jobs(self) -> list[dict]:
        """Every job the controller knows (all of this session's, see MinJobAge), oldest first, as the fields of
        `scontrol -d show job` (JobId, JobName, JobState, Partition, TimeLimit, Comment, NumCPUs, TresPerJob,
        JOB_GRES: the GRES allocated, ExitCode, StartTime, ...)."""
        out = self.run("scontrol", "--details", "show", "job", "--oneliner").stdout
        jobs = [dict(re.findall(r"(\w+)=(\S*)", line)) for line in out.splitlines() if line.startswith("JobId=")]
        return sorted(jobs, key=lambda job: int(job["JobId"]))

    def queue(self) -> dict[str, str]:
        """Job id -> state of every job squeue still knows (pending, running and recently finished)."""
        out = self.run("squeue", "--states=all", "--noheader", "--format=%i|%T").stdout
        return dict(line.split("|", 1) for line in out.split())

    def log(self, daemon: str) -> str:
        path = self.root / "log" / f"{daemon}.log"
        return path.read_text(errors="replace")[-3000:] if path.exists() else ""

    def stop(self) -> None:
        """Cancel what is left, stop the daemons started here (by pid) and restore /etc/slurm/slurm.conf."""
        try:
            if "slurmctld" in self._procs and self._procs["slurmctld"].poll() is None:
                self.run("scancel", "--full", "--user", "root", timeout=15)
                deadline = time.time() + 20
                while time.time() < deadline and any(
                    s in ("RUNNING", "COMPLETING", "PENDING") for s in self.queue().values()
                ):
                    time.sleep(0.5)
        except (subprocess.SubprocessError, OSError, ValueError):
            pass
        finally:
            for name in ("slurmd", "slurmctld", "munged"):
                proc = self._procs.pop(name, None)
                if proc is not None and proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
                    try:
                        proc.wait(timeout=15)
                    except subprocess.TimeoutExpired:
                        proc.kill()
                        proc.wait()
            self._restore_conf()
            shutil.rmtree(self.root, ignore_errors=True)

    def _restore_conf(self) -> None:
        if SLURM_CONF.is_symlink() and os.readlink(SLURM_CONF) == str(self.root / "slurm.conf"):
            SLURM_CONF.unlink()
        if self._conf_backup is not None and os.path.lexists(self._conf_backup):
            self._conf_backup.rename(SLURM_CONF)
            self._conf_backup = None


def slurm_conf(
    root: Path,
    *,
    partitions: tuple[str, ...],
    cpus: int,
    gpus: int,
    memory_mb: int,
    munge_socket: Path,
    ports: tuple[int, int],
    min_job_age: int,
) -> str:
    default, *others = partitions
    lines = [
        "ClusterName=kdpipe-test",
        "SlurmctldHost=localhost",
        f"SlurmctldPort={ports[0]}",
        f"SlurmdPort={ports[1]}",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={munge_socket}",
        "MpiDefault=none",
        "MailProg=/bin/true",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "SlurmdParameters=config_overrides",
        "GresTypes=gpu",
        "AccountingStorageType=accounting_storage/none",
        "JobAcctGatherType=jobacct_gather/none",
        f"MinJobAge={min_job_age}",
        "ReturnToService=2",
        "SchedulerType=sched/backfill",
        f"StateSaveLocation={root}/state",
        f"SlurmdSpoolDir={root}/spool",
        f"SlurmctldLogFile={root}/log/slurmctld.log",
        f"SlurmdLogFile={root}/log/slurmd.log",
        f"SlurmctldPidFile={root}/run/slurmctld.pid",
        f"SlurmdPidFile={root}/run/slurmd.pid",
        f"NodeName=localhost CPUs={cpus} RealMemory={memory_mb} Gres=gpu:{gpus} State=UNKNOWN",
        f"PartitionName={default} Nodes=localhost Default=YES MaxTime=INFINITE State=UP",
        *(f"PartitionName={p} Nodes=localhost MaxTime=INFINITE State=UP" for p in others),
    ]
    return "\n".join(lines) + "\n"


def start_cluster(
    partitions: tuple[str, ...],
    *,
    cpus: int,
    gpus: int = 2,
    min_job_age: int = 3600,
    memory_mb: int | None = None,
    timeout: float = 60,
) -> Cluster:
    """Bring up the cluster (see the module docstring); raise Unavailable, with the reason, when it cannot."""
    ensure_installed()
    if os.geteuid() != 0:
        raise Unavailable("starting slurmctld/slurmd (SlurmUser=root) and writing /etc/slurm/slurm.conf needs root")
    if subprocess.run(["pgrep", "-x", "slurmctld|slurmd"], capture_output=True).returncode == 0:
        raise Unavailable("a slurmctld or slurmd already runs on this machine; not touching a real cluster")
    key = Path("/etc/munge/munge.key")
    if not key.exists():
        raise Unavailable(f"{key} is missing (munge's package creates it; try `mungekey --create`)")

    root = Path(tempfile.mkdtemp(prefix="kdpipe-slurm-"))
    root.chmod(0o755)  # munged runs as user munge and needs to reach its folder
    for sub in ("state", "spool", "log", "run"):
        (root / sub).mkdir()
    munge_dir = root / "munge"
    munge_dir.mkdir(mode=0o755)  # munged wants its socket folder searchable by all
    shutil.chown(munge_dir, "munge", "munge")
    munge_socket = munge_dir / "munge.socket"
    gres_file = _fake_gpu_devices(root / "dev", gpus)
    (root / "gres.conf").write_text(f"Name=gpu File={gres_file}\n")
    memory = memory_mb or max(_memory_mb(), 16000)  # not consumable (CR_Core), only the per-job ceiling
    (root / "slurm.conf").write_text(
        slurm_conf(
            root,
            partitions=partitions,
            cpus=cpus,
            gpus=gpus,
            memory_mb=memory,
            munge_socket=munge_socket,
            ports=(_free_port(), _free_port()),
            min_job_age=min_job_age,
        )
    )
    env = {**os.environ, "SLURM_CONF": str(root / "slurm.conf")}
    cluster = Cluster(root=root, partitions=partitions, cpus=cpus, gpus=gpus, env=env)
    try:
        SLURM_CONF.parent.mkdir(parents=True, exist_ok=True)
        if SLURM_CONF.exists() or SLURM_CONF.is_symlink():
            cluster._conf_backup = SLURM_CONF.with_name(f"slurm.conf.kdpipe-test-{os.getpid()}")
            SLURM_CONF.rename(cluster._conf_backup)
        SLURM_CONF.symlink_to(root / "slurm.conf")

        def daemon(name, cmd, **kw):
            log = open(root / "log" / f"{name}.out", "w")  # noqa: SIM115 (the daemon keeps it open)
            cluster._procs[name] = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True, **kw
            )
            log.close()

        daemon(
            "munged",
            [
                _which("munged"),
                "--foreground",
                f"--socket={munge_socket}",
                f"--pid-file={munge_dir}/munged.pid",
                f"--log-file={munge_dir}/munged.log",
                f"--seed-file={munge_dir}/munged.seed",
                f"--key-file={key}",
            ],
            user="munge",
            group="munge",
            extra_groups=[],
        )
        _wait(lambda: munge_socket.exists(), 10, "munged did not create its socket", cluster, "munged")
        daemon("slurmctld", [_which("slurmctld"), "-D", "-f", str(root / "slurm.conf")])
        _wait(
            lambda: cluster.run("scontrol", "ping").returncode == 0 and "UP" in cluster.run("scontrol", "ping").stdout,
            timeout,
            "slurmctld did not answer",
            cluster,
            "slurmctld",
        )
        daemon("slurmd", [_which("slurmd"), "-D", "-N", "localhost", "-f", str(root / "slurm.conf")])
        _wait(
            lambda: (
                cluster.run("sinfo", "--noheader", "--format=%t").stdout.split()
                and all(s == "idle" for s in cluster.run("sinfo", "--noheader", "--format=%t").stdout.split())
            ),
            timeout,
            "the node did not become idle",
            cluster,
            "slurmd",
        )
    except BaseException:
        cluster.stop()
        raise
    return cluster


def _wait(ready, timeout: float, what: str, cluster: Cluster, daemon: str) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        proc = cluster._procs.get(daemon)
        if proc is not None and proc.poll() is not None:
            break
        try:
            if ready():
                return
        except (subprocess.SubprocessError, OSError):
            pass
        time.sleep(0.3)
    out = cluster.root / "log" / f"{daemon}.out"
    detail = (out.read_text(errors="replace")[-1500:] if out.exists() else "") + cluster.log(daemon)[-1500:]
    raise Unavailable(f"{what} within {timeout:.0f} s:\n{detail}")
