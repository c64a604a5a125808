"""BERT: pre-training (masked LM + sentence order) from sentence-split token files; Hugging Face BertForPreTraining
in and out. The family's `ModelSpec` is `trainer.models.bert.spec.SPEC`."""
