"""PyInstaller entry point: the same thin main as the installed package."""

import sys

from cni_reaper.main import main

sys.exit(main())
