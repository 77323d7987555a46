"""lidarseg application layer (the HTTP service lands here; for now a command-line demo)."""
