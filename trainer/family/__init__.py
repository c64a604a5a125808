"""What the core knows of a model family: the `ModelSpec` protocol (`spec`), which every family under
`trainer/models/` fills and the registry there hands to the core from the top (the CLIs, `train()`)."""
