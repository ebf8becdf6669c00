"""Peak RSS of Spark's Python workers, read from /proc (no psutil needed).

A background thread walks the process tree below the benchmark process every ``interval`` seconds
and keeps, per process, the largest ``VmHWM`` (the kernel's own peak-RSS counter) it has seen.
``VmHWM`` never goes down, so the thread only has to see a process once before it exits to know
its peak up to that moment. :meth:`ProcessMonitor.reset` clears the kernel counters
(``echo 5 > /proc/PID/clear_refs``) so each measured run gets its own peak.

Processes are classified by their command line:

``executor``
    Spark's executor-side Python: ``pyspark.daemon pyspark.worker`` and the workers it forks
    (which keep the daemon's command line), or ``pyspark.worker`` when the daemon is not used.
``planner``
    The driver-side data source workers Spark 4 also starts through the daemon
    (``pyspark.daemon pyspark.sql.worker.plan_data_source_read`` and the like).
``broker``
    The embedded Tansu broker, or a Kafka broker (and its ZooKeeper) started from a
    distribution.
``python-other``, ``other``
``jvm``
    The Spark JVM.

:func:`cpu_by_kind` adds up the CPU time of the same processes per kind, for the benchmark's
CPU accounting of paired reads.
"""

from __future__ import annotations

import os
import threading

def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return None


def _parent_map() -> dict[int, int]:
    parents = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        stat = _read(f"/proc/{entry}/stat")
        if not stat:
            continue
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses.
        fields = stat[stat.rfind(b")") + 2:].split()
        if len(fields) > 1:
            parents[int(entry)] = int(fields[1])
    return parents


def descendants(root: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for pid, ppid in _parent_map().items():
        children.setdefault(ppid, []).append(pid)
    out, todo = set(), [root]
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in out:
                out.add(child)
                todo.append(child)
    return out


# The main classes of a Kafka broker and of ZooKeeper started from a distribution (run.py's
# brokers are children of the benchmark process): the broker, not Spark's JVM.
_BROKER_MAINS = (b"kafka.Kafka", b"org.apache.zookeeper.server.quorum.QuorumPeerMain")


def classify(cmdline: bytes) -> str:
    argv = cmdline.split(b"\0")
    if b"pyspark.daemon" in argv or b"pyspark.worker" in argv:
        # Spark 4 starts its driver-side data source workers through the daemon too
        # ("-m pyspark.daemon pyspark.sql.worker.plan_data_source_read"): those plan, not read.
        if any(a.startswith(b"pyspark.sql.worker.") for a in argv):
            return "planner"
        return "executor"
    name = os.path.basename(argv[0])
    if b"tansu" in name or any(a in _BROKER_MAINS for a in argv):
        return "broker"
    if b"java" in name:
        return "jvm"
    if b"python" in name:
        return "python-other"
    return "other"


_HZ = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def cpu_seconds(pid: int) -> float:
    """User + system CPU of ``pid`` and of its children it has reaped (a daemon's forked
    Python workers), in seconds; 0.0 when it is gone."""
    stat = _read(f"/proc/{pid}/stat")
    if not stat:
        return 0.0
    fields = stat[stat.rfind(b")") + 2:].split()
    return sum(int(x) for x in fields[11:15]) / _HZ   # utime stime cutime cstime


def machine_busy_seconds() -> float:
    """CPU time the whole machine spent busy (all cores; not idle, not waiting on I/O)."""
    line = (_read("/proc/stat") or b"cpu 0").split(b"\n", 1)[0].split()[1:]
    ticks = [int(x) for x in line]
    idle = sum(ticks[3:5])
    return (sum(ticks) - idle) / _HZ


def cpu_by_kind(root: int | None = None) -> dict[str, float]:
    """CPU seconds so far per kind (:func:`classify`) of the processes below ``root`` (default:
    this process), ``bench`` for ``root`` itself, and ``machine`` for the whole machine. Take it
    before and after a run: the differences are the run's CPU by kind. A process that exits
    between the two is counted only if a process of the tree reaped it."""
    root = root or os.getpid()
    out: dict[str, float] = {"bench": cpu_seconds(root)}
    for pid in descendants(root):
        kind = classify(_read(f"/proc/{pid}/cmdline") or b"")
        out[kind] = out.get(kind, 0.0) + cpu_seconds(pid)
    out["machine"] = machine_busy_seconds()
    return out


def cpu_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {k: round(after.get(k, 0.0) - before.get(k, 0.0), 3)
            for k in sorted(set(before) | set(after))}


def status_values(pid: int, *names: str) -> dict[str, int] | None:
    """The numeric fields ``names`` of ``/proc/PID/status`` (``VmRSS``, ``Threads``...; sizes
    in kB), 0 for those it lacks; None when the process is gone."""
    status = _read(f"/proc/{pid}/status")
    if status is None:
        return None
    wanted = {name.encode() + b":": name for name in names}
    values = dict.fromkeys(names, 0)
    for line in status.splitlines():
        name = wanted.get(line.split(b"\t", 1)[0].split(b" ", 1)[0])
        if name is not None:
            values[name] = int(line.split()[1])
    return values


def memory_kb(pid: int) -> tuple[int, int] | None:
    """(VmHWM, VmRSS) in kB, or None when the process is gone."""
    values = status_values(pid, "VmHWM", "VmRSS")
    return None if values is None else (values["VmHWM"], values["VmRSS"])


def peak_rss_mb_self() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


class ProcessMonitor:
    """Track the peak RSS of every process below ``root`` (default: this process)."""

    def __init__(self, root: int | None = None, interval: float = 0.05):
        self.root = root or os.getpid()
        self.interval = interval
        self._lock = threading.Lock()
        self._kinds: dict[int, str] = {}      # pid -> classification (cached per pid)
        self._peaks: dict[int, tuple[int, str]] = {}  # pid -> (max VmHWM/VmRSS kB, kind)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-monitor", daemon=True)
        self._tree_every = max(1, int(0.25 / interval))  # walk the tree every ~250 ms

    def start(self) -> "ProcessMonitor":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- sampling ------------------------------------------------------------------------------

    def _refresh_tree(self) -> None:
        live = descendants(self.root)
        with self._lock:
            for pid in live:
                if pid not in self._kinds:
                    cmd = _read(f"/proc/{pid}/cmdline") or b""
                    self._kinds[pid] = classify(cmd)
            for pid in list(self._kinds):
                if pid not in live:
                    del self._kinds[pid]

    def sample(self) -> None:
        with self._lock:
            pids = list(self._kinds)
        for pid in pids:
            mem = memory_kb(pid)
            if mem is None:
                continue
            value = max(mem)
            with self._lock:
                if value > self._peaks.get(pid, (0, ""))[0]:
                    self._peaks[pid] = (value, self._kinds.get(pid, "other"))

    def _run(self) -> None:
        tick = 0
        while not self._stop.is_set():
            if tick % self._tree_every == 0:
                try:
                    self._refresh_tree()
                except Exception:  # noqa: BLE001 - a racing process exit; try again next tick
                    pass
            self.sample()
            tick += 1
            self._stop.wait(self.interval)

    # -- API -----------------------------------------------------------------------------------

    def reset(self) -> bool:
        """Forget peaks seen so far and reset the kernel's peak counters of live processes.

        Returns False if a kernel counter could not be reset (then peaks may include earlier
        runs of a reused worker)."""
        self._refresh_tree()
        ok = True
        with self._lock:
            pids = list(self._kinds)
            self._peaks = {}
        for pid in pids:
            try:
                with open(f"/proc/{pid}/clear_refs", "w") as f:
                    f.write("5")
            except OSError:
                ok = ok and not os.path.exists(f"/proc/{pid}")
        return ok

    def peaks_mb(self) -> dict[str, float]:
        """Largest single-process peak RSS (MB) per kind since the last reset(), and under
        ``<kind>_total`` the sum of those peaks (an upper bound of the kind's total)."""
        self._refresh_tree()
        self.sample()
        out: dict[str, float] = {}
        with self._lock:
            for value, kind in self._peaks.values():
                out[kind] = max(out.get(kind, 0.0), value / 1024.0)
                out[kind + "_total"] = out.get(kind + "_total", 0.0) + value / 1024.0
        return out

    def processes(self) -> list[dict]:
        """Per-process peaks since the last reset(), for the JSON report."""
        with self._lock:
            return [{"pid": pid, "kind": kind, "peak_rss_mb": round(value / 1024.0, 1)}
                    for pid, (value, kind) in sorted(self._peaks.items())]
