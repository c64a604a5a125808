"""Process groups and launch, the device mesh and its dims, the runner, FSDP2/TP/compile wrappers, pipeline schedules, ZeRO, layout-independent dropout."""
