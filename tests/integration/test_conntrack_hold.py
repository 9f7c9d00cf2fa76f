"""A clean-up dumps the conntrack table (reap/conntrack.py: one ctnetlink dump per family, every entry read in
Python) while it holds host-local's lock of the network and cni-reaper's state lock. On a busy host (a full
table) that takes seconds, and every allocation of the network waits for it: the dump ends with the lock's
hold (files.holding), as the tools do (found by a red team, issue 32: the ADD beside waited 8.1 s).

One dead attachment; 250,000 foreign UDP entries in the sandbox's host netns (its own table); a STATUS sweeps
it, its first `nft` slow (4 s, within the hold); an ADD of the same network runs beside it."""

from __future__ import annotations

import os
import time

import pytest

from testkit.sandbox import DEBIAN12, ips_of, open_sandbox, unique

pytestmark = pytest.mark.netns
ENTRIES = int(os.environ.get("CT_ENTRIES", "250000"))


def fill_conntrack(sb, n: int) -> None:
    """n UDP conntrack entries of foreign flows in the sandbox's host netns (conntrack -R: one process)."""
    path = sb.root / "ct.load"
    with open(path, "w") as f:
        for i in range(n):
            a, b = divmod(i, 60000)
            f.write(f"-I -s 10.210.{a % 250}.{1 + b % 250} -d 10.211.{b // 250 % 250}.1 -p udp --sport {1024 + b} "
                    f"--dport 53 -t 3000\n")
    sb.run(["conntrack", "-R", str(path)], timeout=900)


def test_a_full_conntrack_table_is_read_only_while_the_locks_hold_lasts(tmp_path, package_exe):
    with open_sandbox(tmp_path, "nft", package_exe, DEBIAN12) as sb:
        conflist = sb.conflist()
        cid, ns = unique("dead-"), sb.container()
        ips_of(sb.driver("add", cid, ns, ("8080:80/tcp",), conflist))
        sb.remove_container(ns)
        fill_conntrack(sb, ENTRIES)
        count = sb.run(["conntrack", "-C"]).stdout.strip()
        print("conntrack entries in the sandbox:", count)
        # the STATUS's first nft is slow (4 s, within the 5 s bound: nothing fails), then the dump runs
        real = sb.run(["sh", "-c", "command -v nft"], check=True).stdout.strip()
        slow = sb.root / "slow-nft"
        slow.mkdir()
        (slow / "nft").write_text(f'#!/bin/sh\nif [ -n "$SLOW_ME" ] && mkdir "{sb.root}/nft-once" 2>/dev/null; then '
                                  f'touch "{sb.root}/nft-started"; sleep 4; fi\nexec "{real}" "$@"\n')
        (slow / "nft").chmod(0o755)
        path = f"{slow}:{sb.bin_dir}:/usr/sbin:/usr/bin:/sbin:/bin"
        import threading

        result: dict = {}

        def sweeper():
            t0 = time.monotonic()
            result["status"] = sb.status(env={"PATH": path, "SLOW_ME": "1"})
            result["status_s"] = time.monotonic() - t0

        th = threading.Thread(target=sweeper)
        th.start()
        while not (sb.root / "nft-started").exists() and th.is_alive():
            time.sleep(0.01)
        t0 = time.monotonic()  # the STATUS holds both locks now
        added = sb.driver("add", unique("beside-"), sb.container(), (), conflist, settle=False)
        waited = time.monotonic() - t0
        th.join()
        print(f"STATUS took {result['status_s']:.2f} s; the ADD beside took {waited:.2f} s")
        assert result["status"][0] == 0
        assert added.returncode == 0, added.stderr
        # the dump stopped when the state lock's hold ended (before, it read the whole table past it: 6.7 s)
        assert "ctnetlink: the table was not read within the 5 s cni-reaper may hold" in sb.log_file.read_text()
