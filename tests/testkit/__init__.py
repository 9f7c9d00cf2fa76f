"""The test helpers, one importable package shared by the tests and scripts/ (bench, demo): pytest finds it
through `pythonpath` in pyproject.toml, the scripts through PYTHONPATH set by their shell wrappers.

- sandbox: throwaway CNI hosts (network namespaces), the stacks (plugins, runtime, conflist form), the
  go-cni driver build;
- debian_sid: packages from Debian unstable fetched without touching the machine's apt configuration;
- artifacts: what the reference plugins leave, planted directly for thousands of attachments;
- cni: in-process CNI invocations and canonical documents for unit tests;
- fake_backend: a netfilter backend over text that records what it is asked and fails on command.
"""
