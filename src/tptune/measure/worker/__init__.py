"""Code that runs inside the TP ranks: the case harness, the backends, the warm worker server."""
