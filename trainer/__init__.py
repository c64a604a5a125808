"""tokenmill trainer room."""
