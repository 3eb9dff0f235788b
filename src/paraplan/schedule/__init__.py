"""Stage times -> pipeline schedule -> iteration timeline."""

from paraplan.schedule.deepspeed import deepspeed_free_sends_finish, simulate_deepspeed_pipeline, transfer_s
from paraplan.schedule.orders import peak_in_flight, placement
from paraplan.schedule.overlap import (
    exposed_beside,
    exposed_sync_s,
    overlapped_s,
    sharded_pass_s,
    with_sharded_traffic,
)
from paraplan.schedule.pipeline import PipelineResult, Task, free_sends_finish, simulate_pipeline

__all__ = [
    "PipelineResult",
    "Task",
    "deepspeed_free_sends_finish",
    "exposed_beside",
    "exposed_sync_s",
    "free_sends_finish",
    "overlapped_s",
    "peak_in_flight",
    "placement",
    "sharded_pass_s",
    "simulate_deepspeed_pipeline",
    "simulate_pipeline",
    "transfer_s",
    "with_sharded_traffic",
]
