"""What a sweep job asks of SLURM, from the run it launches, and whether a partition can ever give it.

The resolvers below fill `conf/hydra/launcher/submitit_slurm.yaml`'s requests from the run's own settings,
so the documented command fits the machine it runs on: GPUs and tasks from the trainer (`trainer=gpu`: 1 GPU,
`trainer=cpu` or the default: none, DDP: one task per device), CPUs from the threads and loader workers the
run uses, memory from the size of the feature store it reads. `request_problems` compares a request with the
partition's nodes (`scontrol show partition/node`) before anything is submitted: a request no node can meet
would pend for ever.
"""
from __future__ import annotations

import math
import re
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

BASE_MEMORY_GB = 4          # python, torch and Lightning with a small net and its optimizer
STORE_MEMORY_FACTOR = 2     # a store's arrays are read into memory once and copied once (float32 frame arrays)
EXTRACT_WORKER_GB = 2       # per extraction worker process
GPU_JOB_CPUS = 2            # one core drives the GPU, one serves logging and checkpoints


def _plain(node: Any) -> Any:
    return OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else node


def is_gpu(accelerator: str | None) -> bool:
    """Whether the trainer asks for GPUs: `accelerator` gpu or cuda (`auto` runs on what the job is given)."""
    return str(accelerator or "auto").lower() in ("gpu", "cuda")


def is_ddp(strategy: Any) -> bool:
    """Whether the trainer runs one process per device (a `ddp*` strategy name or a DDPStrategy config)."""
    strategy = _plain(strategy)
    name = strategy.get("_target_", "") if isinstance(strategy, Mapping) else str(strategy)
    return "ddp" in name.lower()


def device_count(devices: Any) -> int:
    """Devices per node the trainer uses: an int, a list of ids, or 1 for `auto`/-1 (SLURM decides those)."""
    devices = _plain(devices)
    if isinstance(devices, (list, tuple)):
        return max(1, len(devices))
    if isinstance(devices, str) and devices.strip().lstrip("-").isdigit():
        devices = int(devices)
    return int(devices) if isinstance(devices, int) and devices > 0 else 1


def slurm_gpus(accelerator: str | None, devices: Any = 1) -> int:
    """GPUs per node (`${slurm_gpus:${trainer.accelerator},${trainer.devices}}`): the devices on a GPU, else 0."""
    return device_count(devices) if is_gpu(accelerator) else 0


def slurm_tasks(strategy: Any, devices: Any = 1) -> int:
    """Tasks per node: one per device under DDP (Lightning takes each rank from SLURM), else 1."""
    return device_count(devices) if is_ddp(strategy) else 1


def slurm_cpus(accelerator: str | None, num_workers: int | None = 0, threads: int | None = None) -> int:
    """CPUs per task: the run's torch threads (`threads=`, else 1 on a CPU: the grid's nets are small, so more
    jobs at once beat more threads per job; 2 beside a GPU) plus one per loader worker."""
    own = int(threads) if threads else (GPU_JOB_CPUS if is_gpu(accelerator) else 1)
    return own + int(num_workers or 0)


def store_bytes(store_dir: str | Path | None) -> int:
    """Bytes of the files in a feature store (0 when it is not there yet: the job makes it)."""
    if not store_dir or not Path(store_dir).is_dir():
        return 0
    return sum(p.stat().st_size for p in Path(store_dir).rglob("*") if p.is_file())


def slurm_mem_gb(store_dir: str | None = None, tasks: int = 1) -> int:
    """Memory per node in GB: a base per task and twice the feature store the job reads."""
    return int(BASE_MEMORY_GB * max(1, int(tasks)) + math.ceil(STORE_MEMORY_FACTOR * store_bytes(store_dir) / 1e9))


def slurm_extract_mem_gb(workers: int = 1) -> int:
    """Memory per extraction shard in GB: a base and 2 GB per worker process. A worker streams one session
    at a time: its peak stayed under 1 GiB from 10-minute to 2-hour sessions (docs/results/long_session.md)."""
    return int(BASE_MEMORY_GB + EXTRACT_WORKER_GB * max(1, int(workers)))


RESOLVERS = {"slurm_gpus": slurm_gpus, "slurm_tasks": slurm_tasks, "slurm_cpus": slurm_cpus,
             "slurm_mem_gb": slurm_mem_gb, "slurm_extract_mem_gb": slurm_extract_mem_gb}
for _name, _resolver in RESOLVERS.items():
    if not OmegaConf.has_resolver(_name):
        OmegaConf.register_new_resolver(_name, _resolver)


@dataclass(frozen=True)
class Node:
    name: str
    cpus: int
    memory_mb: int
    gpus: int


@dataclass(frozen=True)
class Partition:
    name: str
    state: str
    max_time_min: float        # inf when unlimited
    max_memory_mb: float       # per node; inf when unlimited
    nodes: tuple[Node, ...]


def _fields(line: str) -> dict[str, str]:
    """`scontrol -o` output: Key=Value pairs on one line."""
    return dict(m.groups() for m in re.finditer(r"(\w+)=(\S*)", line))


def _minutes(value: str) -> float:
    """SLURM's time format ([days-]hours:minutes:seconds, or minutes) in minutes; UNLIMITED is inf."""
    if not value or value.upper() in ("UNLIMITED", "INFINITE", "NONE"):
        return math.inf
    days, _, clock = value.rpartition("-")
    parts = [int(p) for p in clock.split(":")]
    seconds = {1: lambda p: p[0] * 60, 2: lambda p: p[0] * 60 + p[1],
               3: lambda p: p[0] * 3600 + p[1] * 60 + p[2]}[len(parts)](parts)
    return (int(days or 0) * 86400 + seconds) / 60


def gpu_count(gres: str) -> int:
    """GPUs in a node's Gres, e.g. `gpu:h100:4(S:0-1)` or `gpu:2,shard:8`."""
    return sum(int(m.group(1)) for m in re.finditer(r"gpu(?::[^:,(]+)?:(\d+)", gres or ""))


def _scontrol(*args: str) -> list[str]:
    done = subprocess.run(["scontrol", *args, "-o"], capture_output=True, text=True, timeout=30, check=True)
    return [line for line in done.stdout.splitlines() if line.strip()]


def read_partition(name: str | None) -> Partition | None:
    """The named partition (the default one for None) and its nodes; None where SLURM's tools are missing.
    Raises LookupError naming the partitions there are when `name` is not one of them."""
    if shutil.which("scontrol") is None:
        return None
    partitions = [_fields(line) for line in _scontrol("show", "partition")]
    chosen = [p for p in partitions if (p.get("PartitionName") == name if name else p.get("Default") == "YES")]
    if not chosen:
        names = ", ".join(p.get("PartitionName", "?") for p in partitions) or "none"
        raise LookupError(f"{f'no partition {name}' if name else 'no default partition'} (partitions: {names})")
    part = chosen[0]
    nodes = []
    for line in _scontrol("show", "node", part.get("Nodes", "")) if part.get("Nodes") else []:
        node = _fields(line)
        memory = int(node.get("RealMemory", 0)) - int(node.get("MemSpecLimit", 0) or 0)
        nodes.append(Node(node.get("NodeName", "?"), int(node.get("CPUTot", 0)), memory, gpu_count(node.get("Gres", ""))))
    max_memory = part.get("MaxMemPerNode", "UNLIMITED")
    return Partition(part["PartitionName"], part.get("State", "UP"), _minutes(part.get("MaxTime", "UNLIMITED")),
                     math.inf if not max_memory.isdigit() else float(max_memory), tuple(nodes))


def request_problems(params: Mapping[str, Any], partition: Partition) -> list[str]:
    """Why no node of `partition` can ever run a job with the launcher's `params` (empty when one can)."""
    key = "hydra.launcher."
    tasks, cpus = int(params.get("tasks_per_node") or 1), int(params.get("cpus_per_task") or 1)
    gpus, memory_gb = int(params.get("gpus_per_node") or 0), params.get("mem_gb")
    timeout_min, nodes_wanted = float(params.get("timeout_min") or 0), int(params.get("nodes") or 1)
    where = f"partition {partition.name}"
    problems = []
    if partition.state.upper() not in ("UP",):
        problems.append(f"{where} is {partition.state}: it starts no job")
    if timeout_min > partition.max_time_min:
        problems.append(f"{key}timeout_min={params['timeout_min']:g} is above {where}'s MaxTime of "
                        f"{partition.max_time_min:g} min")
    if params.get("signal_delay_s") is not None and timeout_min and params["signal_delay_s"] >= timeout_min * 60:
        problems.append(f"{key}signal_delay_s={params['signal_delay_s']} is not below {key}timeout_min={timeout_min:g} "
                        "min: the job would be told to checkpoint before it starts")
    if not partition.nodes:
        return problems + [f"{where} has no nodes"]
    if nodes_wanted > len(partition.nodes):
        problems.append(f"{key}nodes={nodes_wanted}: {where} has {len(partition.nodes)} node(s)")
    most_cpus = max(n.cpus for n in partition.nodes)
    if tasks * cpus > most_cpus:
        problems.append(f"{key}cpus_per_task={cpus} x tasks_per_node={tasks} = {tasks * cpus} CPUs: the largest node "
                        f"of {where} has {most_cpus}")
    most_gpus = max(n.gpus for n in partition.nodes)
    if gpus > most_gpus:
        problems.append(f"{key}gpus_per_node={gpus}: " + (f"no node of {where} has a GPU (trainer=cpu asks none)"
                                                          if most_gpus == 0 else f"the nodes of {where} have at most {most_gpus}"))
    if memory_gb is not None:
        most_memory = min(max(n.memory_mb for n in partition.nodes), partition.max_memory_mb)
        if float(memory_gb) * 1024 > most_memory:
            problems.append(f"{key}mem_gb={memory_gb} ({float(memory_gb) * 1024:.0f} MB): the largest node of {where} "
                            f"has {most_memory:.0f} MB")
    fitting = [n for n in partition.nodes if n.cpus >= tasks * cpus and n.gpus >= gpus
               and (memory_gb is None or n.memory_mb >= float(memory_gb) * 1024)]
    if not problems and not fitting:
        problems.append(f"no node of {where} has {tasks * cpus} CPUs, {gpus} GPU(s) and {memory_gb} GB at once "
                        f"({key}cpus_per_task, gpus_per_node, mem_gb)")
    return problems
