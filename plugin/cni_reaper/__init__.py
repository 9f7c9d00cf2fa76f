"""cni-reaper: a chained CNI plugin that reaps what dead container networks leave behind."""

__version__ = "0.5.0"
PLUGIN_NAME = "cni-reaper"
# this process is one CNI call that ends with main.py's `_exit`: work kept for after its answer goes to a child
# (cni/afterwards.py); set here so that a call with none to keep loads nothing for it
one_call = False
