"""The vocabulary ``inspect``'s training views name tokens by: the one the families' training builds from a
tokenizer (its pieces, then the ids Megatron's conventions append), so that a view shows what a run trains on.

    vocabulary = view_vocabulary(tokenizer, "BertWordPieceLowerCase", vocab_extra_ids=0)
    vocabulary.names["[MASK]"], vocabulary.roles["pad"]
"""

from __future__ import annotations

from preprocess.tokenizers import Tokenizer
from preprocess.tokenizers.t5 import t5_special_ids
from samplers.view import ViewVocabulary


def _tokenizer_pieces(tokenizer: Tokenizer) -> dict[str, int]:
    """Piece -> id of the tokenizer's own vocabulary where it lists one ({} for one that does not)."""
    backend = getattr(tokenizer, "backend", None)
    if hasattr(backend, "get_vocab"):  # WordPiece and Hugging Face tokenizers
        return dict(backend.get_vocab())
    model = getattr(tokenizer, "model", None)
    if hasattr(model, "id_to_piece"):  # SentencePiece
        return {model.id_to_piece(i): i for i in range(model.get_piece_size())}
    return {}


def view_vocabulary(tokenizer: Tokenizer, tokenizer_type: str, vocab_extra_ids: int) -> ViewVocabulary:
    """The run's vocabulary by names and roles: the tokenizer's pieces, then the tokens Megatron's conventions
    append ([BOS]/[EOS], `vocab_extra_ids` sentinels `<extra_id_k>`) and the pad/EOS/decoder-start ids
    (`preprocess.tokenizers.t5`'s special-token convention, the one training uses).

    Raises:
        TokenizerError: the tokenizer kind has no known special-token convention.
    """
    special = t5_special_ids(tokenizer, tokenizer_type, vocab_extra_ids)
    names = _tokenizer_pieces(tokenizer) | special.token_names()
    return ViewVocabulary(size=special.vocab_size, names=names,
                          roles={"pad": special.pad, "eos": special.eos, "decoder_start": special.decoder_start})
