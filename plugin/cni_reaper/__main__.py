import sys

from cni_reaper.main import main

sys.exit(main())
