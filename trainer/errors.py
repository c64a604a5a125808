"""The trainer's own failures: each becomes one clear line and a non-zero exit in `train`."""

from indexed_dataset.errors import TokenmillError


class TrainConfigError(TokenmillError, ValueError):
    """A training configuration is inconsistent (a divisibility rule, a missing input, a bad value).

    Messages name the config fields (``num_attention_heads``); the CLI shows them as flags.
    """


class CheckpointError(TokenmillError):
    """A checkpoint is missing, incomplete, or does not fit the model being trained."""


class ModelFileError(CheckpointError, TrainConfigError):
    """A model file (a checkpoint's model_config.json, a HF config.json) holds a key or value the model cannot
    have, or describes a model this machine cannot hold; the message names the file and the key."""


class ModelNotLocalError(TrainConfigError):
    """A model named the way MindFormers names a checkpoint it downloads (``"qa_bert_base_uncased"``), not a
    local path: tokenmill downloads nothing; the message says to pass a local directory."""


class RendezvousError(TokenmillError):
    """The nodes of a multi-node run did not all meet at start-up within the rendezvous timeout."""


class CollectiveTimeoutError(TokenmillError):
    """A collective did not finish within ``distributed_timeout_minutes``; the message names the rank that waited,
    what it waited for (as far as the backend's error says) and the last completed iteration."""


class HFConversionError(CheckpointError):
    """A Hugging Face directory or config is not one we can convert; the message names the file/tensor."""


class NonFiniteError(TokenmillError):
    """A training step's loss or gradient norm is NaN or infinite (Megatron's --check-for-nan-in-loss-and-grad);
    the message names the iteration and the ranks whose own loss or gradients hold it."""
