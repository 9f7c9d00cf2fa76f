"""PyInstaller entry point: the same thin main as the installed package, its modules served from the bundle's
code index (build/codeindex.py) when it has one."""

import sys

import codeindex

codeindex.install(sys._MEIPASS)  # type: ignore[attr-defined]  # the bundle's support folder, cni-reaper.lib

from cni_reaper.main import main

sys.exit(main())
