"""Optimizers, Megatron's learning-rate/weight-decay and batch-size schedules, gradient norm and clipping, auxiliary losses."""
