"""The generate stage: run a system, write a dataset folder (stage.py), and check that a folder is what its
config makes (verify.py)."""

from dynaforge.generate.stage import check_single_system, generate, system_for, worker_slot
from dynaforge.generate.verify import verify_dataset

__all__ = ["check_single_system", "generate", "system_for", "verify_dataset", "worker_slot"]
