"""Mixture of experts: a router, stacked experts computed with grouped GEMM, capacity dropping, and expert
parallelism (tokens exchanged with ``all_to_all_single`` over the ``ep`` mesh dimension).

A family turns its feed-forward layers into `trainer.moe.layer.MoELayer` where its shape's
`trainer.moe.settings.MoESettings` says (``is_moe_layer``); the runner shards the experts
(`trainer.moe.parallel.apply_ep`) and the loop logs the auxiliary losses (`trainer.optim.auxiliary_losses`).
"""
