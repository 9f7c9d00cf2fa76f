# A service on the nomad-reaper network: Nomad's bridge networking, with cni-reaper in the chain.
job "web" {
  datacenters = ["dc1"]

  group "web" {
    network {
      # the conflist's "name" (conflist/nomad-reaper.conflist in cni_config_dir)
      mode = "cni/nomad-reaper"

      port "http" {
        static = 8080
        to     = 80
      }
    }

    task "server" {
      driver = "docker"

      config {
        image = "nginx:stable"
        ports = ["http"]
      }
    }
  }
}
