"""Training: the loop (trainer.py) and its parts, each usable on its own by other training stages:
optimisers (optim.py), schedules (schedule.py), mixed precision (precision.py), EMA (ema.py), random
generator states (checkpoint.py), torchrun/DDP (distributed.py), torch.compile and CUDA graphs
(capture.py), run logs and device meters (log.py), the profiler (profile.py), losses (losses.py).
Checkpoint files are read and written by `dynaforge.runs`."""

from dynaforge.train.losses import LOSSES
from dynaforge.train.trainer import Trainer, TrainingDiverged, TrainSummary, train

__all__ = ["LOSSES", "TrainSummary", "Trainer", "TrainingDiverged", "train"]
