"""Training: the loop (trainer.py), optimisers, schedules, losses, checkpoints and run logs."""

from dynaforge.train.checkpoint import load_checkpoint, save_checkpoint
from dynaforge.train.losses import LOSSES
from dynaforge.train.trainer import Trainer, TrainSummary, train

__all__ = ["LOSSES", "TrainSummary", "Trainer", "load_checkpoint", "save_checkpoint", "train"]
