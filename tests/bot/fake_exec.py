"""The tests' fake ``exec`` program of the ``container`` node kind: ``fake_exec.py FOLDER
COMMAND`` runs ``sh -c COMMAND`` as a container runtime's ``exec`` would, the folder
standing for the container (its working directory and its ``HOME``), stdin and stdout
passed through. A missing folder is a container that does not run (exit status 125)."""

from __future__ import annotations

import os
import sys


def main(args: list[str]) -> None:
    folder, command = args
    if not os.path.isdir(folder):
        sys.stderr.write(f"fake_exec: no such container: {folder}\n")
        sys.exit(125)
    os.chdir(folder)
    os.environ["HOME"] = folder
    os.execvp("sh", ["sh", "-c", command])


if __name__ == "__main__":
    main(sys.argv[1:])
