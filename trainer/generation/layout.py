"""`GenerationLayout`: the tensor-, pipeline- and data-parallel degrees of a generation run, checked, and
its device mesh (the trainer's ``(pp, dp, tp)`` mesh). What must divide by tp and pp is the family's to
say (`trainer.models.gpt.sharded.sharded_layout`)."""

from __future__ import annotations

from dataclasses import dataclass

from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from trainer.errors import TrainConfigError
from trainer.parallel_dims import MESH_DIM_NAMES


@dataclass(frozen=True, slots=True)
class GenerationLayout:
    """Tensor-, pipeline- and (derived) data-parallel degrees of a generation run."""

    tp: int
    pp: int
    dp: int

    @classmethod
    def resolve(cls, tp: int, pp: int, world_size: int, split_by_tp: dict[str, int],
                split_by_pp: dict[str, int]) -> GenerationLayout:
        """Check that the model splits over tp x pp and that the world is a multiple of it.

        Args:
            split_by_tp: the model's sizes that tensor parallelism divides, by name (heads, vocabulary, ...).
            split_by_pp: those that pipeline stages divide (layers).

        Raises:
            TrainConfigError: naming the sizes that do not divide.
        """
        tp_name, pp_name = f"tensor_model_parallel_size ({tp})", f"pipeline_model_parallel_size ({pp})"
        if world_size % (tp * pp):
            raise TrainConfigError(f"world size {world_size} is not divisible by {tp_name} x {pp_name}")
        for sizes, degree, degree_name in ((split_by_tp, tp, tp_name), (split_by_pp, pp, pp_name)):
            for name, value in sizes.items():
                if value % degree:
                    raise TrainConfigError(f"{name} ({value}) is not divisible by {degree_name}")
        return cls(tp=tp, pp=pp, dp=world_size // (tp * pp))

    def build_mesh(self, device_type: str) -> DeviceMesh | None:
        """The trainer's ``(pp, dp, tp)`` mesh, or None in a single process."""
        if self.tp * self.pp * self.dp == 1:
            return None
        return init_device_mesh(device_type, (self.pp, self.dp, self.tp), mesh_dim_names=MESH_DIM_NAMES)
