"""Training: one engine (engine.py) and the tasks it runs (window.py: surrogates on dataset windows;
stages.py: the latent stack; two_phase.py: energy-based models; step_controller.py: the N-body step
controller), with the engine's parts: optimisers (optim.py), schedules (schedule.py), mixed precision
(precision.py), EMA (ema.py), random generator states (checkpoint.py), torchrun/DDP (distributed.py),
torch.compile and CUDA graphs (capture.py), run logs and device meters (log.py), the profiler (profile.py),
losses (losses.py). Checkpoint files are read and written by `dynaforge.runs`."""

from dynaforge.train.engine import Engine, TrainSummary
from dynaforge.train.log import TrainingDiverged
from dynaforge.train.losses import LOSSES
from dynaforge.train.task import StepLoss, Task
from dynaforge.train.window import WindowTask, train, window_engine

__all__ = [
    "LOSSES",
    "Engine",
    "StepLoss",
    "Task",
    "TrainSummary",
    "TrainingDiverged",
    "WindowTask",
    "train",
    "window_engine",
]
