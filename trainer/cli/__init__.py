"""Every trainer command: flags -> one config -> one library call, and errors as one line."""
