"""Ranks a cluster's launcher started: Slurm's `srun` and PyTorch's `torchrun` start one
process per rank and say in environment variables which rank it is, how many there are
and where rank 0 listens. `train` reads them (read_cluster_environment) and runs as that
one rank on its local GPU, starting no process of its own (launcher.run_as_cluster_rank).

* torchrun: RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT (and LOCAL_WORLD_SIZE).
  torchrun itself (its agent, TORCHELASTIC_RUN_ID set in its workers) already holds
  MASTER_PORT on rank 0's host for its own store: rank 0 then listens on MASTER_PORT +
  TORCHRUN_PORT_OFFSET. Without torchrun's agent (the variables set by hand or by another
  launcher) MASTER_PORT is used as it is.
* Slurm (a task of `srun`, i.e. SLURM_STEP_ID is set): SLURM_PROCID, SLURM_NTASKS,
  SLURM_LOCALID; rank 0 runs on the first host of SLURM_STEP_NODELIST (else
  SLURM_JOB_NODELIST), written in Slurm's compressed form (`node[01-04,07],gpu5`);
  MASTER_ADDR and MASTER_PORT override the host and the port, which is otherwise
  SLURM_PORT_BASE + SLURM_JOB_ID % SLURM_PORT_SPAN, so that two jobs sharing a node
  rarely pick the same one.

When both are there, torchrun's win (torchrun started inside a Slurm job).
"""

import os
import re
from dataclasses import dataclass

SLURM_PORT_BASE = 29500
SLURM_PORT_SPAN = 1000
TORCHRUN_PORT_OFFSET = 1


class ClusterEnvironmentError(ValueError):
    """The launcher's variables are incomplete or malformed: the message names them."""


@dataclass
class ClusterRank:
    """This process's place in a run a cluster launcher started."""

    launcher: str  # "torchrun" or "Slurm"
    rank: int
    world_size: int
    local_rank: int  # the GPU of this machine it trains on
    local_world_size: int  # ranks on this machine (each gets a share of its CPUs)
    master: tuple  # (host, port) where rank 0 listens

    def describe(self):
        """The start line's account of where the rank came from."""
        names = (
            "RANK, WORLD_SIZE, LOCAL_RANK"
            if self.launcher == "torchrun"
            else "SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID"
        )
        return (
            f"local rank {self.local_rank}, from the {self.launcher} environment "
            f"({names}), rank 0 at {self.master[0]}:{self.master[1]}"
        )


def expand_hostlist(text):
    """Slurm's compressed host list -> the host names in order:
    'node[01-04,07],gpu5' -> node01 node02 node03 node04 node07 gpu5 (zero padding kept;
    several bracket groups in one name give every combination, as Slurm does)."""
    hosts = []
    for item in _split_top_level(text.strip()):
        if not item:
            raise ClusterEnvironmentError(f"host list {text!r}: an empty host name")
        hosts.extend(_expand_item(item, text))
    return hosts


def _split_top_level(text):
    """Split at the commas outside brackets."""
    items, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        elif ch == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
        if depth not in (0, 1):
            raise ClusterEnvironmentError(f"host list {text!r}: unbalanced brackets")
    if depth:
        raise ClusterEnvironmentError(f"host list {text!r}: unbalanced brackets")
    items.append(text[start:])
    return items


def _expand_item(item, whole):
    match = re.search(r"\[([^\]]*)\]", item)
    if match is None:
        if "]" in item:
            raise ClusterEnvironmentError(f"host list {whole!r}: unbalanced brackets")
        return [item]
    prefix, rest = item[: match.start()], item[match.end() :]
    tails = _expand_item(rest, whole) if rest else [""]
    return [
        prefix + number + tail for number in _expand_range(match.group(1), whole) for tail in tails
    ]


def _expand_range(spec, whole):
    numbers = []
    for part in spec.split(","):
        low, sep, high = part.strip().partition("-")
        if not low.isdigit() or (sep and not high.isdigit()):
            raise ClusterEnvironmentError(
                f"host list {whole!r}: [{spec}] is not a list of "
                f"numbers and ranges such as [01-04,07]"
            )
        if not sep:
            numbers.append(low)
            continue
        if int(high) < int(low):
            raise ClusterEnvironmentError(f"host list {whole!r}: range {part} runs backwards")
        width = len(low)  # node[01-10]: node01 .. node10
        numbers.extend(str(n).zfill(width) for n in range(int(low), int(high) + 1))
    return numbers


def _integer(env, name, minimum=0):
    text = env.get(name, "").strip()
    if not text.isdigit() or int(text) < minimum:
        raise ClusterEnvironmentError(
            f"{name}={env.get(name, '')!r}: expected a whole number"
            f"{' >= ' + str(minimum) if minimum else ''}"
        )
    return int(text)


def _port(env, name):
    port = _integer(env, name, minimum=1)
    if port > 65535:
        raise ClusterEnvironmentError(f"{name}={port}: not a TCP port (1-65535)")
    return port


def read_cluster_environment(env=None):
    """The ClusterRank the environment describes, None when no launcher started this
    process as a rank; ClusterEnvironmentError when its variables are incomplete."""
    env = os.environ if env is None else env
    if "RANK" in env and "WORLD_SIZE" in env:
        return _torchrun(env)
    if "SLURM_PROCID" in env and "SLURM_STEP_ID" in env:
        return _slurm(env)
    return None


def _checked(rank, world_size, local_rank, rank_name, world_name):
    if world_size < 1 or rank >= world_size:
        raise ClusterEnvironmentError(
            f"{rank_name}={rank} with {world_name}={world_size}: "
            f"expected a rank from 0 to {world_size - 1}"
        )
    return rank, world_size, local_rank


def _torchrun(env):
    for name in ("MASTER_ADDR", "MASTER_PORT"):
        if not env.get(name, "").strip():
            raise ClusterEnvironmentError(
                f"RANK and WORLD_SIZE are set (the torchrun environment) but {name} is not: "
                f"set MASTER_ADDR and MASTER_PORT to where rank 0 listens"
            )
    rank, world_size, local_rank = _checked(
        _integer(env, "RANK"),
        _integer(env, "WORLD_SIZE", 1),
        _integer(env, "LOCAL_RANK") if "LOCAL_RANK" in env else 0,
        "RANK",
        "WORLD_SIZE",
    )
    local_world_size = _integer(env, "LOCAL_WORLD_SIZE", 1) if "LOCAL_WORLD_SIZE" in env else None
    port = _port(env, "MASTER_PORT")
    if "TORCHELASTIC_RUN_ID" in env:  # torchrun's agent listens on MASTER_PORT
        port += TORCHRUN_PORT_OFFSET
        if port > 65535:
            raise ClusterEnvironmentError(
                f"MASTER_PORT={port - TORCHRUN_PORT_OFFSET}: rank 0 "
                f"listens on the port after it, which does not exist"
            )
    return ClusterRank(
        "torchrun",
        rank,
        world_size,
        local_rank,
        local_world_size or local_rank + 1,
        (env["MASTER_ADDR"].strip(), port),
    )


def _slurm(env):
    rank, world_size, local_rank = _checked(
        _integer(env, "SLURM_PROCID"),
        _integer(env, "SLURM_NTASKS", 1),
        _integer(env, "SLURM_LOCALID") if "SLURM_LOCALID" in env else 0,
        "SLURM_PROCID",
        "SLURM_NTASKS",
    )
    if env.get("MASTER_ADDR", "").strip():
        host = env["MASTER_ADDR"].strip()
    else:
        name = next(
            (
                n
                for n in ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")
                if env.get(n, "").strip()
            ),
            None,
        )
        if name is None:
            raise ClusterEnvironmentError(
                "SLURM_PROCID is set but SLURM_JOB_NODELIST is not: set MASTER_ADDR to the "
                "host of rank 0"
            )
        host = expand_hostlist(env[name])[0]
    if env.get("MASTER_PORT", "").strip():
        port = _port(env, "MASTER_PORT")
    else:
        job = env.get("SLURM_JOB_ID", "").strip()
        port = SLURM_PORT_BASE + (int(job) % SLURM_PORT_SPAN if job.isdigit() else 0)
    return ClusterRank(
        "Slurm", rank, world_size, local_rank, _slurm_local_tasks(env, local_rank), (host, port)
    )


def _slurm_local_tasks(env, local_rank):
    """Tasks on this node: SLURM_NTASKS_PER_NODE, else this node's count in
    SLURM_STEP_TASKS_PER_NODE / SLURM_TASKS_PER_NODE ('4(x2),3': 4, 4, 3)."""
    if env.get("SLURM_NTASKS_PER_NODE", "").strip().isdigit():
        return max(1, int(env["SLURM_NTASKS_PER_NODE"]))
    text = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE") or ""
    counts = []
    for part in text.split(","):
        m = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
        if m is None:
            return local_rank + 1
        counts.extend([int(m.group(1))] * int(m.group(2) or 1))
    node = env.get("SLURM_NODEID", "0")
    if node.isdigit() and int(node) < len(counts):
        return max(1, counts[int(node)])
    return local_rank + 1


def slurm_without_srun(env=None):
    """SLURM_NTASKS > 1 in a process srun did not start (a batch script calling train
    directly): the note that says how to get the ranks; None otherwise."""
    env = os.environ if env is None else env
    tasks = env.get("SLURM_NTASKS", "")
    if "SLURM_STEP_ID" in env or "RANK" in env or not tasks.isdigit() or int(tasks) < 2:
        return None
    return (
        f"darknet-py: note: SLURM_NTASKS={tasks}, but srun did not start this process "
        f"(no SLURM_STEP_ID): training as one process; `srun darknet-py train ...` "
        f"runs {tasks} ranks (docs/clusters.md)"
    )
