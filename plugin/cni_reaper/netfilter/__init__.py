"""Netfilter: parsing saved rules, the reference plugins' chain names, and the backends that apply deletions."""
