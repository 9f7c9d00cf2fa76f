"""Entry point: CNI mode when CNI_COMMAND is set, else a one-line about on stderr."""

from __future__ import annotations

import os
import sys


def main() -> int:
    if os.environ.get("CNI_COMMAND"):
        from .shell import main_cni

        return main_cni(os.environ)
    if len(sys.argv) > 1:
        from .cli import main as cli_main

        return cli_main(sys.argv[1:])
    from .shell import about
    from .versions import SUPPORTED

    sys.stderr.write(f"{about()}\nCNI protocol versions supported: {', '.join(SUPPORTED)}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
