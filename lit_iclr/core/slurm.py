"""Pre-flight check that a SLURM allocation matches the trainer, before any process group hangs waiting for peers."""
from __future__ import annotations

import os

from .errors import ConfigError


def check_slurm_matches_trainer(num_nodes: int, devices, env: dict[str, str] | None = None) -> None:
    """Raise `ConfigError` when SLURM's node or task-per-node count differs from `trainer.num_nodes` / `devices`.

    Only batch steps launched by `srun` are checked (an interactive `salloc` shell has no SLURM_STEP_ID of its own).
    """
    env = os.environ if env is None else env
    if "SLURM_NTASKS" not in env or env.get("SLURM_JOB_NAME") in ("bash", "interactive"):
        return
    nodes = int(env.get("SLURM_NNODES", env.get("SLURM_JOB_NUM_NODES", "1")))
    per_node_raw = env.get("SLURM_NTASKS_PER_NODE", "")
    per_node = int(per_node_raw.split("(")[0]) if per_node_raw else int(env["SLURM_NTASKS"]) // max(nodes, 1)
    if int(num_nodes) != nodes:
        raise ConfigError(
            f"SLURM allocated {nodes} node(s) but trainer.num_nodes={num_nodes}: set `--trainer.num_nodes {nodes}` "
            f"or `#SBATCH --nodes={num_nodes}`")
    if isinstance(devices, int) or (isinstance(devices, str) and devices.isdigit()):
        if int(devices) != per_node:
            raise ConfigError(
                f"SLURM runs {per_node} task(s) per node but trainer.devices={devices}: Lightning needs one task per "
                f"device; set `#SBATCH --ntasks-per-node={devices}` or `--trainer.devices {per_node}`")
