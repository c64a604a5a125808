"""The T5 sample kind: span corruption on a sentence-split dataset: the sample index (`indices`), the noise
spans (`masking`), the torch Dataset (`dataset`), and the training view (`view`)."""
