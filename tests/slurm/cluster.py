"""A real one-node Slurm cluster on localhost for the tests: munge, MariaDB, slurmdbd, slurmctld, slurmd.

Debian's packages (slurmctld, slurmd, slurmdbd, slurm-client, munge, mariadb-server), started as root
with every file, socket and port private to one folder, so it never touches a system's own Slurm or
munge and two test runs on one machine do not meet. The node is declared with more CPUs, memory and
(fake) GPUs than the machine has (``SlurmdParameters=config_overrides``): the GPUs are empty files
named in gres.conf, enough for Slurm to grant them and set CUDA_VISIBLE_DEVICES / SLURM_JOB_GPUS.

    python tests/slurm/cluster.py up /tmp/tpslurm     # start; prints the environment to export
    python tests/slurm/cluster.py down /tmp/tpslurm   # stop

Containers rarely have usable cgroups: processes are tracked by /proc (proctrack/linuxproc) and tasks
are not bound (task/none). Accounting is complete (slurmdbd + MariaDB): the executor plugin asks
``sacct`` for job states.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

DAEMONS = {"munged": "/usr/sbin/munged", "mariadbd": "/usr/sbin/mariadbd", "slurmdbd": "/usr/sbin/slurmdbd",
           "slurmctld": "/usr/sbin/slurmctld", "slurmd": "/usr/sbin/slurmd"}
CLIENTS = ("sbatch", "srun", "sacct", "sacctmgr", "scontrol", "sinfo", "squeue", "scancel", "mariadb-install-db",
           "mariadb")
PACKAGES = "slurmctld slurmd slurmdbd slurm-client munge mariadb-server"
CLUSTER, ACCOUNT, NODE = "tptune", "tptune", "tpnode1"


class ClusterError(RuntimeError):
    pass


def missing_tools() -> list[str]:
    return [p for p in DAEMONS.values() if not os.access(p, os.X_OK)] + [c for c in CLIENTS if not shutil.which(c)]


def _free_ports(n: int) -> list[int]:
    socks, ports = [], []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
        ports.append(s.getsockname()[1])
    for s in socks:
        s.close()
    return ports


class LocalSlurm:
    def __init__(self, root: str | Path, cpus: int = 32, mem_mb: int = 256000, gpus: int = 8,
                 partitions: tuple[str, ...] = ("cpu", "gpu")):
        self.root = Path(root).resolve()
        self.cpus, self.mem_mb, self.gpus, self.partitions = cpus, mem_mb, gpus, partitions
        self.etc, self.log, self.run = self.root / "etc", self.root / "log", self.root / "run"
        self.state_file = self.root / "cluster.json"
        self.pids: dict[str, int] = {}
        self.procs: dict[str, subprocess.Popen] = {}
        self.ports: dict[str, int] = {}

    # -- environment for clients ----------------------------------------------------------------
    @property
    def conf(self) -> Path:
        return self.etc / "slurm.conf"

    def env(self, base: dict | None = None) -> dict:
        env = dict(os.environ if base is None else base)
        env["SLURM_CONF"] = str(self.conf)
        for k in [k for k in env if k.startswith(("SLURM_", "SBATCH_", "SRUN_")) and k != "SLURM_CONF"]:
            env.pop(k)
        return env

    def client(self, *cmd: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
        res = subprocess.run(list(cmd), env=self.env(), capture_output=True, text=True, timeout=timeout)
        if check and res.returncode != 0:
            raise ClusterError(f"{' '.join(cmd)} failed ({res.returncode}): {res.stdout}{res.stderr}\n"
                               + self.logs())
        return res

    # -- configuration ------------------------------------------------------------------------
    def _write_configs(self) -> None:
        for d in (self.etc, self.log, self.run, self.root / "state", self.root / "spool" / NODE, self.root / "db",
                  self.root / "munge", self.root / "dev"):
            d.mkdir(parents=True, exist_ok=True)
        (self.root / "munge").chmod(0o700)
        p = self.ports = dict(zip(("ctld", "slurmd", "dbd", "db"), _free_ports(4)))
        munge_sock = self.run / "munge.sock"
        auth = f"AuthType=auth/munge\nAuthInfo=socket={munge_sock}\n"
        gpu_files = []
        for i in range(self.gpus):  # stand-ins for /dev/nvidiaN: character devices (links to /dev/null)
            f = self.root / "dev" / f"nvidia{i}"
            f.unlink(missing_ok=True)
            f.symlink_to("/dev/null")
            gpu_files.append(f)
        parts = "\n".join(f"PartitionName={name} Nodes={NODE} Default={'YES' if i == 0 else 'NO'} "
                          f"MaxTime=INFINITE State=UP OverSubscribe=NO" for i, name in enumerate(self.partitions))
        self.conf.write_text(f"""# written by tests/slurm/cluster.py: a one-node cluster on localhost
ClusterName={CLUSTER}
SlurmctldHost={socket.gethostname()}(127.0.0.1)
SlurmctldPort={p['ctld']}
SlurmdPort={p['slurmd']}
SlurmUser=root
SlurmdUser=root
{auth}CredType=cred/munge
StateSaveLocation={self.root / 'state'}
SlurmdSpoolDir={self.root / 'spool'}/%n
SlurmctldPidFile={self.run / 'slurmctld.pid'}
SlurmdPidFile={self.run / 'slurmd.pid'}
SlurmctldLogFile={self.log / 'slurmctld.log'}
SlurmdLogFile={self.log / 'slurmd.log'}
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=30
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort={p['dbd']}
AccountingStoragePass={munge_sock}
AccountingStorageTRES=gres/gpu
AccountingStoreFlags=job_comment
JobCompType=jobcomp/none
MpiDefault=none
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
GresTypes=gpu
SlurmdParameters=config_overrides
ReturnToService=2
MinJobAge=600
KillWait=5
InactiveLimit=0
SlurmctldTimeout=30
SlurmdTimeout=60
MessageTimeout=30
NodeName={NODE} NodeAddr=127.0.0.1 NodeHostname={socket.gethostname()} CPUs={self.cpus} RealMemory={self.mem_mb} Gres=gpu:{self.gpus} State=UNKNOWN
{parts}
""")
        (self.etc / "gres.conf").write_text(
            f"AutoDetect=off\nNodeName={NODE} Name=gpu File={self.root / 'dev'}/nvidia[0-{self.gpus - 1}]\n")
        (self.etc / "cgroup.conf").write_text("# no cgroups here: proctrack/linuxproc and task/none\n")
        dbd = self.etc / "slurmdbd.conf"
        dbd.write_text(f"""{auth}DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort={p['dbd']}
SlurmUser=root
DebugLevel=info
LogFile={self.log / 'slurmdbd.log'}
PidFile={self.run / 'slurmdbd.pid'}
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort={p['db']}
StorageUser=slurm
StoragePass=slurm
StorageLoc=slurm_acct_db
""")
        dbd.chmod(0o600)

    # -- daemons ------------------------------------------------------------------------------
    def _spawn(self, name: str, cmd: list[str], log: Path) -> None:
        fh = open(log, "ab")
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=self.env(), start_new_session=True)
        self.procs[name] = proc
        self.pids[name] = proc.pid
        self._save()

    def _save(self) -> None:
        self.state_file.write_text(json.dumps({"pids": self.pids, "ports": self.ports}))

    def _wait(self, what: str, ok, daemon: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            proc = self.procs.get(daemon)
            if proc is not None and proc.poll() is not None:
                raise ClusterError(f"{daemon} exited ({proc.returncode}) while waiting for {what}\n" + self.logs())
            try:
                if ok():
                    return
            except (OSError, subprocess.SubprocessError):
                pass
            time.sleep(0.5)
        raise ClusterError(f"timed out after {timeout:.0f}s waiting for {what}\n" + self.logs())

    def _port_open(self, port: int) -> bool:
        with socket.socket() as s:
            s.settimeout(0.5)
            return s.connect_ex(("127.0.0.1", port)) == 0

    def _sql(self, sql: str) -> subprocess.CompletedProcess:
        return subprocess.run(["mariadb", "--no-defaults", "-S", str(self.run / "mysqld.sock"), "-u", "root",
                               "-e", sql], capture_output=True, text=True, timeout=30)

    def start(self) -> "LocalSlurm":
        if os.geteuid() != 0:
            raise ClusterError("the local Slurm cluster is started as root (slurmd must run as root)")
        if self.state_file.exists() and any(_alive(pid) for pid in
                                            json.loads(self.state_file.read_text())["pids"].values()):
            raise ClusterError(f"a cluster from {self.root} is still running: stop it first")
        missing = missing_tools()
        if missing:
            raise ClusterError(f"missing: {', '.join(missing)}; install with `apt-get install -y {PACKAGES}` "
                               "(or: bash scripts/ci_slurm_setup.sh)")
        self._write_configs()
        # munge: a private key and socket
        key = self.root / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        self._spawn("munged", [DAEMONS["munged"], "-F", "--force", f"--socket={self.run / 'munge.sock'}",
                               f"--key-file={key}", f"--pid-file={self.run / 'munged.pid'}",
                               f"--log-file={self.log / 'munged.log'}", f"--seed-file={self.root / 'munge' / 'seed'}"],
                    self.log / "munged.out")
        self._wait("munge socket", lambda: (self.run / "munge.sock").exists(), "munged", 30)
        # MariaDB for slurmdbd
        datadir = self.root / "db"
        if not (datadir / "mysql").exists():
            res = subprocess.run(["mariadb-install-db", "--no-defaults", f"--datadir={datadir}", "--user=root",
                                  "--auth-root-authentication-method=socket", "--skip-test-db"],
                                 capture_output=True, text=True, timeout=300)
            if res.returncode != 0:
                raise ClusterError(f"mariadb-install-db failed: {res.stdout}{res.stderr}")
        self._spawn("mariadbd", [DAEMONS["mariadbd"], "--no-defaults", f"--datadir={datadir}", "--user=root",
                                 f"--socket={self.run / 'mysqld.sock'}", f"--port={self.ports['db']}",
                                 "--bind-address=127.0.0.1", f"--pid-file={self.run / 'mysqld.pid'}",
                                 f"--log-error={self.log / 'mariadb.log'}", "--innodb-buffer-pool-size=64M",
                                 "--skip-name-resolve", "--innodb-lock-wait-timeout=900"],
                    self.log / "mariadb.out")
        self._wait("MariaDB", lambda: self._sql("SELECT 1").returncode == 0, "mariadbd", 120)
        res = self._sql("CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY 'slurm'; "
                        "CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY 'slurm'; "
                        "GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1'; "
                        "GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost'; FLUSH PRIVILEGES;")
        if res.returncode != 0:
            raise ClusterError(f"MariaDB user setup failed: {res.stderr}\n" + self.logs())
        # accounting daemon, then the cluster and an account registered as a site does
        self._spawn("slurmdbd", [DAEMONS["slurmdbd"], "-D"],
                    self.log / "slurmdbd.out")
        self._wait("slurmdbd", lambda: self._port_open(self.ports["dbd"]), "slurmdbd", 120)
        self._wait("sacctmgr", lambda: self.client("sacctmgr", "-n", "list", "cluster", check=False).returncode == 0,
                   "slurmdbd", 60)
        self.client("sacctmgr", "-i", "add", "cluster", CLUSTER, check=False)
        self.client("sacctmgr", "-i", "add", "account", ACCOUNT, f"cluster={CLUSTER}",
                    "description=tptune tests", "organization=tptune", check=False)
        user = os.environ.get("USER") or "root"
        for u in {user, "root"}:
            self.client("sacctmgr", "-i", "add", "user", u, f"account={ACCOUNT}", f"defaultaccount={ACCOUNT}",
                        f"cluster={CLUSTER}", check=False)
        assoc = self.client("sacctmgr", "-n", "-P", "list", "assoc", f"cluster={CLUSTER}", "format=account,user").stdout
        if f"{ACCOUNT}|root" not in assoc:
            raise ClusterError(f"account registration failed: {assoc!r}\n" + self.logs())
        # controller and node
        self._spawn("slurmctld", [DAEMONS["slurmctld"], "-D", "-i", "-f", str(self.conf)],
                    self.log / "slurmctld.out")
        self._wait("slurmctld", lambda: self.client("scontrol", "ping", check=False).stdout.count("UP") > 0,
                   "slurmctld", 60)
        self._spawn("slurmd", [DAEMONS["slurmd"], "-D", "-N", NODE, "-f", str(self.conf)], self.log / "slurmd.out")
        self._wait("node idle", lambda: "idle" in self.client("sinfo", "-h", "-N", "-o", "%T", check=False).stdout,
                   "slurmd", 90)
        return self

    def logs(self, tail: int = 3000) -> str:
        out = []
        for f in sorted(self.log.glob("*")):
            text = f.read_text(errors="replace")
            if text.strip():
                out.append(f"---- {f.name} (last {tail} chars) ----\n{text[-tail:]}")
        return "\n".join(out)

    def stop(self) -> None:
        """Cancel jobs, then stop the daemons in reverse order (by their pids, SIGTERM then SIGKILL)."""
        if not self.pids and self.state_file.exists():
            self.pids = json.loads(self.state_file.read_text())["pids"]
        if "slurmctld" in self.pids:
            subprocess.run(["scancel", "--full", "-u", os.environ.get("USER") or "root"], env=self.env(),
                           capture_output=True, timeout=30)
        for name in ("slurmd", "slurmctld", "slurmdbd", "mariadbd", "munged"):
            pid = self.pids.get(name)
            if pid:
                _terminate(pid, self.procs.get(name))
        self.pids = {}
        if self.state_file.exists():
            self._save()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return True


def _terminate(pid: int, proc: subprocess.Popen | None, grace: float = 15.0) -> None:
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if proc is not None:
            if proc.poll() is not None:
                return
        else:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
        time.sleep(0.2)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    if proc is not None:
        proc.wait(timeout=10)


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("up", "down"):
        print(__doc__)
        return 2
    cl = LocalSlurm(argv[1])
    if argv[0] == "up":
        cl.start()
        print(f"export SLURM_CONF={cl.conf}")
    else:
        cl.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
