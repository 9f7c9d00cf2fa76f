"""The two changes scripts/bundle.py makes to PyInstaller's source before building it (run in its source tree).

1. A one-folder bundle does not execute itself a second time: with PYI_ONEDIR_NO_RESTART the bootloader
   treats the entry process as the application's main process. PyInstaller restarts a one-folder bundle on
   Linux only to set LD_LIBRARY_PATH; the bundle's shared objects carry an $ORIGIN run path instead.
2. The bootstrap does not import ctypes on every start to hook it (about 1.5 ms here): cni-reaper names
   its libraries by full path (iptc_backend.find_library), so the hook would have nothing to do.
Each change checks that the code it replaces is still there, so that a new PyInstaller fails loudly.
"""

CHANGES = [
    ("bootloader/src/pyi_main.c",
     "                pyi_ctx->process_level = PYI_PROCESS_LEVEL_PARENT_NEEDS_RESTART;\n#endif\n            }",
     "#if defined(PYI_ONEDIR_NO_RESTART)\n"
     "                pyi_ctx->process_level = PYI_PROCESS_LEVEL_MAIN;\n"
     "#else\n"
     "                pyi_ctx->process_level = PYI_PROCESS_LEVEL_PARENT_NEEDS_RESTART;\n"
     "#endif\n#endif\n            }"),
    ("PyInstaller/loader/pyiboot01_bootstrap.py",
     "    import pyimod03_ctypes  # noqa: E402\n    pyimod03_ctypes.install()\n",
     "    pass  # cni-reaper: no ctypes hook (build/pyinstaller-patch.py)\n"),
]

for path, old, new in CHANGES:
    with open(path) as f:
        text = f.read()
    if text.count(old) != 1:
        raise SystemExit(f"{path} changed: review build/pyinstaller-patch.py")
    with open(path, "w") as f:
        f.write(text.replace(old, new))
