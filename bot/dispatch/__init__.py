"""Starting the runner somewhere (local process, SSH node) and reading its events back."""
