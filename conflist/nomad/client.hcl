# Nomad client settings for cni-reaper (merge into the client's agent configuration).
client {
  enabled = true

  # where Nomad looks for CNI plugins: cni-reaper is linked into /opt/cni/bin by scripts/install.sh;
  # Debian's containernetworking-plugins puts the reference plugins in /usr/lib/cni
  cni_path = "/opt/cni/bin:/usr/lib/cni"

  # where the conflists live: a job uses conflist "<name>" with network { mode = "cni/<name>" }
  cni_config_dir = "/opt/cni/config"
}

# only for the optional periodic sweep job (cni-reaper-sweep.nomad.hcl)
plugin "raw_exec" {
  config {
    enabled = true
  }
}
