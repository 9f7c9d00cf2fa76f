"""cni-reaper: a chained CNI plugin that reaps what dead container networks leave behind."""

__version__ = "0.5.0"
PLUGIN_NAME = "cni-reaper"
