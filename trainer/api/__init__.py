"""The Python entry points a MindFormers user recognises: `Trainer` (``from trainer import Trainer``).

The tasks themselves belong to the model families (``ModelSpec.tasks``); this layer, like `trainer.cli`, sits
on top and finds them through the registry.
"""
