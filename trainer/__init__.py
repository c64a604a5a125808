"""tokenmill trainer room. ``from trainer import Trainer`` is MindFormers' Python entry point (`trainer.api`),
imported on first use so that importing a module of the room stays cheap."""


def __getattr__(name: str):
    if name == "Trainer":
        from trainer.api.trainer import Trainer

        return Trainer
    raise AttributeError(f"module 'trainer' has no attribute {name!r}")
